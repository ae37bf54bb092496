"""Which `sparkctl setup` step fixes a doctor result (doctor and setup agree on one table).

A check setup cannot fix (a cable, a switch port, a driver, a disk too small, the checkpoint)
keeps its hint for a person; one it can fix names the step, and ``doctor --fix`` runs exactly
those steps.
"""

from __future__ import annotations

from sparkctl.ops.doctor.verdicts import FAIL, WARN, CheckResult

# The setup steps that can make each check pass (shown by `doctor`, and tested against `setup`).
COVERS = {
    "docker": ("docker_group", "nvidia_runtime"),
    "state": ("folders",),
    "disk": ("folders",),
    "rdma": ("fabric",),
    "fabric": ("fabric",),
    "peers": ("ssh_mesh",),
}


def setup_steps_for(check: CheckResult) -> tuple[str, ...]:
    """The setup steps that fix this failed or warned result; () when it passed or setup cannot."""
    if check.status not in (FAIL, WARN) or check.id not in COVERS:
        return ()
    detail = check.detail.lower()
    if check.id == "docker":
        if "permission denied" in detail:
            return ("docker_group", "nvidia_runtime")
        return ("nvidia_runtime",) if "no nvidia runtime" in detail else ()
    if check.id == "rdma":  # an MTU setup sets; a device down or missing is a cable or a driver
        unfixable = ("down" in detail or "missing" in detail or "no rdma" in detail or "names no" in detail)
        return ("fabric",) if "mtu" in detail and not unfixable else ()
    if check.id == "disk":
        return ("folders",) if "needs" not in detail else ()
    return COVERS[check.id]


def annotate(check: CheckResult) -> CheckResult:
    check.setup = ",".join(setup_steps_for(check))
    return check


def steps_to_fix(checks) -> tuple[str, ...]:
    """Every setup step some of ``checks`` needs, in setup's order."""
    from sparkctl.ops.setup import STEPS

    wanted = {step for c in checks for step in setup_steps_for(c)}
    return tuple(s for s in STEPS if s in wanted)
