"""Serving ``replicas: N``: each replica served as its own deployment, the router in front.

Plan (pure): one ``ServePlan`` per replica (``ops/serve.plan_serve`` of the profile rendered on
the replica's hosts with its own rendezvous ports), the router's host (the first replica's head)
and endpoint: what ``status``, ``smoke``, ``bench`` and the printed URL use.

Execute, under the one deploy lock:

* **rolling** (the default once the router serves): one replica at a time: out of the router
  (``DELETE /workers/{id}``), wait until the replica has no request running or waiting (its own
  ``/metrics``), restart it (``serve_locked``: health, then the quick smoke against the replica),
  back into the router (``POST /workers``, until the router lists it healthy), then the next;
* **parallel** (``--parallel``, or when no router serves yet): every replica at once, as one
  deployment would be; requests meanwhile fail;

then the router itself: (re)started when it is absent or runs other options or another image,
and its worker list made exactly the replicas' heads.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

from sparkctl.commands import router as R
from sparkctl.ops.replicas import Replica, split_replicas
from sparkctl.ops.steps import CHANGED, StepFailed
from sparkctl.reporter import Reporter

DRAIN_POLL_S = 0.5


@dataclass
class ReplicaSetPlan:
    profile: object  # config.profile.Profile
    replicas: list[Replica]
    serves: list  # ops.serve.ServePlan, one per replica
    router_host: str
    router_endpoint: str
    notes: list[str] = field(default_factory=list)

    @property
    def served_model_name(self) -> str:
        return self.profile.serving.served_model_name

    def to_json(self) -> dict:
        router = self.profile.router
        return {"profile": self.profile.name, "endpoint": self.router_endpoint,
                "router": {"host": self.router_host, "endpoint": self.router_endpoint, "policy": router.policy,
                           "prometheus_port": router.prometheus_port, "image": R.router_image(self.profile),
                           "request_timeout_s": router.request_timeout_s, "max_payload_bytes": router.max_payload_bytes},
                "replicas": [dict(r.to_json(), endpoint=s.endpoint, serve=s.to_json())
                             for r, s in zip(self.replicas, self.serves)],
                "notes": self.notes}


def build_replica_plans(inventory, profile_name: str, *, sets=(), envs=(), wanted_hosts=None,
                        who: str | None = None, when: str | None = None) -> ReplicaSetPlan:
    from sparkctl.config.profile import load_profile
    from sparkctl.ops.serve import build_plan

    profile = load_profile(profile_name, sets=sets, envs=envs).profile
    replicas, note = split_replicas(profile, inventory.hosts, wanted_hosts, sets)
    serves = [build_plan(inventory, profile_name, sets=list(r.sets), envs=envs, wanted_hosts=list(r.hosts),
                         who=who, when=when) for r in replicas]
    head = next(h for h in inventory.hosts if h.name == replicas[0].head)
    return ReplicaSetPlan(profile, replicas, serves, head.name, R.endpoint(head.address, profile.router.port),
                          [note] if note else [])


@dataclass
class ReplicaOutcome:
    replica: Replica
    report: Optional[object] = None  # ops.serve.ServeReport
    mode: str = "kept"  # kept | rolled | restarted
    drained_s: Optional[float] = None
    out_s: Optional[float] = None  # how long it was out of the router
    error: Optional[str] = None

    def to_json(self) -> dict:
        return {"replica": self.replica.index + 1, "hosts": list(self.replica.hosts), "mode": self.mode,
                "ok": self.error is None, "error": self.error, "drained_s": _r(self.drained_s),
                "out_of_router_s": _r(self.out_s), "serve": self.report.to_json() if self.report else None}


def _r(value):
    return None if value is None else round(value, 3)


@dataclass
class ReplicaSetReport:
    plan: ReplicaSetPlan
    replicas: list[ReplicaOutcome]
    router: str = ""  # what was done to the router, in words
    ok: bool = False
    message: str = ""
    seconds: float = 0.0

    def outcome(self, why: str) -> tuple[str, str]:
        """As a step's end (served because ``why``): changed, or StepFailed."""
        if not self.ok:
            raise StepFailed(f"serve failed: {self.message}")
        moved = [f"{o.replica.name} {o.mode}" for o in self.replicas if o.mode != "kept"]
        return CHANGED, f"{why}: {', '.join(moved) or 'replicas kept'}; {self.router}"

    def to_json(self) -> dict:
        return {"ok": self.ok, "profile": self.plan.profile.name, "endpoint": self.plan.router_endpoint,
                "message": self.message or None, "router": self.router, "seconds": round(self.seconds, 3),
                "replicas": [r.to_json() for r in self.replicas]}


