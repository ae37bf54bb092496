"""serve / status / logs / stop for a profile with ``launcher: native``: parse (done by serve_cmd), call
``sparkctl.ops.native_deploy``, print. serve_cmd hands over here when the profile's launcher says so
(``sparkctl/launchers/native.py``); the verbs take what ``cli/containers_cmd``'s take."""

from __future__ import annotations

import shlex
import sys

import typer

from sparkctl.cli.answer import finish, line as _line, plan_answers, with_health_progress
from sparkctl.commands.native import NativePaths, engine_env
from sparkctl.config.profile import load_profile, parse_assignment
from sparkctl.errors import EXIT_FAILED, ConfigError
from sparkctl.ops.lock import who_am_i
from sparkctl.ops.native import plan_native
from sparkctl.ops.native_deploy import execute_native_serve, execute_native_stop, gather_native, native_logs, native_status
from sparkctl.ops.steps import utc_now


def serve(out, inventory, loaded, deployment, *, dry_run: bool, timeout, locks: dict, pool_factory, **_containers) -> None:
    """serve the engine on its one host (``_containers``: the options of container serves, --log-tail,
    --parallel and --replica, which a host process does not use)."""
    plan = plan_native(loaded, inventory, wanted_hosts=deployment.wanted_hosts, who=who_am_i(), when=utc_now())
    if plan_answers(out, plan, format_plan, dry_run):
        return
    report = with_health_progress(
        out, plan.endpoint, pool_factory,
        lambda pool, on_health_attempt: execute_native_serve(plan, inventory, pool=pool, reporter=out.reporter,
                                                             timeout_s=timeout, **locks,
                                                             on_health_attempt=on_health_attempt))
    if not report.ok and report.log_tail and not out.json_mode:
        _line(out, f"--- {plan.host}: last lines of {plan.paths.log}:")
        for text in report.log_tail.rstrip("\n").splitlines():
            _line(out, f"  {text}")
    finish(out, report.to_json(), format_serve(report), report.ok)


def format_plan(plan) -> str:
    return "\n".join([
        f"serve {plan.profile} (the single-box engine, native) on {plan.host} -> {plan.endpoint}",
        f"  guards: port {plan.port} free, MemAvailable >= {plan.min_free_gib:g} GiB, checkpoint {plan.model_dir} complete",
        "  files: " + ", ".join(f"{plan.paths.directory}/{f.name} ({f.mode:04o})" for f in plan.files),
        "  folders (made as the login user): " + (", ".join(plan.folders) or "none"),
        f"  run: cd {shlex.quote(plan.workdir)} && {shlex.join(plan.command)}  (setsid, log {plan.paths.log}, "
        f"pid {plan.paths.pidfile})",
        f"  health wait up to {plan.health_timeout_s:g} s; stop: SIGTERM, SIGKILL after {plan.stop_grace_s} s, "
        f"then wait up to {plan.memory_back_timeout_s} s for the memory",
    ])


def format_serve(report) -> str:
    if report.ok:
        config = (report.health or {}).get("health", {}) or {}
        config = config.get("engine_config") or {}
        arena = (f" (arena {config['arena_gb']} GB = {config['arena_slots']} slots = "
                 f"{config['resident_experts_pct']} %)") if "arena_slots" in config else ""
        return (f"endpoint {report.plan.endpoint} serves {report.plan.served_model_name}{arena}; pid {report.pid} on "
                f"{report.plan.host}; healthy after {report.health_seconds or 0:.1f} s, {report.seconds:.1f} s in all")
    if report.stage == "guards":
        return "serve refused by the start guards:\n" + "\n".join(f"  {r}" for r in report.refusals)
    return f"serve failed ({report.stage}): {report.message}"


def status(out, inventory, hosts, loaded, deployment, *, watch, pool_factory) -> None:
    if watch is not None:
        raise ConfigError("--watch is for container deployments; ask again with `sparkctl status`", field="--watch")
    sets, envs = deployment.sets, deployment.envs

    def wanted_env(recorded_sets: list[str]) -> dict[str, str]:
        return engine_env(load_profile(loaded.profile.name, sets=recorded_sets + list(sets), envs=envs).profile)

    given = {parse_assignment(e, "--env")[0] for e in envs}
    given |= {s.partition("=")[0][4:] for s in sets if s.startswith("env.")}
    with pool_factory() as pool:
        report = native_status(inventory, hosts, loaded, pool=pool, wanted_env=wanted_env, env_given=frozenset(given))
    finish(out, report.to_json(), format_status(report), report.ok)


