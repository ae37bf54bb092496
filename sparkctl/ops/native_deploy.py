"""serve / status / logs / stop of a profile with ``launcher: native``, under the deploy lock.

The steps are ``sparkctl.ops.native``'s; here they run in order on the one host, with the deploy
lock on the inventory's head and one audit line per changing verb, as for containers:

- serve: lock; the running engine of the profile (if any) is stopped and its memory waited for;
  the README's guards; files; start; the health wait (20 minutes by default, ending early with the
  log tail when the process dies); audit; unlock.
- stop: lock; on every chosen host SIGTERM, SIGKILL after the grace, wait for the memory, remove
  the pidfile and the deployment record (idempotent); audit; unlock.
- status: which host runs the profile's engine (pidfile + deployment record), the endpoint's
  /health (with ``engine_config``), and drift: the settings the host runs with against those the
  profile renders now (with the serve's own --set).
- logs: the tail of ``engine.log``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Callable, Optional

from sparkctl.commands import native as N
from sparkctl.commands.probes import read_file_argv
from sparkctl.commands.serve import record_argv, remove_record_argv
from sparkctl.ops import native as ops
from sparkctl.ops.drift import replayable_overrides
from sparkctl.ops.lock import LockRefused, deploy_lock
from sparkctl.ops.native import STEP_TIMEOUT_S, NativePlan, StopOutcome
from sparkctl.ops.serve import ServeOutcome, under_deploy_lock
from sparkctl.ops.steps import CHANGED, FAILED, OK, Look, Step, StepFailed, run_steps
from sparkctl.reporter import Reporter


# -------------------------------------------------------------------------------------------- serve


@dataclass
class NativeServeReport(ServeOutcome):
    plan: NativePlan
    pid: Optional[int] = None
    refusals: list[str] = field(default_factory=list)
    log_tail: Optional[str] = None

    def outcome(self, why: str) -> tuple[str, str]:
        """As a step's end (started because ``why``): changed, or StepFailed with its log's last line."""
        if not self.ok:
            tail = [line.strip() for line in (self.log_tail or "").splitlines() if line.strip()]
            last = f" (its log ends: {tail[-1]})" if tail else ""
            raise StepFailed(f"serve failed ({self.stage}): {self.message}{last}")
        return CHANGED, f"{why}: started (pid {self.pid}); healthy after {self.health_seconds or 0:.1f} s"

    def to_json(self) -> dict:
        return {"ok": self.ok, "profile": self.plan.profile, "launcher": "native", "host": self.plan.host,
                "endpoint": self.plan.endpoint, "served_model_name": self.plan.served_model_name,
                "stage": self.stage, "message": self.message or None, "refusals": self.refusals, "pid": self.pid,
                "pidfile": self.plan.paths.pidfile, "log": self.plan.paths.log, "health": self.health,
                "health_seconds": None if self.health_seconds is None else round(self.health_seconds, 3),
                "seconds": round(self.seconds, 3), "log_tail": self.log_tail, "audit": self.audit,
                "broken_lock": self.broken_lock}


def execute_native_serve(plan: NativePlan, inventory, *, pool, reporter: Optional[Reporter] = None,
                         timeout_s: Optional[float] = None,
                         break_lock: bool = False, force_break_lock: bool = False,
                         on_health_attempt: Optional[Callable] = None) -> NativeServeReport:
    from sparkctl.remote.result import RemoteError

    reporter = reporter or Reporter()
    report = NativeServeReport(plan)
    host = next(h for h in inventory.hosts if h.name == plan.host)

    def serve() -> None:
        try:
            serve_locked(plan, report, pool.get(inventory.ssh_target(host)), reporter, timeout_s, on_health_attempt)
        except (RemoteError, RuntimeError, OSError) as err:
            report.fail(report.stage if report.stage != "lock" else "start", str(err))

    def audit() -> dict:
        return {"profile": plan.profile, "hosts": [plan.host], "launcher": "native", "endpoint": plan.endpoint,
                "result": report.audit_result, "pid": report.pid,
                "seconds": f"{report.seconds:.1f}", "overrides": plan.overrides or None}

    under_deploy_lock(report, plan, inventory, pool, serve, audit, reporter=reporter, break_lock=break_lock,
                      force_break_lock=force_break_lock)
    return report


def serve_locked(plan: NativePlan, report: NativeServeReport, conn, reporter: Reporter, timeout_s,
                 on_health_attempt) -> None:
    """The native serve's stages, for a caller that already holds the deploy lock (``serve``, ``up``)."""
    report.stage = "start"
    try:
        report.pid = ops.start_native(conn, plan, reporter=reporter)
    except ops.GuardRefused as err:
        report.refusals = err.reasons
        report.fail("guards", f"{plan.host}: " + "; ".join(err.reasons))
        return
    report.stage = "health"
    limit = plan.health_timeout_s if timeout_s is None else timeout_s
    reporter.note(f"waiting for {plan.endpoint}/health and /v1/models (up to {limit:g} s; the warm start fills the arena first)")
    waited, tail = ops.wait_native(conn, plan, timeout_s=limit, on_attempt=on_health_attempt, pid=report.pid)
    report.health_seconds = waited.seconds
    report.health = waited.probe.to_json()
    if not waited.ok:
        report.log_tail = tail
        if waited.stopped_by:
            report.fail("health", f"the engine died while starting: {waited.stopped_by}")
        else:
            report.fail("health", f"{plan.endpoint} did not become healthy within {limit:g} s ({waited.attempts} "
                                  f"attempts); last: {waited.probe.stage}: {waited.probe.detail}")
        return
    report.ok, report.stage, report.message = True, "done", ""


