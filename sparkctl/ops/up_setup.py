"""``up``'s first step: ``setup`` when the hosts lack what it prepares (``ops/setup``).

It runs before the deploy lock, which lives in the state folder that a bare host does not have
yet. With ``--no-setup`` a host that needs it stops ``up`` instead, naming what is missing.
"""

from __future__ import annotations

from sparkctl.ops.up import CHANGED, FAILED, OK, PLANNED, SKIPPED, Look, StepFailed


def setup_hosts(up) -> list:
    """The deployment's hosts and the build host (which builds, and sends with ``--from``)."""
    hosts = {h.name: h for h in up.hosts}
    hosts.setdefault(up.build_host.name, up.build_host)
    return list(hosts.values())


def _needs(report) -> list[str]:
    return [f"{h.name}: {s.name} ({s.reason})" for h in report.hosts for s in h.steps if s.status == PLANNED]


def _failures(report) -> list[str]:
    return [f"{h.name}: {s.name}: {s.reason}" for h in report.hosts for s in h.steps if s.status == FAILED]


def look_setup(up) -> Look:
    from sparkctl.ops.setup import SetupOptions, run_setup

    report = run_setup(up.inventory, setup_hosts(up), SetupOptions(dry_run=True), pool=up.pool)
    failures = _failures(report)
    if failures:
        raise StepFailed("; ".join(failures))
    needs = _needs(report)
    if not needs:
        return Look(False, f"{len(report.hosts)} host(s) prepared (docker group, folders, fabric, nvidia runtime, SSH mesh)")
    if up.options.no_setup:
        raise StepFailed("the hosts need `sparkctl setup` (--no-setup given): " + "; ".join(needs))
    return Look(True, "prepare " + "; ".join(needs))


def run_setup_step(up) -> tuple[str, str]:
    from sparkctl.ops.setup import SetupOptions, run_setup

    look = look_setup(up)
    if not look.act:
        return OK, look.reason
    report = run_setup(up.inventory, setup_hosts(up), SetupOptions(), pool=up.pool, become=up.become, say=up.say)
    failures = _failures(report)
    if failures:
        raise StepFailed("; ".join(failures))
    changed = [f"{h.name}: {s.name} ({s.reason})" for h in report.hosts for s in h.steps if s.status == CHANGED]
    return (CHANGED, "prepared " + ", ".join(changed)) if changed else (OK, look.reason)


def skip_looks_after_setup(report) -> None:
    """While setup is still to run, the other steps cannot look (no docker access, no state folder)."""
    for step in report.steps:
        if step.name != "setup" and step.status in (FAILED, OK, SKIPPED, PLANNED):
            step.status, step.reason = PLANNED, "looks once setup has prepared the hosts"
