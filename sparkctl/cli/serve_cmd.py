"""``sparkctl serve`` / ``status`` / ``logs`` / ``stop``: parse, call ``sparkctl.ops.serve`` / ``status`` / ``logs`` / ``stop``, print."""

from __future__ import annotations

from functools import partial
from typing import Optional

import typer

from sparkctl.cli.answer import finish, line as _line, plan_answers, table as _table, with_health_progress
from sparkctl.cli.context import ENV_OPTION, JSON_OPTION, PROFILE_OPTION, SET_OPTION, split_hosts, state
from sparkctl.cli.confirm import confirm
from sparkctl.cli.option_groups import DeploymentChoice, with_option_groups
from sparkctl.cli.context import YES_OPTION
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION, GRACE_OPTION, HEALTH_TIMEOUT_OPTION
from sparkctl.errors import EXIT_FAILED

ACCEPT_NEW = typer.Option(False, "--accept-new-host-keys", help="Record unknown host keys (never changed ones).")
CONNECT_TIMEOUT = CONNECT_TIMEOUT_OPTION
BREAK_LOCK = typer.Option(False, "--break-lock", help="Remove a deploy lock whose run is gone (never a live one), then go on.")
FORCE_BREAK_LOCK = typer.Option(False, "--force-break-lock",
                                help="Remove the deploy lock whoever holds it, even a run that may be alive. Dangerous.")


def _pool(timeout: float, accept_new: bool):
    from sparkctl.cli.context import connections

    return connections(timeout, accept_new)


def _hosts_for(inventory, wanted: list[str] | None):
    return inventory.pick(wanted)


# ---------------------------------------------------------------------------------------------- serve


