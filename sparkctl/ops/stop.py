"""``sparkctl stop``: the profile's containers stopped and removed on every host, under the deploy lock.

The head first (the engines then end their workers' jobs in order), then the others; each host's
deployment record goes too. Idempotent: a second stop finds nothing and says so. One audit line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from sparkctl.commands.serve import STOP_TIMEOUT_S, remove_record_argv
from sparkctl.ops.lock import LockRefused, deploy_lock
from sparkctl.ops.status import gather_states
from sparkctl.ops.steps import STEP_TIMEOUT_S, check_result, stop_and_remove
from sparkctl.reporter import Reporter


@dataclass
class StopOutcome:
    name: str
    ok: bool = True
    removed: list[str] = field(default_factory=list)  # "name (state before)"
    error: Optional[str] = None

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "removed": self.removed, "error": self.error}


@dataclass
class StopReport:
    profile: str
    hosts: list[StopOutcome]
    ok: bool = True
    stage: str = "stop"  # "lock" when the deploy lock could not be taken (nothing was looked at)
    message: str = ""
    audit: Optional[str] = None
    router: Optional[dict] = None  # a replicated profile's router step: what it decided and did

    def to_json(self) -> dict:
        return {"profile": self.profile, "ok": self.ok, "stage": self.stage, "message": self.message or None,
                "hosts": [h.to_json() for h in self.hosts] if self.stage != "lock" else [], "audit": self.audit,
                **({"router": self.router} if self.router is not None else {})}


def execute_stop(inventory, hosts, profile: str, *, pool, reporter: Optional[Reporter] = None, break_lock: bool = False,
                 force_break_lock: bool = False, stop_timeout_s: int = STOP_TIMEOUT_S, max_workers: int = 16,
                 router_step: Optional[Callable[[], dict]] = None) -> StopReport:
    """Stop and remove ``profile``'s containers on ``hosts`` (head first) and their deployment records;
    what it does goes to ``reporter`` as notes (None: recorded nowhere).

    ``router_step`` (a replicated profile's) changes the router before the containers go: under the
    same lock, so no other run changes the router between the two, and named in the audit line.
    It returns ``{"stop": bool, "leaving": [...], ...}``; an ``OperationFailed`` from it stops nothing."""
    reporter = reporter or Reporter()
    report = StopReport(profile, [StopOutcome(h.name) for h in hosts])
    try:
        with deploy_lock(inventory, pool, verb="stop", what=f"stop {profile}", break_lock=break_lock,
                         force_break=force_break_lock, reporter=reporter) as held:
            try:
                if router_step is None or _router_changed(router_step, report):
                    _stop_locked(inventory, hosts, profile, report, pool=pool, reporter=reporter,
                                 stop_timeout_s=stop_timeout_s, max_workers=max_workers)
            except BaseException:
                report.ok = False  # whatever escapes, the audit line must not say ok
                raise
            finally:
                held.audit_fields = {
                    "profile": profile, "hosts": [h.name for h in hosts],
                    **({"router": _router_audit(report)} if router_step is not None else {}),
                    "removed": [f"{o.name}:{len(o.removed)}" for o in report.hosts],
                    "result": "ok" if report.ok else "failed",
                }
        report.audit = held.audit
    except LockRefused as err:
        report.ok, report.stage, report.message = False, "lock", str(err)
    return report


def _router_changed(router_step: Callable[[], dict], report: StopReport) -> bool:
    """Run the router step; False (the report says why) when it failed and the replicas must stay."""
    from sparkctl.errors import OperationFailed

    try:
        report.router = router_step()
        return True
    except Exception as err:  # noqa: BLE001 - recorded for the audit line, then raised again unless expected
        report.router = {"error": str(err)}
        report.ok, report.stage, report.message = False, "router", str(err)
        if not isinstance(err, OperationFailed):
            raise
        return False


def _router_audit(report: StopReport) -> str:
    """The router step in a few words (the step's own summary), or "failed"."""
    router = report.router or {}
    return "failed" if "error" in router else router.get("summary") or "done"


def _stop_locked(inventory, hosts, profile: str, report: StopReport, *, pool, reporter: Reporter, stop_timeout_s: int,
                 max_workers: int) -> None:
    from sparkctl.remote.pool import fan_out

    outcome = {o.name: o for o in report.hosts}
    state_dir = inventory.model.paths.state_dir
    states = gather_states(inventory, hosts, profile, pool=pool, max_workers=max_workers)
    for state in states:
        if not state.reachable:
            o = outcome[state.name]
            o.ok, o.error = False, state.error
    reachable = [s for s in states if s.reachable]
    heads = [s for s in reachable if any(c.rank == 0 for c in s.containers)]
    rest = [s for s in reachable if s not in heads]
    by_name = {h.name: h for h in hosts}
    for group in (heads, rest):
        if not group:
            continue
        if any(s.containers for s in group):
            reporter.note("stopping " + "; ".join(f"{s.name}: {', '.join(c.name for c in s.containers)}" for s in group if s.containers))

        def stop_one(conn, states_by={s.name: s for s in group}):
            state = states_by[conn.target.name]
            stop_and_remove(conn, [c.name for c in state.containers], stop_timeout_s)
            check_result(conn.run(remove_record_argv(profile, state_dir), timeout=STEP_TIMEOUT_S),
                         "remove the deployment record")
            return [f"{c.name} ({c.status})" for c in state.containers]

        results = fan_out([inventory.ssh_target(by_name[s.name]) for s in group], stop_one, pool=pool,
                          max_workers=max_workers)
        for result in results:
            o = outcome[result.name]
            if result.ok:
                o.removed = result.value
            else:
                o.ok, o.error = False, result.error
    report.ok = all(o.ok for o in report.hosts)
    if not report.ok:
        report.message = "could not stop on " + ", ".join(o.name for o in report.hosts if not o.ok)


def plan_stop(inventory, hosts, loaded, *, pool, max_workers: int = 16) -> dict:
    """``stop --dry-run`` of containers: per host what stop would remove, read without the deploy lock,
    changing nothing (a host process's: ``native_deploy.plan_native_stop``)."""
    profile = loaded.profile.name
    document = {"profile": profile, "dry_run": True, "ok": True, "hosts": []}
    for state in gather_states(inventory, hosts, profile, pool=pool, max_workers=max_workers):
        document["hosts"].append({
            "name": state.name, "ok": state.reachable, "error": None if state.reachable else state.error,
            "would_stop": [f"{c.name} ({c.status})" for c in state.containers] if state.reachable else [],
        })
    if loaded.profile.replicas > 1:
        from sparkctl.ops.replica_stop import router_verdict

        verdict = router_verdict(inventory, loaded.profile, [h.name for h in hosts], pool=pool)
        document["router"] = verdict.reason + (
            f" (out of it first: {', '.join(r.name for r in verdict.leaving)})" if verdict.leaving and not verdict.stop else "")
    document["ok"] = all(h["ok"] for h in document["hosts"])
    return document