# --------------------------------------------------------------------------------------------- stop

STOP = "stop"  # each host's one step


@dataclass
class NativeStopReport:
    profile: str
    hosts: dict[str, StopOutcome] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    ok: bool = False
    stage: str = "lock"
    message: str = ""

    def to_json(self) -> dict:
        return {"ok": self.ok, "profile": self.profile, "launcher": "native", "stage": self.stage,
                "message": self.message or None,
                "hosts": [{"name": name, "ok": name not in self.errors, "error": self.errors.get(name),
                           **(self.hosts[name].to_json() if name in self.hosts else {})}
                          for name in list(self.hosts) + [n for n in self.errors if n not in self.hosts]]}


def execute_native_stop(inventory, hosts, loaded, *, pool, reporter: Optional[Reporter] = None,
                        break_lock: bool = False, force_break_lock: bool = False,
                        grace_s: Optional[int] = None) -> NativeStopReport:
    reporter = reporter or Reporter()
    profile = loaded.profile
    report = NativeStopReport(profile.name)
    try:
        with deploy_lock(inventory, pool, verb="stop", what=f"stop {profile.name}", break_lock=break_lock,
                         force_break=force_break_lock, reporter=reporter) as held:
            try:
                _stop_locked(inventory, hosts, profile, report, pool=pool, reporter=reporter, grace_s=grace_s)
            finally:
                held.audit_fields = {"profile": profile.name, "hosts": [h.name for h in hosts], "launcher": "native",
                                     "stopped": [f"{n}:{o.state}" for n, o in report.hosts.items()] or None,
                                     "result": "ok" if report.ok else "failed"}
    except LockRefused as err:
        report.ok, report.stage, report.message = False, "lock", str(err)
    return report


def plan_native_stop(hosts, loaded) -> dict:
    """``stop --dry-run`` of a host process: what stop would end on each host (nothing is asked)."""
    profile = loaded.profile.name
    return {"profile": profile, "dry_run": True, "ok": True,
            "hosts": [{"name": h.name, "ok": True, "error": None,
                       "would_stop": [f"the native engine of {profile} (SIGTERM, then SIGKILL after the grace)"]}
                      for h in hosts]}