def format_status(report) -> str:
    lines = [f"profile {report.profile} (native): " + (f"endpoint {report.endpoint}" if report.deployed else "not deployed")]
    for s in report.states:
        if s.record or (s.process and s.process.state != "stopped") or not s.reachable:
            when = (s.record or {}).get("when")
            state = "unreachable" if not s.reachable else f"{s.process.state}" + (f" pid {s.process.pid}" if s.process.pid else "")
            lines.append(f"  {s.name}: {state}" + (f", deployed {when} by {(s.record or {}).get('who')}" if when else ""))
    health = report.health
    if health and health["ok"]:
        config = (health.get("health") or {}).get("engine_config") or {}
        extra = (f"; arena {config.get('arena_gb')} GB = {config.get('arena_slots')} slots "
                 f"({config.get('resident_experts_pct')} %), max_seq {config.get('max_seq')}, "
                 f"spec {'on' if config.get('spec') else 'off'}") if config else ""
        lines.append(f"health: ok; models: {', '.join(health['models'])}{extra}")
    lines += [f"problem: {p}" for p in report.problems]
    lines += [f"drift: {d}" for d in report.drift]
    if report.lock is not None:
        lines.append(f"lock: {report.lock.describe()}")
    return "\n".join(lines)


def logs(out, inventory, hosts, loaded, *, sets, tail, follow: bool, pool_factory) -> None:
    profile = loaded.profile.name
    with pool_factory() as pool:
        states = gather_native(inventory, hosts, profile, pool=pool)
        for s in states:
            if not s.reachable:
                _line(out, f"{s.name}: unreachable: {s.error}")
        found = [s for s in states if s.record or (s.process and s.process.state != "stopped")]
        by_name = {h.name: h for h in hosts}
        if not found:
            _line(out, f"no {profile} engine (native) on " + ", ".join(s.name for s in states))
            out.result({"profile": profile, "hosts": []}, "")
            raise typer.Exit(EXIT_FAILED)
        if follow:
            paths = NativePaths(f"{inventory.model.paths.state_dir}/{profile}")
            conn = pool.get(inventory.ssh_target(by_name[found[0].name]))
            try:
                conn.run_stream_out(["tail", "-n", str(tail or 10), "-F", paths.log],
                                    lambda data: (sys.stdout.write(data.decode(errors="replace")), sys.stdout.flush()))
            except KeyboardInterrupt:
                pass
            return
        texts = native_logs(inventory, [by_name[s.name] for s in found], profile, pool=pool, tail=tail)
    docs = [{"name": s.name, "state": s.process.state if s.process else None, "pid": s.process.pid if s.process else None,
             "logs": texts.get(s.name, "")} for s in found]
    human = "\n\n".join(f"==> {d['name']} ({d['state']}{' pid ' + str(d['pid']) if d['pid'] else ''}) engine.log <==\n"
                        f"{d['logs'].rstrip()}" for d in docs)
    out.result({"profile": profile, "hosts": docs}, human)


def stop(out, inventory, hosts, loaded, *, every_host: bool, break_lock: bool, force_break_lock: bool, grace_s,
         pool_factory) -> None:
    with pool_factory() as pool:
        report = execute_native_stop(inventory, hosts, loaded, pool=pool, reporter=out.reporter,
                                     break_lock=break_lock, force_break_lock=force_break_lock, grace_s=grace_s)
    lines = []
    for name, outcome in report.hosts.items():
        if outcome.state == "stopped":
            lines.append(f"{name}: nothing to stop")
        elif outcome.state == "stale":
            lines.append(f"{name}: removed a stale pidfile (pid {outcome.pid} is not this profile's engine)")
        else:
            memory = (f"; memory back: {outcome.mem_available / 2**30:.1f} GiB available after {outcome.memory_wait_s:.1f} s"
                      if outcome.memory_back else "")
            lines.append(f"{name}: pid {outcome.pid} {outcome.state}{memory}")
    lines += [f"{name}: failed: {error}" for name, error in report.errors.items()]
    if not report.ok:
        lines.append(f"stop failed: {report.message}")
    finish(out, report.to_json(), "\n".join(lines), report.ok)
