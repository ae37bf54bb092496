"""The fault matrix: each verb that touches hosts, run while one host (spark-2, a worker) has a fault
the sandbox injects (sparkctl.sandbox.faults), on the one shared cluster; the fault is cleared after
each case. Every cell asserts: no traceback, exit 0 or 1; when the fault makes the host unusable, exit 1
naming it; nothing reports a success that did not happen (a serve that says ok has every rank running,
a stop that says ok left no container); and after the fault is cleared the verb converges (exit 0).

Each cell's outcome is written to $SPARKCTL_FAULT_MATRIX (a JSON file) when set: docs/hardening.md
shows the table. Cells are chosen to keep the run affordable; the table there says which are not run.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from sandbox_fixture import sandbox_cluster  # noqa: F401  (the session's cluster)
from sparkctl.sandbox import faults
from test_serve_sandbox import PROFILE, site  # noqa: F401  (the serve test site: image, checkpoint, shards)

pytestmark = pytest.mark.sandbox

VICTIM = 1  # spark-2: a worker (rank 1)
UNUSABLE = ("dockerd_stopped", "sshd_hung", "unreachable")  # the host cannot be asked (for docker, or at all)

VERBS = {
    "doctor": ["doctor", *PROFILE],
    "serve": ["serve", "-y", *PROFILE, "--health-timeout", "90"],
    "status": ["status", *PROFILE],
    "logs": ["logs", *PROFILE, "--tail", "5"],
    "stop": ["stop", "-y", "--profile", "sandbox", "--grace", "5"],
    "top": ["top", "--profile", "sandbox", "--once"],
    "smoke": ["smoke", "--profile", "sandbox"],
}
# Every verb under every fault; smoke asks only the head's endpoint, so a worker's fault is not its to name.
FAULTS = ("dockerd_stopped", "sshd_hung", "unreachable", "disk_full", "engine_killed")
CELLS = [(verb, fault) for fault in FAULTS for verb in VERBS]
NEEDS_DEPLOYMENT = ("status", "logs", "top", "smoke", "stop")
OUTCOMES: dict[str, dict] = {}
_DOCTOR_BASELINE: dict[str, set[str]] = {}


def _doctor_failures(site, host) -> set[str]:  # noqa: F811
    """The checks doctor fails on ``host`` (this test site fails some on every run: its ports are
    taken by the deployment, each host imported its own copy of the image)."""
    result = site.cli("--json", *VERBS["doctor"], timeout=300)
    doc = json.loads(result.stdout)
    checks = next(h["checks"] for h in doc["hosts"] if h["name"] == host.name)
    return {c["name"] if "name" in c else c.get("id", "?") for c in checks if c["status"] == "fail"}


def _converged(site, verb: str, victim) -> tuple[int, str]:  # noqa: F811
    """(exit code, what failed) of the verb run again once the fault is cleared; doctor converges when
    the host fails no check it did not fail before the fault."""
    if verb == "doctor":
        extra = _doctor_failures(site, victim) - _DOCTOR_BASELINE["doctor"]
        return (1 if extra else 0), ", ".join(sorted(extra))
    if verb in NEEDS_DEPLOYMENT and verb != "stop":
        _ensure_deployed(site)
    args = [*VERBS[verb], "--break-lock"] if verb in ("serve", "stop") else VERBS[verb]
    again = site.cli(*args, timeout=300)
    return again.code, (again.stdout + again.stderr)[-1500:]


def _serving(site) -> bool:  # noqa: F811
    result = site.cli("--json", "status", *PROFILE)
    return result.code == 0


def _ensure_deployed(site) -> None:  # noqa: F811
    if not _serving(site):
        result = site.cli("serve", "-y", *PROFILE, "--health-timeout", "120", "--break-lock", timeout=300)
        assert result.code == 0, result


def _fault(site, fault: str, host):  # noqa: F811
    where = {"disk_full": {"path": "/var/lib/sparkctl"}, "engine_killed": {"container": "sparkctl-sandbox"}}
    return faults.inject(site.cluster.info, fault, host.name, **where.get(fault, {}))


def _no_false_success(site, verb: str, code: int, victim) -> None:  # noqa: F811
    """What an exit 0 claims, checked on the hosts themselves."""
    if code != 0:
        return
    if verb == "serve":
        for host in site.hosts:
            assert [c for c in site.containers(host) if c["State"]["Running"]], f"serve said ok; {host.name} runs nothing"
    if verb == "stop":
        for host in site.hosts:
            assert site.containers(host) == [], f"stop said ok; {host.name} still has a container"


@pytest.mark.parametrize("verb, fault", CELLS, ids=[f"{v}-{f}" for v, f in CELLS])
def test_fault_matrix(site, verb, fault):  # noqa: F811
    victim = site.hosts[VICTIM]
    if verb == "doctor" and "doctor" not in _DOCTOR_BASELINE:
        _DOCTOR_BASELINE["doctor"] = _doctor_failures(site, victim)
    if verb in NEEDS_DEPLOYMENT or fault == "engine_killed":
        _ensure_deployed(site)
    started = time.monotonic()
    with _fault(site, fault, victim):
        result = site.cli(*VERBS[verb], timeout=300)
        seconds = time.monotonic() - started
        _no_false_success(site, verb, result.code, victim)
    text = result.stdout + result.stderr
    cell = {"verb": verb, "fault": fault, "code": result.code, "named": victim.name in text,
            "seconds": round(seconds, 1), "line": next((line for line in result.stderr.splitlines() if victim.name in line),
                                                       (result.stderr.strip().splitlines() or [""])[-1])[:200]}
    # The fault cleared: the same verb converges (after a serve where the fault took the deployment down).
    again_code, again_text = _converged(site, verb, victim)
    cell["rerun_code"] = again_code
    OUTCOMES[f"{verb}/{fault}"] = cell
    _write_outcomes()

    assert "Traceback" not in text, text[-3000:]
    assert result.code in (0, 1), result
    if fault in UNUSABLE and verb != "smoke":
        assert result.code == 1, result
        assert victim.name in text, text[-3000:]
    if verb == "serve" and fault == "disk_full":  # its files cannot be written there
        assert result.code == 1 and victim.name in text, result
    if verb == "status" and fault == "engine_killed":  # a rank down is not a healthy deployment
        assert result.code == 1 and victim.name in text, result
    assert again_code == 0, again_text
    _no_false_success(site, verb, again_code, victim)


def _write_outcomes() -> None:
    target = os.environ.get("SPARKCTL_FAULT_MATRIX")
    if target:
        with open(target, "w") as handle:
            json.dump(OUTCOMES, handle, indent=1)