def _stop_locked(inventory, hosts, profile, report: NativeStopReport, *, pool, reporter: Reporter, grace_s) -> None:
    """Each chosen host's ``stop`` step through the one runner, one host after another."""
    step = _native_stop_step(inventory, profile, report, pool=pool, reporter=reporter, grace_s=grace_s)
    for host in hosts:
        run = run_steps([step], host, reporter, host=host.name, raise_on=(ValueError,))
        if run.status[STOP] == FAILED:  # (a host lost on the way fails it without a ``run.failed``)
            report.errors[host.name] = run.reasons[STOP]
    report.ok = not report.errors
    report.stage = "done" if report.ok else "stop"
    if not report.ok:
        report.message = "could not stop cleanly on " + ", ".join(report.errors)


def _native_stop_step(inventory, profile, report: NativeStopReport, *, pool, reporter: Reporter, grace_s) -> Step:
    """A host's ``stop``: SIGTERM, SIGKILL after the grace, the memory waited for, the deployment
    record removed (idempotent: ``ok`` when nothing ran); failed when the memory did not come back."""
    state_dir = inventory.model.paths.state_dir
    paths = N.NativePaths(f"{state_dir}/{profile.name}")
    grace = grace_s if grace_s is not None else profile.native.stop_grace_s
    floor = profile.single_box.min_free_gib

    def look(host) -> Look:
        return Look(True, f"end the native engine of {profile.name} (SIGTERM, SIGKILL after {grace} s)")

    def act(host, look: Look) -> tuple[str, str]:
        conn = pool.get(inventory.ssh_target(host))
        outcome = ops.stop_native(conn, paths, profile.name, grace_s=grace, min_free_gib=floor,
                                  memory_timeout_s=profile.native.memory_back_timeout_s, reporter=reporter, host=host.name)
        conn.run(remove_record_argv(profile.name, state_dir), timeout=STEP_TIMEOUT_S)
        report.hosts[host.name] = outcome
        if outcome.memory_back is False:
            raise StepFailed(f"pid {outcome.pid} {outcome.state}, but MemAvailable is "
                             f"{outcome.mem_available / 2**30:.1f} GiB after {outcome.memory_wait_s:.0f} s, "
                             f"below MIN_FREE_GIB {floor:g}")
        if outcome.state in ("terminated", "killed"):
            return CHANGED, f"pid {outcome.pid} {outcome.state}"
        return OK, "nothing to stop" + (f" (a stale pidfile of pid {outcome.pid} removed)" if outcome.state == "stale" else "")

    return Step(STOP, look, act)


# ------------------------------------------------------------------------------------- status, logs


@dataclass
class NativeHostState:
    name: str
    reachable: bool = True
    error: Optional[str] = None
    process: Optional[N.ProcessState] = None
    record: Optional[dict] = None
    env: Optional[dict[str, str]] = None  # what the engine was started with (its engine.env)


