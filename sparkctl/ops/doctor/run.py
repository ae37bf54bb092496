"""``sparkctl doctor``'s run: read every host at once, then each host's checks as steps.

Reading (``gather.py``) goes over one SSH connection per host, the hosts in parallel, so 8 hosts take
about as long as 1. Then every check is a step of the one protocol (``ops/steps.py``) on its host. A
check changes nothing: it only looks, and its look is its verdict (``judge.py``): ``ok`` (pass; a
warning's reason starts "warn: "), ``skipped`` (does not apply) or ``failed`` (the detail and its
fix). ``StepRun`` runs a host's checks, every one (a failure does not stop the others), and tells
each to the run's reporter (drawn as JSON lines with ``SPARKCTL_EVENTS=json``; the verb prints its
table from the report). An unreachable host still appears: a failed ``ssh`` check naming the
cause, every other check skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sparkctl.ops.doctor import verdicts as v
from sparkctl.ops.doctor.expectations import Expectations, expectations_for
from sparkctl.ops.doctor.fixes import annotate
from sparkctl.ops.doctor.gather import DoctorFindings, gather, probe_peers
from sparkctl.ops.doctor.judge import PER_HOST, Seen, applies, check_ssh, check_surface, judge_cluster
from sparkctl.ops.doctor.verdicts import FAIL, SKIP, WARN, CheckResult
from sparkctl.ops.steps import OK, Look, Step, StepFailed, StepRun
from sparkctl.remote.pool import fan_out, run_pool
from sparkctl.remote.result import HostResult
from sparkctl.reporter import Reporter

CHECK_ORDER = ["ssh", "system", "gpu", "driver", "docker", "storage", "ulimits", "rdma", "rdma_devices", "fabric", "peers", "disk", "state",
               "memory", "ports", "checkpoint", "image", "surface", "clock"]


@dataclass
class HostChecks:
    """One host's checks, the context of its steps: how its connection went, what was found there
    (None: not reached), its verdicts across hosts, and each check's result once judged."""

    host: object
    connected: HostResult
    seen: Seen | None
    across: dict[str, CheckResult]
    results: dict[str, CheckResult] = field(default_factory=dict)

    def check_ids(self) -> list[str]:
        """The checks this host has, in the report's order (a host not reached: every one)."""
        if self.seen is None:
            return list(CHECK_ORDER)
        return [c for c in CHECK_ORDER
                if c == "ssh" or c in self.across or (c in PER_HOST and applies(c, self.seen.is_head))]

    def judge(self, check_id: str) -> CheckResult:
        if check_id == "ssh":
            return check_ssh(self.connected, self.host)
        if self.seen is None:
            return CheckResult(check_id, SKIP, "host not reachable")
        return self.across[check_id] if check_id in self.across else PER_HOST[check_id](self.seen)


def check_step(check_id: str) -> Step:
    """One check as a step: its look judges (and keeps the result for the report); it never acts."""

    def look(hc: HostChecks) -> Look:
        result = hc.results[check_id] = annotate(hc.judge(check_id))
        if result.status == FAIL:
            raise StepFailed(result.detail + (f" (fix: {result.hint})" if result.hint else ""))
        if result.status == SKIP:
            return Look(False, result.detail, {"skip": True})
        return Look(False, ("warn: " if result.status == WARN else "") + result.detail)

    return Step(check_id, look, _never)


def _never(hc: HostChecks, look: Look) -> tuple[str, str]:
    raise AssertionError("a check never acts")  # its look never says act


def check_host(hc: HostChecks, reporter: Reporter) -> list[CheckResult]:
    """One host's checks through the one runner, in order; the results as judged."""
    ids = hc.check_ids()
    StepRun([check_step(c) for c in ids], hc, reporter, host=hc.host.name, keep_going=True, relook=False,
            cannot_look="").look()
    return [hc.results[c] for c in ids]