def replica_metrics_idle(endpoint: str, engine: str) -> bool:
    """Whether the replica has no request running or waiting (its own /metrics, open without a key)."""
    from sparkctl.commands.engine_metrics import metric_names, parse_exposition
    from sparkctl.httpclient import httpx, tls_context

    names = [metric_names(engine)[role] for role in ("running", "waiting")]
    samples = parse_exposition(httpx.get(endpoint + "/metrics", timeout=5.0, verify=tls_context()).text)
    return sum(samples.get(name, 0.0) for name in names) == 0


def drain(endpoint: str, engine: str, timeout_s: float) -> float:
    """Wait until the replica is idle; seconds waited. Raises RuntimeError past ``timeout_s``."""
    started = time.monotonic()
    while not replica_metrics_idle(endpoint, engine):
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{endpoint} still had requests after {timeout_s:g} s out of the router")
        time.sleep(DRAIN_POLL_S)
    return time.monotonic() - started


class ReplicaRun:
    """One serve of some replicas (rolling or parallel), then the router; under the caller's lock."""

    def __init__(self, plan: ReplicaSetPlan, inventory, *, pool, reporter: Reporter, timeout_s=None):
        from sparkctl.config.apikey import api_key_for

        self.plan, self.inventory, self.pool, self.reporter, self.timeout_s = plan, inventory, pool, reporter, timeout_s
        self.api_key = api_key_for(plan.profile)
        head = next(h for h in inventory.hosts if h.name == plan.router_host)
        self.router_conn = pool.get(inventory.ssh_target(head))

    def client(self):
        from sparkctl.ops.router import RouterClient

        return RouterClient(self.plan.router_endpoint, self.api_key)

    def router_serves(self) -> bool:
        from sparkctl.ops.router import look_router

        look = look_router(self.router_conn, self.plan.profile, self.api_key)
        client = self.client()
        try:
            return look.as_wanted and client.healthy()
        finally:
            client.close()

    def serve_one(self, index: int):
        from sparkctl.ops.serve import HostOutcome, ServeReport, serve_locked

        plan = self.plan.serves[index]
        report = ServeReport(plan, [HostOutcome(h.name, h.rank) for h in plan.hosts])
        name = self.plan.replicas[index].name
        serve_locked(plan, self.inventory, report, pool=self.pool, reporter=self.reporter, about=name,
                     timeout_s=self.timeout_s)
        return report

    def roll_one(self, outcome: ReplicaOutcome) -> None:
        """Out of the router, drained, restarted, healthy and smoked, back in."""
        index, plan = outcome.replica.index, self.plan.serves[outcome.replica.index]
        url, client = plan.endpoint, self.client()
        try:
            entry = next((w for w in client.workers() if w["url"] == url), None)
            left = time.monotonic()
            if entry is not None:
                self.reporter.note(f"out of the router ({url})", outcome.replica.name)
                client.remove(entry["id"])
                client.wait_for(url, present=False)
                try:
                    outcome.drained_s = drain(url, plan.engine, self.plan.profile.router.request_timeout_s)
                except Exception as err:  # noqa: BLE001 - an engine that does not answer has nothing to drain
                    self.reporter.note(f"not drained ({err}); restarting", outcome.replica.name)
            outcome.report = self.serve_one(index)
            if not outcome.report.ok:
                outcome.error = f"serve failed ({outcome.report.stage}): {outcome.report.message}"
                return
            client.add(url, self.plan.served_model_name)
            client.wait_for(url, present=True, healthy=True)
            outcome.out_s = time.monotonic() - left
            self.reporter.note(f"back in the router after {outcome.out_s:.1f} s", outcome.replica.name)
        finally:
            client.close()

    def restart_all(self, outcomes: list[ReplicaOutcome]) -> None:
        with ThreadPoolExecutor(max_workers=len(outcomes)) as pool:
            reports = list(pool.map(lambda o: self.serve_one(o.replica.index), outcomes))
        for outcome, report in zip(outcomes, reports):
            outcome.report, outcome.mode = report, "restarted"
            if not report.ok:
                outcome.error = f"serve failed ({report.stage}): {report.message}"

    def register_afresh(self, outcomes: list[ReplicaOutcome]) -> None:
        """Take restarted replicas out and back in: the router's circuit breaker for a worker whose
        requests failed during the restart stays open for a minute; a new entry starts closed."""
        if not self.router_serves():
            return
        client = self.client()
        try:
            listed = {w["url"]: w for w in client.workers()}
            for outcome in outcomes:
                url = self.plan.serves[outcome.replica.index].endpoint
                if url in listed:
                    client.remove(listed[url]["id"])
                    client.wait_for(url, present=False)
                client.add(url, self.plan.served_model_name)
                client.wait_for(url, present=True, healthy=True)
        finally:
            client.close()

    def ensure_router(self) -> str:
        from sparkctl.ops.router import look_router, start_router, sync_workers

        profile, done = self.plan.profile, []
        look = look_router(self.router_conn, profile, self.api_key)
        if not look.as_wanted:
            self.reporter.note(f"router on {self.plan.router_host}: {'; '.join(look.reasons)}: starting it")
            done.append(start_router(self.router_conn, profile, self.inventory.model.paths.state_dir, self.api_key,
                                     reporter=self.reporter))
            done.append(f"router started on {self.plan.router_endpoint} ({profile.router.policy})")
        client = self.client()
        try:
            done += sync_workers(client, [s.endpoint for s in self.plan.serves], self.plan.served_model_name)
        finally:
            client.close()
        return "; ".join(done) or "router serves every replica as the profile says"

    def run(self, report: ReplicaSetReport, restart: list[int], parallel: bool) -> None:
        chosen = [o for o in report.replicas if o.replica.index in restart]
        rolling = bool(chosen) and not parallel and len(self.plan.replicas) > 1 and self.router_serves()
        if rolling:
            for outcome in chosen:
                outcome.mode = "rolled"
                self.roll_one(outcome)
                if outcome.error:
                    report.message = f"{outcome.replica.name}: {outcome.error} (the other replicas keep serving)"
                    return
        elif chosen:
            self.restart_all(chosen)
            failed = [o for o in chosen if o.error]
            if failed:
                report.message = "; ".join(f"{o.replica.name}: {o.error}" for o in failed)
                return
            self.register_afresh(chosen)
        report.router = self.ensure_router()
        report.ok = True