def _parse_env_file(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        key, raw = line.split("=", 1)
        words = shlex.split(raw) if raw else [""]
        env[key] = words[0] if words else ""
    return env


def gather_native(inventory, hosts, profile: str, *, pool) -> list[NativeHostState]:
    import json

    from sparkctl.remote.pool import fan_out

    state_dir = inventory.model.paths.state_dir
    paths = N.NativePaths(f"{state_dir}/{profile}")

    def look(conn):
        process = ops.native_state(conn, paths, profile)
        raw = conn.run(record_argv(profile, state_dir), timeout=STEP_TIMEOUT_S).stdout
        try:
            record = json.loads(raw) if raw.strip() else None
        except ValueError:
            record = None
        env_text = conn.run(read_file_argv(paths.env_file), timeout=STEP_TIMEOUT_S)
        return process, record, _parse_env_file(env_text.stdout) if env_text.ok else None

    states = []
    for host, result in zip(hosts, fan_out([inventory.ssh_target(h) for h in hosts], look, pool=pool)):
        state = NativeHostState(host.name)
        if result.ok:
            state.process, record, state.env = result.value
            state.record = record if isinstance(record, dict) and record.get("launcher") == "native" else None
        else:
            state.reachable, state.error = False, result.error
        states.append(state)
    return states


def env_drift(deployed: dict[str, str], wanted: dict[str, str], skip: frozenset = frozenset()) -> list[str]:
    """One line per setting that differs (values of secret-looking names are not shown); ``skip``: names
    whose serve-time value was not recorded, so cannot be compared."""
    from sparkctl.secrets import MASK, is_secret_name

    def show(name, value):
        return "(unset)" if value is None else (MASK if is_secret_name(name) else value)

    lines = []
    for name in sorted((set(deployed) | set(wanted)) - skip):
        if deployed.get(name) != wanted.get(name):
            lines.append(f"env {name}: running with {show(name, deployed.get(name))}, "
                         f"the profile now says {show(name, wanted.get(name))}")
    return lines


@dataclass
class NativeStatus:
    profile: str
    states: list[NativeHostState]
    endpoint: Optional[str] = None
    health: Optional[dict] = None
    problems: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    lock: Optional[object] = None  # sparkctl.ops.lock.LockStatus when a run holds the deploy lock

    @property
    def deployed(self) -> list[NativeHostState]:
        return [s for s in self.states if s.record or (s.process and s.process.running)]

    @property
    def ok(self) -> bool:
        return bool(self.deployed) and not self.problems and bool(self.health and self.health.get("ok"))

    def to_json(self) -> dict:
        return {"ok": self.ok, "profile": self.profile, "launcher": "native", "deployed": bool(self.deployed),
                "endpoint": self.endpoint, "health": self.health, "problems": self.problems, "drift": self.drift,
                "lock": self.lock.to_json() if self.lock else None,
                "hosts": [{"name": s.name, "reachable": s.reachable, "error": s.error,
                           "state": s.process.state if s.process else None, "pid": s.process.pid if s.process else None,
                           "deployed_at": (s.record or {}).get("when"), "deployed_by": (s.record or {}).get("who")}
                          for s in self.states]}


def native_status(inventory, hosts, loaded, *, pool, wanted_env: Callable[[list[str]], dict[str, str]],
                  env_given: frozenset = frozenset()) -> NativeStatus:
    """``wanted_env(sets)``: the engine.env the profile renders now with those --set (then this status's own);
    ``env_given``: the variables this status is given again (their serve-time values were not recorded)."""
    from sparkctl.ops.health import probe_endpoint
    from sparkctl.ops.status import held_lock

    profile = loaded.profile
    report = NativeStatus(profile.name, gather_native(inventory, hosts, profile.name, pool=pool),
                          lock=held_lock(inventory, pool))
    for s in report.states:
        if not s.reachable:
            report.problems.append(f"{s.name}: unreachable: {s.error}")
    deployed = report.deployed
    if not deployed:
        report.problems.append(f"no engine of {profile.name} runs on " + ", ".join(s.name for s in report.states))
        return report
    for s in deployed:
        if not (s.process and s.process.running):
            report.problems.append(f"{s.name}: deployed {((s.record or {}).get('when') or '?')} but its engine is not "
                                   f"running ({s.process.state if s.process else 'unknown'}); see `sparkctl logs`")
    main = deployed[0]
    report.endpoint = (main.record or {}).get("endpoint")
    if report.endpoint:
        report.health = probe_endpoint(report.endpoint, (main.record or {}).get("served_model_name"),
                                       timeout_s=10).to_json()
        if not report.health["ok"]:
            report.problems.append(f"{report.endpoint} is not serving ({report.health['stage']}: "
                                   f"{report.health['detail']})")
    if main.env is not None:
        recorded = [o for o in (main.record or {}).get("overrides") or [] if isinstance(o, str)]
        replay, unknown = replayable_overrides(recorded, env_given)
        report.drift = env_drift(main.env, wanted_env(replay), unknown)
    return report


def native_logs(inventory, hosts, profile: str, *, pool, tail: Optional[int]) -> dict[str, str]:
    from sparkctl.remote.pool import fan_out

    paths = N.NativePaths(f"{inventory.model.paths.state_dir}/{profile}")
    argv = N.log_tail_argv(paths, tail) if tail else read_file_argv(paths.log)
    results = fan_out([inventory.ssh_target(h) for h in hosts],
                      lambda conn: conn.run(argv, timeout=STEP_TIMEOUT_S), pool=pool)
    return {h.name: r.value.stdout for h, r in zip(hosts, results) if r.ok and r.value.ok}
