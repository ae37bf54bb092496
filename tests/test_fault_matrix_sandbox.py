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
    "serve": ["serve", *PROFILE, "--timeout", "90"],
    "status": ["status", *PROFILE],
    "logs": ["logs", *PROFILE, "--tail", "5"],
    "stop": ["stop", "--profile", "sandbox", "--timeout", "5"],
    "top": ["top", "--profile", "sandbox", "--once"],
    "smoke": ["smoke", "--profile", "sandbox"],
}
# (verb, fault) cells run; smoke asks only the head's endpoint, so a worker's fault is not its to name.
CELLS = (
    [(verb, "dockerd_stopped") for verb in VERBS]
    + [(verb, "unreachable") for verb in ("doctor", "serve", "status", "logs", "stop", "top")]
    + [(verb, "sshd_hung") for verb in ("serve", "status", "stop", "top")]
    + [(verb, "disk_full") for verb in ("doctor", "serve", "stop")]
    + [(verb, "engine_killed") for verb in ("serve", "status", "logs", "stop")]
)
NEEDS_DEPLOYMENT = ("status", "logs", "top", "smoke", "stop")
OUTCOMES: dict[str, dict] = {}


def _serving(site) -> bool:  # noqa: F811
    result = site.cli("--json", "status", *PROFILE)
    return result.code == 0


def _ensure_deployed(site) -> None:  # noqa: F811
    if not _serving(site):
        result = site.cli("serve", *PROFILE, "--timeout", "120", "--break-lock", timeout=300)
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
    if verb in NEEDS_DEPLOYMENT and verb != "stop":
        _ensure_deployed(site)
    again = site.cli(*VERBS[verb], "--break-lock", timeout=300) if verb in ("serve", "stop") else site.cli(*VERBS[verb], timeout=300)
    cell["rerun_code"] = again.code
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
    assert again.code == 0, again
    _no_false_success(site, verb, again.code, victim)


def _write_outcomes() -> None:
    target = os.environ.get("SPARKCTL_FAULT_MATRIX")
    if target:
        with open(target, "w") as handle:
            json.dump(OUTCOMES, handle, indent=1)
