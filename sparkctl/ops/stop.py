"""``sparkctl stop``: the profile's containers stopped and removed on every host, under the deploy lock.

The head first (the engines then end their workers' jobs in order), then the others; each host's
deployment record goes too. Each host's stop is a step of the one protocol (``ops/steps.py``), told
to the run's reporter. Idempotent: a second stop finds nothing and says so. One audit line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from sparkctl.commands.serve import STOP_TIMEOUT_S, remove_record_argv
from sparkctl.ops.lock import LockRefused, deploy_lock
from sparkctl.ops.status import HostState, gather_states
from sparkctl.ops.steps import (CHANGED, FAILED, OK, STEP_TIMEOUT_S, Look, Step, StepFailed, check_result, run_steps,
                                stop_and_remove)
from sparkctl.remote.pool import fan_out
from sparkctl.reporter import Reporter

STOP = "stop"  # each host's one step


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
    each host's step told to ``reporter`` (None: recorded only).

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
    """Each host's ``stop`` step through the one runner: the heads' first (rank 0), then the rest's,
    the hosts of a group at once; a host not reached fails its step with why."""
    outcome = {o.name: o for o in report.hosts}
    step = stop_step(profile, inventory.model.paths.state_dir, stop_timeout_s)
    states = gather_states(inventory, hosts, profile, pool=pool, max_workers=max_workers, images=False)
    for state in states:
        if not state.reachable:
            _run_stop(step, HostStop(state, outcome[state.name]), reporter)
    reachable = [s for s in states if s.reachable]
    heads = [s for s in reachable if any(c.rank == 0 for c in s.containers)]
    by_name = {h.name: h for h in hosts}
    for group in (heads, [s for s in reachable if s not in heads]):
        states_by = {s.name: s for s in group}
        results = fan_out([inventory.ssh_target(by_name[s.name]) for s in group],
                          lambda conn: _run_stop(step, HostStop(states_by[conn.target.name], outcome[conn.target.name],
                                                                conn), reporter),
                          pool=pool, max_workers=max_workers)
        for result in results:  # a connection lost before its step could run
            if not result.ok:
                outcome[result.name].ok, outcome[result.name].error = False, result.error
    report.ok = all(o.ok for o in report.hosts)
    if not report.ok:
        report.message = "could not stop on " + ", ".join(o.name for o in report.hosts if not o.ok)


@dataclass
class HostStop:
    """One host's stop step's context: what was found there, its outcome (filled by the step), its connection."""

    state: HostState
    outcome: StopOutcome
    conn: object = None


def stop_step(profile: str, state_dir: str, stop_timeout_s: int) -> Step:
    """A host's ``stop``: its containers stopped and removed, its deployment record removed (always:
    a record left by a container already gone goes too); ``ok`` when nothing was there to stop."""

    def look(hs: HostStop) -> Look:
        if not hs.state.reachable:
            raise StepFailed(hs.state.error or "not reachable")
        names = [c.name for c in hs.state.containers]
        return Look(True, f"stop and remove {', '.join(names)}" if names else "remove the deployment record")

    def act(hs: HostStop, look: Look) -> tuple[str, str]:
        stop_and_remove(hs.conn, [c.name for c in hs.state.containers], stop_timeout_s)
        check_result(hs.conn.run(remove_record_argv(profile, state_dir), timeout=STEP_TIMEOUT_S),
                     "remove the deployment record")
        hs.outcome.removed = [f"{c.name} ({c.status})" for c in hs.state.containers]
        return (CHANGED, "removed " + ", ".join(hs.outcome.removed)) if hs.outcome.removed else (OK, "nothing to stop")

    return Step(STOP, look, act)


def _run_stop(step: Step, hs: HostStop, reporter: Reporter) -> None:
    """The host's step, run and told to ``reporter``; its failure the outcome's error, naming the host."""
    run = run_steps([step], hs, reporter, host=hs.state.name, cannot_look="")
    if run.status[STOP] == FAILED:  # (a host lost on the way fails it without a ``run.failed``)
        reason = run.reasons[STOP]
        hs.outcome.ok = False
        hs.outcome.error = reason if reason.startswith(f"{hs.state.name}:") else f"{hs.state.name}: {reason}"


def plan_stop(inventory, hosts, loaded, *, pool, max_workers: int = 16) -> dict:
    """``stop --dry-run`` of containers: per host what stop would remove, read without the deploy lock,
    changing nothing (a host process's: ``native_deploy.plan_native_stop``)."""
    profile = loaded.profile.name
    document = {"profile": profile, "dry_run": True, "ok": True, "hosts": []}
    for state in gather_states(inventory, hosts, profile, pool=pool, max_workers=max_workers, images=False):
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