def serve_replicas_locked(plan: ReplicaSetPlan, inventory, *, pool, reporter: Optional[Reporter] = None, restart=None,
                          parallel: bool = False, timeout_s=None) -> ReplicaSetReport:
    """For a caller holding the deploy lock (``serve``, ``up``); ``restart``: replica indexes (None: all).
    Its progress goes to ``reporter`` as notes, each about its replica (None: recorded only)."""
    started = time.monotonic()
    report = ReplicaSetReport(plan, [ReplicaOutcome(r) for r in plan.replicas])
    try:
        ReplicaRun(plan, inventory, pool=pool, reporter=reporter or Reporter(), timeout_s=timeout_s).run(
            report, list(range(len(plan.replicas))) if restart is None else list(restart), parallel)
    except Exception as err:  # noqa: BLE001 - router, SSH and HTTP failures end the run, reported
        from sparkctl.ops.up import step_error

        report.ok, report.message = False, step_error(err)
    report.seconds = time.monotonic() - started
    return report


def execute_serve_replicas(plan: ReplicaSetPlan, inventory, *, pool, reporter: Optional[Reporter] = None, parallel=False,
                           timeout_s=None, restart=None, break_lock=False, force_break_lock=False) -> ReplicaSetReport:
    from sparkctl.ops.lock import LockRefused, deploy_lock

    reporter = reporter or Reporter()
    what = f"serve {plan.profile.name} ({len(plan.replicas)} replicas)"
    try:
        with deploy_lock(inventory, pool, verb="serve", what=what, break_lock=break_lock, force_break=force_break_lock,
                         reporter=reporter) as held:
            report = serve_replicas_locked(plan, inventory, pool=pool, reporter=reporter, parallel=parallel, timeout_s=timeout_s,
                                           restart=restart)
            held.audit_fields = {"profile": plan.profile.name, "endpoint": plan.router_endpoint,
                                 "replicas": [",".join(r.hosts) for r in plan.replicas],
                                 "result": "ok" if report.ok else "failed", "seconds": f"{report.seconds:.1f}"}
    except LockRefused as err:
        report = ReplicaSetReport(plan, [ReplicaOutcome(r) for r in plan.replicas], message=str(err))
    return report
