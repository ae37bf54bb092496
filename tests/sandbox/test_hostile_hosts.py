"""Unlucky hosts on the real sandbox: a hung sshd (stopped: TCP open, no banner), a garbage known_hosts
line, another sandbox on the default subnets. Every verb answers in one line naming the host or file,
with exit 1 (host) or 2 (usage), within a bounded time, never a traceback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from clirun import run_cli
from sandbox_fixture import sandbox_name
from sparkctl.sandbox import cluster

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
PROFILE = ["--profile", "sandbox", "--set", "tensor_parallel=3"]
CONNECT_TIMEOUT_S = 10  # the verbs' default --connect-timeout


def sparkctl(*args: str, env: dict | None = None, timeout: float = 300):
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full.pop("SPARKCTL_INVENTORY", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sparkctl", *args], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=timeout)
    return proc, time.monotonic() - started


@pytest.fixture
def hung_host(sandbox_cluster):
    """spark-3's sshd stopped (SIGSTOP): connections are accepted by the kernel, nothing answers."""
    pid = cluster.host_pids(sandbox_cluster.info, "spark-3")["sshd"]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield "spark-3"
    finally:
        os.kill(pid, signal.SIGCONT)


READ_ONLY_VERBS = [["status", *PROFILE], ["logs", *PROFILE], ["doctor", *PROFILE]]
LOCKING_VERBS = [["stop", "-y", *PROFILE], ["serve", *PROFILE, "--timeout", "60"]]  # the deploy lock: one at a time


def test_every_verb_names_a_hung_host_in_one_line(sandbox_cluster, hung_host):
    inventory = sandbox_cluster.info.inventory

    def one_after_another(verbs):
        return [(verb, *sparkctl("-i", inventory, *verb)) for verb in verbs]

    # Each verb waits out a connect timeout on the hung host: the read-only verbs side by side, and
    # beside them the two that take the deploy lock, one after the other (they would refuse each other).
    groups = [[verb] for verb in READ_ONLY_VERBS] + [LOCKING_VERBS]
    with ThreadPoolExecutor(len(groups)) as pool:
        results = [result for group in pool.map(one_after_another, groups) for result in group]
    assert len(results) == len(READ_ONLY_VERBS) + len(LOCKING_VERBS)
    for verb, proc, seconds in results:
        where = f"`sparkctl {' '.join(verb)}`"
        assert proc.returncode == 1, (where, proc.stdout[-2000:], proc.stderr[-3000:])
        assert "Traceback" not in proc.stderr + proc.stdout, (where, proc.stderr[-3000:])
        assert "No existing session" not in proc.stderr, where
        assert hung_host in proc.stderr + proc.stdout, (where, proc.stderr[-2000:])
        # One 10 s connect timeout per host (not one per step), plus the verb's own work on a loaded machine.
        assert seconds < 9 * CONNECT_TIMEOUT_S, (where, seconds)
    logs = next(proc for verb, proc, _ in results if verb[0] == "logs")
    assert not any(line.startswith("no ") and hung_host in line for line in logs.stderr.splitlines()), logs.stderr


def test_garbage_known_hosts_line_is_named_by_file_and_line(sandbox_cluster, tmp_path):
    info = sandbox_cluster.info
    known = tmp_path / "known_hosts"
    head = info.hosts[0].address
    lines = [line for line in Path(info.known_hosts).read_text().splitlines() if not line.startswith(head + " ")]
    known.write_text(f"{head} ssh-ed25519 AAAA!!notbase64\n" + "\n".join(lines) + "\n")
    data = yaml.safe_load(Path(info.inventory).read_text())
    data["known_hosts"] = str(known)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    for verb in ("status", "doctor"):
        proc = run_cli("-i", str(inventory), "--json", verb, *PROFILE)  # (a table would wrap the line); in process
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout
        assert f"{known}:1 is not a valid host key line" in proc.stderr + proc.stdout, (verb, proc.stderr[-2000:])


def test_sandbox_up_without_subnets_picks_free_ones(sandbox_cluster, tmp_path):
    """Two new sandboxes, no subnets asked: each gets a pair that clashes with nothing (the session
    cluster, each other, a developer's own sandbox on the defaults)."""
    # A short root: each host's Docker socket lives under it, and a Unix socket's path must stay under
    # 108 bytes (an xdist worker's tmp_path, ".../popen-gw1/test_sandbox_up_without_subnet0", is too long).
    root = tempfile.mkdtemp(prefix="sbx-")
    env = {"SPARKCTL_SANDBOX_ROOT": root}
    names = [sandbox_name("f", "first of two on free subnets"), sandbox_name("g", "second of two on free subnets")]
    subnets = []
    try:
        for name in names:
            proc, _ = sparkctl("sandbox", "up", "--hosts", "1", "--name", name, env=env)
            assert proc.returncode == 0, proc.stderr[-2000:]
            state = yaml.safe_load((Path(root) / name / "state.json").read_text())
            subnets.append((state["mgmt_subnet"], state["fabric_subnet"]))
    finally:
        for name in names:
            sparkctl("sandbox", "down", "--yes", "--name", name, env=env)
        shutil.rmtree(root, ignore_errors=True)
    assert subnets[0] != subnets[1]
    assert not set(subnets[0] + subnets[1]) & set(sandbox_cluster.subnets)
