"""``up``'s first step: ``setup`` when the hosts lack what it prepares (``ops/setup``).

It runs before the deploy lock, which lives in the state folder that a bare host does not have
yet. With ``--no-setup`` a host that needs it stops ``up`` instead, naming what is missing.
"""

from __future__ import annotations

from sparkctl.ops.setup import SetupOptions, run_setup, summarise
from sparkctl.ops.steps import FAILED, PLANNED, Look, StepFailed


def setup_hosts(up) -> list:
    """The deployment's hosts and the build host (which builds, and sends with ``--from``)."""
    hosts = {h.name: h for h in up.hosts}
    hosts.setdefault(up.build_host.name, up.build_host)
    return list(hosts.values())


def _failures(report) -> list[str]:
    return [f"{h.name}: {s.name}: {s.reason}" for h in report.hosts for s in h.steps if s.status == FAILED]


def look_setup(up) -> Look:
    report = run_setup(up.inventory, setup_hosts(up), SetupOptions(dry_run=True), pool=up.pool)
    failures = _failures(report)
    if failures:
        raise StepFailed("; ".join(failures))
    needs = summarise(report.hosts, PLANNED)
    if not needs:
        return Look(False, f"{len(report.hosts)} host(s) prepared (docker group, folders, fabric, nvidia runtime, SSH mesh)")
    if up.options.no_setup:
        raise StepFailed("the hosts need `sparkctl setup` (--no-setup given; `sparkctl setup --dry-run` says why): "
                         + needs)
    return Look(True, "prepare " + needs)


def act_setup(up, look: Look) -> tuple[str, str]:
    report = run_setup(up.inventory, setup_hosts(up), SetupOptions(), pool=up.pool, become=up.become,
                       reporter=up.reporter)  # each host's steps, as in `sparkctl setup`
    return report.outcome(look.reason)