@dataclass
class DoctorReport:
    hosts: list[tuple[str, list[CheckResult]]]

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for _, checks in self.hosts for c in checks)

    def outcome(self, later: Callable[[CheckResult], bool] = lambda check: False) -> tuple[str, str]:
        """As a step's end: ok, or StepFailed with each failed check and its fix. A failure ``later``
        says a later step repairs (the image missing, before ``up`` builds it) is left to it, and named."""
        failed = [(host, check) for host, checks in self.hosts for check in checks if check.status == FAIL]
        blocking = [f"{host}: {c.id}: {c.detail}" + (f" (fix: {c.hint})" if c.hint else "") for host, c in failed if not later(c)]
        if blocking:
            raise StepFailed("; ".join(blocking))
        forgiven = [f"{host}: {c.id}" for host, c in failed if later(c)]
        checked = sum(len(checks) for _, checks in self.hosts)
        return OK, f"{checked} checks on {len(self.hosts)} host(s) passed" + (
            f"; left to later steps: {', '.join(forgiven)}" if forgiven else "")

    def to_json(self) -> dict:
        return {"ok": self.ok, "hosts": [{"name": n, "checks": [c.to_json() for c in checks]} for n, checks in self.hosts]}


def gather_all(inventory, hosts, head, exp: Expectations, *, pool, connect_timeout: float, accept_new_host_keys: bool,
               max_workers: int) -> list[HostResult]:
    """Every host read at once, one result per host in ``hosts``' order (not reached: why)."""
    workers = [h for h in hosts if h.name != head.name]
    by_name = {h.name: h for h in hosts}
    with run_pool(pool, connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys) as opened:

        def work(conn) -> DoctorFindings:
            host = by_name[conn.name]
            if host.name != head.name:
                return gather(conn, host, exp)
            found = gather(conn, host, exp, workers_to_reach=workers)
            # While the workers' own probes still run: the workers' connections (their verified host
            # keys) are up by now, or being opened by their threads.
            found.peers = probe_peers(opened, inventory, head, workers) if workers else {}
            return found

        return fan_out([inventory.ssh_target(h) for h in hosts], work, pool=opened, max_workers=max_workers)


def judge_across(reached: dict[str, DoctorFindings], exp: Expectations, profile, hosts, head) -> dict[str, dict[str, CheckResult]]:
    """The checks that compare hosts, judged once for the run: host -> check id -> result."""
    across = judge_cluster(reached, exp)
    peers = {w: reached[head.name].peers[w] for w in reached if w != head.name} if head.name in reached else {}
    if peers:  # a worker this machine cannot reach has its own failed ssh check
        across[head.name]["peers"] = v.check_peers(peers)
    if profile is not None and head.name in reached and reached[head.name].facts.get("image"):
        across[head.name]["surface"] = check_surface(profile, hosts, reached[head.name].facts["image"])
    return across


def run_doctor(inventory, hosts, profile=None, *, accept_new_host_keys: bool = False, connect_timeout: float = 10.0,
               max_workers: int = 16, pool=None, reporter: Reporter | None = None) -> DoctorReport:
    """Read every host, then judge each host's checks as steps told to ``reporter`` (default: recorded
    only). ``pool``: the run's connections (``up``'s), else doctor opens its own."""
    exp = expectations_for(inventory, profile)
    head = next((h for h in hosts if h.is_head), hosts[0])
    connected = gather_all(inventory, hosts, head, exp, pool=pool, connect_timeout=connect_timeout,
                           accept_new_host_keys=accept_new_host_keys, max_workers=max_workers)
    reached = {r.name: r.value for r in connected if r.ok}
    across = judge_across(reached, exp, profile, hosts, head)
    reporter = reporter or Reporter()
    report = []
    for host, result in zip(hosts, connected):
        seen = Seen(host, result.value, exp, host.name == head.name) if result.ok else None
        report.append((host.name, check_host(HostChecks(host, result, seen, across.get(host.name, {})), reporter)))
    return DoctorReport(report)
