"""serve / status / logs / stop for a profile with ``launcher: docker``: the engines in containers,
one per host, or replicas behind a router (``cli/replicas_cmd``). ``serve_cmd`` parses and hands
over here when the profile's launcher says so (``sparkctl/launchers/docker.py``); this module calls
``sparkctl.ops.serve`` / ``status`` / ``logs`` / ``stop`` and prints."""

from __future__ import annotations

import shlex
import sys
import time
from functools import partial

import typer

from sparkctl.cli.answer import finish, line as _line, plan_answers, table as _table, with_health_progress
from sparkctl.cli.option_groups import DeploymentChoice
from sparkctl.config.profile import parse_assignment
from sparkctl.errors import EXIT_FAILED, ConfigError
from sparkctl.ops.hcas import resolve_up_hcas
from sparkctl.ops.logs import collect_logs, follow_logs
from sparkctl.ops.render import render
from sparkctl.ops.replicas import split_replicas
from sparkctl.ops.serve import build_plan, execute_serve
from sparkctl.ops.status import gather_states, gather_status
from sparkctl.ops.stop import execute_stop


# ---------------------------------------------------------------------------------------------- serve


def serve(out, inventory, loaded, deployment: DeploymentChoice, *, dry_run: bool, timeout, log_tail: int,
          parallel: bool, replica, locks: dict, pool_factory) -> None:
    """serve: every replica with ``replicas: N`` (cli/replicas_cmd), else one engine container per host;
    either way with `hcas: up` resolved on the hosts first."""
    inventory = _with_up_hcas(inventory, pool_factory)
    if loaded.profile.replicas > 1:
        from sparkctl.cli import replicas_cmd  # the replicas' operations (router, its image): only for replicas

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
    if not any(h.hcas_up for h in inventory.hosts):
        return inventory
    with pool_factory() as pool:
        return resolve_up_hcas(inventory, pool)


def format_plan(plan) -> str:
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


def status(out, inventory, chosen, loaded, deployment: DeploymentChoice, *, watch, pool_factory) -> None:
    """status of the replicas (cli/replicas_cmd) or of the plain deployment; exit 1 when it is not ok."""
    if watch is not None and out.json_mode:
        raise ConfigError("--watch prints text as things change; it has no --json form", field="--watch")
    if loaded.profile.replicas > 1:
        from sparkctl.cli import replicas_cmd  # the replicas' operations (router, its image): only for replicas

        replicas_cmd.status(out, inventory, loaded, sets=deployment.sets, envs=deployment.envs, pool_factory=pool_factory)
        return
    env_given = frozenset(parse_assignment(e, "--env")[0] for e in deployment.envs)
    report = _container_status(out, inventory, chosen, loaded.profile, deployment, env_given=env_given, watch=watch,
                               pool_factory=pool_factory)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _container_status(out, inventory, chosen, loaded, deployment: DeploymentChoice, *, env_given, watch, pool_factory):
    """status of the plain deployment: asked and printed once, then again every ``watch`` seconds
    (when given) until Ctrl-C. Returns the last report."""
    with pool_factory() as pool:
        inventory = resolve_up_hcas(inventory, pool)  # the drift check renders with it, as serve did
        expected_for = partial(_expected_for, inventory, deployment.profile, deployment.sets, deployment.envs)

        def ask(reporter=None):
            return gather_status(inventory, chosen, loaded, pool=pool, expected_for=expected_for, env_given=env_given,
                                 reporter=reporter)

        report = ask(out.reporter)  # each host's verdict an event once (a watch's asks would pile them up)
        out.result(report.to_json(), format_status(report))
        if watch is not None:
            report = _watch(ask, report, watch)
    return report


def _expected_for(inventory, profile: str, sets, envs, names: list[str], recorded: list[str]):
    """Per host of ``names`` what the profile renders now: (engine argv, env, docker argv). The serve's
    own --set first (``recorded``: the replayable ones, drift.replayable_overrides), then this
    command's: a later assignment of a key wins."""
    plan, _ = render(inventory, profile, sets=list(recorded) + list(sets), envs=envs, wanted_hosts=names)
    return {h.name: (h.engine_argv, h.env, h.docker_argv) for h in plan.hosts}


def _watch(ask, report, every_s: float):
    """Ask again every ``every_s`` seconds; print, timestamped, each line of the answer that
    appeared (+) or went away (-). Returns the last report (Ctrl-C ends the watch)."""
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
            # vLLM's and SGLang's /health carry no body: nothing about ranks is claimed from it
            lines.append(f"health: ok; models: {', '.join(health['models'])}"
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


def logs(out, inventory, chosen, loaded, *, sets, tail, follow: bool, pool_factory) -> None:
    """Each chosen host's engine container log (docker logs), or all of them followed."""
    profile = loaded.profile.name
    with pool_factory() as pool:
        states, with_container = _containers_to_read(out, inventory, chosen, profile, pool)
        if follow:
            _follow(inventory, with_container, pool, tail)
            return
        texts = collect_logs(inventory, with_container, pool=pool, tail=tail)
    doc, human = _logs_answer(profile, with_container, texts, _replica_of(loaded.profile, inventory, sets))
    finish(out, doc, human, all(s.reachable for s in states))


def _containers_to_read(out, inventory, chosen, profile: str, pool):
    """Each chosen host's state (an unreachable one said on stderr) and, in rank order, those that run
    the profile's container. None: exit 1 (an empty document with --json)."""
    states = list(gather_states(inventory, chosen, profile, pool=pool, images=False))
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
    try:
        follow_logs(inventory, with_container, pool=pool, tail=tail,
                    write=lambda text: (sys.stdout.write(text + "\n"), sys.stdout.flush()))
    except KeyboardInterrupt:
        pass


def _replica_of(profile, inventory, sets) -> dict[str, int]:
    """Host name -> the replica (from 1) it serves in; empty without replicas."""
    if profile.replicas <= 1:
        return {}
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


def stop(out, inventory, chosen, loaded, *, every_host: bool, break_lock: bool, force_break_lock: bool, grace_s,
         pool_factory) -> None:
    """Stop and remove the profile's containers (the router first, with replicas); a table per host."""
    profile = loaded.profile.name
    with pool_factory() as pool:
        router_step = None
        if loaded.profile.replicas > 1:  # the router first (under the lock): it stops sending before the replicas go
            from sparkctl.cli import replicas_cmd  # the replicas' operations (router, its image): only for replicas

            router_step = partial(replicas_cmd.router_for_stop, out, inventory, loaded, chosen, pool, every_host=every_host)
        report = execute_stop(inventory, chosen, profile, pool=pool, reporter=out.reporter,
                              break_lock=break_lock, force_break_lock=force_break_lock, stop_timeout_s=grace_s,
                              router_step=router_step)
    rows = [("host", "result")]
    for h in report.hosts:
        rows.append((h.name, ("removed " + ", ".join(h.removed)) if h.removed else
                     ("nothing to stop" if h.ok else f"failed: {h.error}")))
    human = _table(rows) if report.stage == "stop" else ""  # (a lock or router refusal stopped nothing)
    if not report.ok:
        human += ("\n" if human else "") + f"stop failed: {report.message}"
    finish(out, report.to_json(), human, report.ok)