@with_option_groups
def serve(
    ctx: typer.Context,
    deployment: DeploymentChoice,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (files, containers, lock, health check) and stop."),
    timeout: Optional[float] = HEALTH_TIMEOUT_OPTION,
    break_lock: bool = BREAK_LOCK,
    force_break_lock: bool = FORCE_BREAK_LOCK,
    log_tail: int = typer.Option(40, "--log-tail", help="Lines of each host's container log printed when the start fails."),
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    parallel: bool = typer.Option(False, "--parallel",
                                  help="replicas: restart every replica at once (faster; requests fail meanwhile) "
                                       "instead of one at a time out of the router."),
    replica: Optional[str] = typer.Option(None, "--replica", help="replicas: only these (comma-separated numbers, from 1)."),
    yes: bool = YES_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Start the profile's engine on every host and wait until its OpenAI endpoint serves the model.

    With `replicas: N` every replica is served (one at a time, drained out of the router, once the
    router serves; --parallel: all at once) and the router in front of them is started.

    Files go to <paths.state_dir>/<profile>/ on each host (default /var/lib/sparkctl), under a deploy lock on the head; old
    containers of the profile are replaced. On failure each host's container log tail is printed.
    """
    if force_break_lock and not dry_run:
        confirm_force_break(yes)
    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    loaded = deployment.load()
    locks = {"break_lock": break_lock, "force_break_lock": force_break_lock}
    pool_factory = partial(_pool, connect_timeout, accept_new_host_keys)
    if loaded.profile.launcher == "native":  # the engine as a host process, not in containers
        from sparkctl.cli import native_cmd

        native_cmd.serve(out, inventory, loaded, wanted_hosts=deployment.wanted_hosts, dry_run=dry_run, timeout=timeout,
                         **locks, pool_factory=pool_factory)
        return
    if loaded.profile.replicas > 1:
        from sparkctl.cli import replicas_cmd

        replicas_cmd.serve(out, inventory, deployment.profile, sets=deployment.sets, envs=deployment.envs,
                           hosts=deployment.wanted_hosts, dry_run=dry_run,
                           timeout=timeout, parallel=parallel, only=replicas_cmd.parse_replicas(replica), **locks,
                           pool_factory=pool_factory)
        return
    _serve_containers(out, inventory, deployment, dry_run=dry_run, timeout=timeout, log_tail=log_tail, locks=locks,
                      pool_factory=pool_factory)


def _serve_containers(out, inventory, deployment: DeploymentChoice, *, dry_run: bool, timeout, log_tail: int,
                      locks: dict, pool_factory) -> None:
    """serve for the plain deployment: one engine container per host."""
    from sparkctl.ops.serve import build_plan, execute_serve

    inventory = _with_up_hcas(inventory, pool_factory)
    plan = build_plan(inventory, deployment.profile, sets=deployment.sets, envs=deployment.envs,
                      wanted_hosts=deployment.wanted_hosts)
    if plan_answers(out, plan, format_plan, dry_run):
        return
    report = with_health_progress(
        out, plan.endpoint, pool_factory,
        lambda pool, on_health_attempt: execute_serve(plan, inventory, pool=pool, reporter=out.reporter, timeout_s=timeout,
                                                      log_tail=log_tail, on_health_attempt=on_health_attempt, **locks))
    if not report.ok and not out.json_mode:
        _print_failure(out, report)
    finish(out, report.to_json(), format_serve_report(report), report.ok)


def _with_up_hcas(inventory, pool_factory):
    """The inventory with `hcas: up` resolved on the hosts (no connection when no host says up)."""
    from sparkctl.ops.hcas import resolve_up_hcas

    if not any(h.hcas_up for h in inventory.hosts):
        return inventory
    with pool_factory() as pool:
        return resolve_up_hcas(inventory, pool)


def format_plan(plan) -> str:
    import shlex

    lines = [f"serve {plan.profile} ({plan.engine}, image {plan.image}) -> {plan.endpoint}",
             f"  lock {plan.lock_host}:{plan.state_dir}/deploy.lock, audit {plan.lock_host}:{plan.state_dir}/audit.log",
             "  head must have free: " + ", ".join(f"{k} {v}" for k, v in plan.head_ports.items()),
             f"  every host needs {plan.min_free_gb:g} GB available; health wait up to {plan.health_timeout_s:g} s",
             "  all containers start at once (the engines' rendezvous does not depend on order)"]
    for host in plan.hosts:
        lines += ["", f"{host.name} ({host.address})  rank {host.rank} ({host.role})",
                  "  files: " + ", ".join(f"{plan.remote_dir}/{f.name} ({f.mode:04o})" for f in host.files),
                  f"  replace: docker stop + rm {plan.container}",
                  "  run: " + shlex.join(host.docker_argv)]
    return "\n".join(lines)


def format_serve_report(report) -> str:
    if report.stage == "lock":
        return f"serve refused: {report.message}"
    rows = [("host", "rank", "role", "container", "state", "detail")]
    for h in report.hosts:
        cid = (h.container.id if h.container else h.container_id or "")[:12] or "-"
        st = h.container.status if h.container else ("-" if h.ok else "failed")
        detail = h.error or (h.container.describe() if h.container else "") or ""
        if h.replaced and not h.error:
            detail = (detail + "; " if detail else "") + "replaced " + ", ".join(h.replaced)
        rows.append((h.name, str(h.rank), h.role, cid, st, detail))
    text = _table(rows)
    if report.ok:
        health = report.health or {}
        mml = health.get("max_model_len")
        text += (f"\nendpoint {report.plan.endpoint} serves {report.plan.served_model_name}"
                 + (f" (max_model_len {mml})" if mml else "")
                 + f"; healthy after {report.health_seconds or 0:.1f} s, {report.seconds:.1f} s in all")
    else:
        text += f"\nserve failed ({report.stage}): {report.message}"
    return text


def _print_failure(out, report) -> None:
    for h in report.hosts:
        if h.logs is None and h.container is None:
            continue
        state = h.container.describe() if h.container else "no container"
        _line(out, f"--- {h.name} (rank {h.rank}, {h.role}): container {report.plan.container} {state}; "
                   f"last {len(h.logs.splitlines()) if h.logs else 0} log lines:")
        for log_line in (h.logs or "").rstrip("\n").splitlines():
            _line(out, f"  {log_line}")


# ---------------------------------------------------------------------------------------------- status


@with_option_groups
def status(
    ctx: typer.Context,
    deployment: DeploymentChoice,
    watch: Optional[float] = typer.Option(None, "--watch", min=1.0, max=86400, help="Ask again every N seconds and print what changed, until Ctrl-C (exit: the last answer's)."),
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Per host the profile's container and its state, then the head's /health and model list, and
    what drifted since the serve: a new image under the tag, other arguments or environment than the
    profile renders now (with the serve's --set, then the --set/--env given here).

    Exit 0 only when every host of the deployment runs its container, all of them images of the
    same content, and the endpoint serves the model (drift alone is reported, not failed).
    """
    from sparkctl.config.profile import parse_assignment
    from sparkctl.errors import ConfigError

    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    loaded = deployment.load()
    env_given = frozenset(parse_assignment(e, "--env")[0] for e in deployment.envs)
    chosen = _hosts_for(inventory, deployment.wanted_hosts)
    pool_factory = partial(_pool, connect_timeout, accept_new_host_keys)
    if loaded.profile.launcher == "native":
        from sparkctl.cli import native_cmd

        if watch is not None:
            raise ConfigError("--watch is for container deployments; ask again with `sparkctl status`", field="--watch")
        native_cmd.status(out, inventory, chosen, loaded, sets=deployment.sets, envs=deployment.envs,
                          pool_factory=pool_factory)
        return
    if watch is not None and out.json_mode:
        raise ConfigError("--watch prints text as things change; it has no --json form", field="--watch")
    if loaded.profile.replicas > 1:
        from sparkctl.cli import replicas_cmd

        replicas_cmd.status(out, inventory, loaded, sets=deployment.sets, envs=deployment.envs, pool_factory=pool_factory)
        return
    report = _container_status(out, inventory, chosen, loaded.profile, deployment, env_given=env_given, watch=watch,
                               pool_factory=pool_factory)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _container_status(out, inventory, chosen, loaded, deployment: DeploymentChoice, *, env_given, watch, pool_factory):
    """status of the plain deployment: asked and printed once, then again every ``watch`` seconds
    (when given) until Ctrl-C. Returns the last report."""
    from sparkctl.ops.hcas import resolve_up_hcas
    from sparkctl.ops.status import gather_status

    with pool_factory() as pool:
        inventory = resolve_up_hcas(inventory, pool)  # the drift check renders with it, as serve did
        expected_for = partial(_expected_for, inventory, deployment.profile, deployment.sets, deployment.envs)

        def ask():
            return gather_status(inventory, chosen, loaded, pool=pool, expected_for=expected_for, env_given=env_given)

        report = ask()
        out.result(report.to_json(), format_status(report))
        if watch is not None:
            report = _watch(ask, report, watch)
    return report


def _expected_for(inventory, profile: str, sets, envs, names: list[str], recorded: list[str]):
    """Per host of ``names`` what the profile renders now: (engine argv, env, docker argv). The serve's
    own --set first (``recorded``: the replayable ones, drift.replayable_overrides), then this
    command's: a later assignment of a key wins."""
    from sparkctl.ops.render import render

    plan, _ = render(inventory, profile, sets=list(recorded) + list(sets), envs=envs, wanted_hosts=names)
    return {h.name: (h.engine_argv, h.env, h.docker_argv) for h in plan.hosts}


def _watch(ask, report, every_s: float):
    """Ask again every ``every_s`` seconds; print, timestamped, each line of the answer that
    appeared (+) or went away (-). Returns the last report (Ctrl-C ends the watch)."""
    import sys
    import time

    previous = set(watch_lines(report))
    try:
        while True:
            time.sleep(every_s)
            report = ask()
            lines = watch_lines(report)
            stamp = time.strftime("%H:%M:%S")
            changes = [f"{stamp} - {line}" for line in sorted(previous - set(lines))]
            changes += [f"{stamp} + {line}" for line in lines if line not in previous]
            if changes:
                sys.stdout.write("\n".join(changes) + "\n")
                sys.stdout.flush()
            previous = set(lines)
    except KeyboardInterrupt:
        return report


def watch_lines(report) -> list[str]:
    """What ``--watch`` compares between two answers: per host its container state, the health,
    the problems and the drift (one line each, no timestamps, so unchanged means equal)."""
    doc = report.to_json()
    lines = [f"{h['name']}: {h['state'] or ('unreachable' if not h['reachable'] else 'no container')}"
             for h in doc["hosts"] if h["in_deployment"] or h["container"]]
    health = doc["health"]
    if health is not None:
        lines.append("health: ok" if health["ok"] else f"health: not serving ({health['stage']})")
    lines += [f"problem: {p}" for p in doc["problems"]] + [f"drift: {d}" for d in doc["drift"]]
    return lines


def format_status(report) -> str:
    doc = report.to_json()
    head = f"profile {doc['profile']}: "
    if not doc["deployed"]:
        return head + "not deployed\n" + "\n".join(f"  {p}" for p in report.problems)
    lines = [head + f"endpoint {doc['endpoint']}"
             + (f", deployed {doc['deployed_at']} by {doc['deployed_by']} ({doc['image']})" if doc["deployed_at"] else "")]
    rows = [("host", "rank", "role", "container", "state", "detail")]
    for h in doc["hosts"]:
        if not h["in_deployment"] and not h["container"] and h["reachable"]:
            continue
        c = h["container"]
        detail = h["error"] or ""
        if c:
            state = next(s for s in report.states if s.name == h["name"]).container
            detail = state.describe()
        rows.append((h["name"], "-" if h["rank"] is None else str(h["rank"]), h["role"] or "-",
                     (c["id"] if c else "-"), (c["state"] if c else ("error (see below)" if not h["reachable"] else "none")), detail))
    lines.append(_table(rows))
    health = doc["health"]
    if health:
        if health["ok"]:
            config = (health.get("health") or {}).get("engine_config") or {}
            extra = f", {config['ranks_connected']}/{config['tp']} ranks" if "ranks_connected" in config else ""
            lines.append(f"health: ok{extra}; models: {', '.join(health['models'])}"
                         + (f" (max_model_len {health['max_model_len']})" if health.get("max_model_len") else ""))
        else:
            lines.append(f"health: not serving ({health['stage']}: {health['detail']})")
    lines += [f"problem: {p}" for p in report.problems]
    lines += [f"drift: {d}" for d in report.drift]
    if report.fix:
        lines.append(f"fix: {report.fix}")
    if report.lock is not None:
        lines.append(f"lock: {report.lock.describe()}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- logs


def logs(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    host: Optional[str] = typer.Option(None, "--host", help="Only this host (default: every host of the deployment)."),
    tail: int = typer.Option(100, "--tail", "-n", help="Lines from the end of each log (0: all)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines (Ctrl-C stops)."),
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    json_flag: bool = JSON_OPTION,
) -> None:
    """The engine containers' logs (docker logs), host by host or followed together."""
    from sparkctl.config.profile import load_profile
    from sparkctl.errors import ConfigError
    from sparkctl.ops.logs import collect_logs

    st = state(ctx)
    out = st.output(json_flag)
    if follow and out.json_mode:
        raise ConfigError("--follow streams text; it has no --json form", field="--follow")
    inventory = st.inventory()
    loaded = load_profile(profile, sets=sets, envs=envs)  # a bad profile is a usage error, not "no containers"
    chosen = _hosts_for(inventory, [host] if host else None)
    wanted_tail = tail if tail > 0 else None
    pool_factory = partial(_pool, connect_timeout, accept_new_host_keys)
    if loaded.profile.launcher == "native":
        from sparkctl.cli import native_cmd

        native_cmd.logs(out, inventory, chosen, profile, tail=wanted_tail, follow=follow, pool_factory=pool_factory)
        return
    with pool_factory() as pool:
        states, with_container = _containers_to_read(out, inventory, chosen, profile, pool)
        if follow:
            _follow(inventory, with_container, pool, wanted_tail)
            return
        texts = collect_logs(inventory, with_container, pool=pool, tail=wanted_tail)
    doc, human = _logs_answer(profile, with_container, texts, _replica_of(loaded.profile, inventory, sets))
    finish(out, doc, human, all(s.reachable for s in states))


def _containers_to_read(out, inventory, chosen, profile: str, pool):
    """Each chosen host's state (an unreachable one said on stderr) and, in rank order, those that run
    the profile's container. None: exit 1 (an empty document with --json)."""
    from sparkctl.ops.status import gather_states

    states = list(gather_states(inventory, chosen, profile, pool=pool))
    for s in states:
        if not s.reachable:
            _line(out, s.error if (s.error or "").startswith(f"{s.name}: ") else f"{s.name}: {s.error}")
    with_container = sorted([s for s in states if s.container], key=lambda s: (s.rank is None, s.rank or 0))
    if not with_container:
        answered = [s.name for s in states if s.reachable]  # an unreachable host is not known to have none
        if answered:
            _line(out, f"no {profile} container on " + ", ".join(answered))
        out.result({"profile": profile, "hosts": []}, "")
        raise typer.Exit(EXIT_FAILED)
    return states, with_container


def _follow(inventory, with_container, pool, tail: int | None) -> None:
    """--follow: every container's new lines on stdout as they come, until Ctrl-C."""
    import sys

    from sparkctl.ops.logs import follow_logs

    try:
        follow_logs(inventory, with_container, pool=pool, tail=tail,
                    write=lambda text: (sys.stdout.write(text + "\n"), sys.stdout.flush()))
    except KeyboardInterrupt:
        pass


def _replica_of(profile, inventory, sets) -> dict[str, int]:
    """Host name -> the replica (from 1) it serves in; empty without replicas."""
    if profile.replicas <= 1:
        return {}
    from sparkctl.ops.replicas import split_replicas

    return {name: r.index + 1 for r in split_replicas(profile, inventory.hosts, None, sets)[0] for name in r.hosts}


def _logs_answer(profile: str, with_container, texts: dict[str, str], replica_of: dict[str, int]) -> tuple[dict, str]:
    """The logs as one document and as text: a section per host, by replica then rank."""
    docs, parts = [], []
    for s in sorted(with_container, key=lambda s: (replica_of.get(s.name, 0), s.rank or 0)):
        text = texts.get(s.name, "")
        replica = replica_of.get(s.name)
        docs.append({"name": s.name, "rank": s.rank, "container": s.container.name, "state": s.container.status,
                     "logs": text, **({"replica": replica} if replica else {})})
        where = f"replica {replica}, rank {s.rank}" if replica else f"rank {s.rank}"
        parts.append(f"==> {s.name} ({where}) {s.container.name}: {s.container.describe()} <==\n{text.rstrip()}")
    return {"profile": profile, "hosts": docs}, "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------- stop


def stop(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated host names (default: every inventory host)."),
    break_lock: bool = BREAK_LOCK,
    force_break_lock: bool = FORCE_BREAK_LOCK,
    timeout: int = GRACE_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be stopped on each host; stop nothing."),
    yes: bool = YES_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Stop and remove the profile's containers on every host (the head first). Safe to repeat.
    Asks first (-y/--yes answers; without a terminal it refuses unless -y is given)."""
    from sparkctl.config.profile import load_profile
    from sparkctl.ops.stop import execute_stop

    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    loaded = load_profile(profile, sets=sets, envs=envs)
    chosen = _hosts_for(inventory, split_hosts(hosts))
    if dry_run:
        _stop_dry_run(out, inventory, chosen, loaded, pool_factory=lambda: _pool(connect_timeout, accept_new_host_keys))
        return
    if force_break_lock:
        confirm_force_break(yes)
    confirm(f"stop profile {profile} on {', '.join(h.name for h in chosen)} (its engines stop serving)?", yes=yes)
    if loaded.profile.launcher == "native":
        from sparkctl.cli import native_cmd

        native_cmd.stop(out, inventory, chosen, loaded, break_lock=break_lock, force_break_lock=force_break_lock,
                        grace_s=timeout,
                        pool_factory=lambda: _pool(connect_timeout, accept_new_host_keys))
        return
    router = None
    with _pool(connect_timeout, accept_new_host_keys) as pool:
        if loaded.profile.replicas > 1:  # the router first: it stops sending before the replicas go
            from sparkctl.cli import replicas_cmd

            router = replicas_cmd.router_for_stop(out, inventory, loaded, chosen, pool, every_host=not hosts)
        report = execute_stop(inventory, chosen, profile, pool=pool, say=lambda m: _line(out, m),
                              break_lock=break_lock, force_break_lock=force_break_lock, stop_timeout_s=timeout)
    rows = [("host", "result")]
    for h in report.hosts:
        rows.append((h.name, ("removed " + ", ".join(h.removed)) if h.removed else
                     ("nothing to stop" if h.ok else f"failed: {h.error}")))
    human = _table(rows) if report.stage != "lock" else ""
    if not report.ok:
        human += ("\n" if human else "") + f"stop failed: {report.message}"
    finish(out, report.to_json() | ({"router": router} if router else {}), human, report.ok)


def confirm_force_break(yes: bool) -> None:
    confirm("--force-break-lock removes the deploy lock even when the run holding it may still be alive "
            "(two runs may then change the hosts at once); go on?", yes=yes)


def _stop_dry_run(out, inventory, chosen, loaded, *, pool_factory) -> None:
    """What stop would remove on each host, read without the lock and without changing anything."""
    from sparkctl.ops.stop import plan_stop

    with pool_factory() as pool:
        plan = plan_stop(inventory, chosen, loaded, pool=pool)
    rows = [("host", "would stop")]
    for h in plan["hosts"]:
        rows.append((h["name"], ", ".join(h["would_stop"]) or ("nothing" if h["ok"] else f"unreachable: {h['error']}")))
    router = f"\nrouter: {plan['router']}" if plan.get("router") else ""
    finish(out, plan, _table(rows) + router + "\n(dry run: nothing stopped)", plan["ok"])


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``status``, ``logs`` and ``stop`` to the top-level app."""
    for name, fn in (("serve", serve), ("status", status), ("logs", logs), ("stop", stop)):
        app.command(name)(fn)
