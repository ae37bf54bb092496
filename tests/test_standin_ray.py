"""The stand-in Ray (sparkctl/standin/ray.py) on this machine: a head, worker nodes as real
processes over TCP, and the engine's driver waiting for GPUs and learning when a node leaves."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from sparkctl.standin.ray import Driver
from test_standin_support import REPO, free_port

pytestmark = pytest.mark.integration  # stand-in ranks as processes


def ray(*args: str, env: dict, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sparkctl.standin.ray", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_a_driver_waits_for_the_gpus_and_hears_when_a_node_leaves(tmp_path):
    import os

    env = {**os.environ, "RAY_TMPDIR": str(tmp_path / "ray"), "SPARKCTL_STANDIN_RENDEZVOUS_TIMEOUT_S": "30"}
    port = free_port()
    workers = []
    try:
        head = ray("start", "--head", f"--port={port}", "--node-name", "head", env=env)
        out, err = head.communicate(timeout=30)
        assert head.returncode == 0 and "Ray runtime started." in out, err
        assert (tmp_path / "ray" / "ray_current_cluster").read_text().strip() == f"127.0.0.1:{port}"
        lost: list[str] = []
        gone = threading.Event()
        driver = Driver(gpus=3, on_lost=lambda node: (lost.append(node), gone.set()), address=f"127.0.0.1:{port}",
                        timeout_s=30)
        ready: dict = {}
        waiter = threading.Thread(target=lambda: ready.update(nodes=driver.wait_ready()))
        waiter.start()
        time.sleep(0.5)
        assert not ready  # one GPU (the head) of three
        for name in ("w1", "w2"):
            workers.append(ray("start", f"--address=127.0.0.1:{port}", "--block", "--node-name", name, env=env))
        waiter.join(30)
        assert ready["nodes"] == ["head", "w1", "w2"] and driver.nodes_connected == 3
        twin = ray("start", f"--address=127.0.0.1:{port}", "--node-name", "w1", env=env)
        assert twin.wait(30) == 1 and "already in the cluster" in twin.stderr.read()
        status = subprocess.run([sys.executable, "-m", "sparkctl.standin.ray", "status"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=30)
        assert status.returncode == 0 and status.stdout.split() == ["Active:", "1", "node_head", "1", "node_w1", "1", "node_w2"]
        workers[1].kill()
        assert gone.wait(10) and lost == ["w2"] and driver.nodes_connected == 2
        workers[0].terminate()  # SIGTERM: an orderly leave, exit 0
        assert workers[0].wait(10) == 0
    finally:
        for proc in workers:
            proc.kill()
        subprocess.run(["pkill", "-f", f"sparkctl.standin.ray _gcs {port} "], check=False)
