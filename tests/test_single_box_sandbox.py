"""The single-box profile served natively on one sandbox host (real sshd, the stand-in single-box engine
as a host process): each start guard refuses when provoked, then serve / status / logs / bench / stop,
and stop waits for the memory to come back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sandbox_fixture import sandbox_cluster, give_to_user  # noqa: F401  (the session's cluster)
from sparkctl.config.profile import load_profile
from sparkctl.engram.checkpoint_maker import make_checkpoint
from test_standin_support import REPO, sparkctl

pytestmark = pytest.mark.sandbox

TAG = "sparkctl-standin:onebox-test"
MODEL = "/mnt/nvme/models/DeepSeek-V4.1-Flash"
DIR = "/var/lib/sparkctl/sandbox-onebox"
PROFILE = ["--profile", "sandbox-onebox", "--set", "env.SPARKCTL_STANDIN_ITL_MS=2"]


class OneBox:
    def __init__(self, cluster, inventory: Path):
        self.cluster, self.inventory = cluster, inventory
        self.head = cluster.info.hosts[0]

    def cli(self, *args: str, timeout: float = 300):
        return sparkctl("-i", str(self.inventory), *args, timeout=timeout, module="sparkctl")

    def exec(self, *argv: str, input: bytes | None = None, check: bool = True):
        from sparkctl.sandbox import cluster

        result = cluster.exec_in_host(self.cluster.info, self.head.name, list(argv), input=input, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"{argv}: {result.stderr.decode(errors='replace')}")
        return result

    def read(self, path: str) -> str | None:
        result = self.exec("cat", path, check=False)
        return result.stdout.decode() if result.returncode == 0 else None

    def serve(self, *extra: str):
        return self.cli("--json", "serve", *PROFILE, *extra)


@pytest.fixture(scope="module")
def box(sandbox_cluster, tmp_path_factory):  # noqa: F811
    from sparkctl.standin.rootfs import docker_import_argv, write_rootfs_tar

    tmp = tmp_path_factory.mktemp("onebox")
    inventory = tmp / "inventory.yaml"
    inventory.write_text(Path(sandbox_cluster.info.inventory).read_text())
    b = OneBox(sandbox_cluster, inventory)
    make_checkpoint(str(Path(b.head.nvme_dir) / "models" / "DeepSeek-V4.1-Flash"), vocab_size=64)
    give_to_user(b.head.nvme_dir)  # the login user's, as on a real box
    tar = write_rootfs_tar(tmp / "standin.tar")
    b.exec(*docker_import_argv(TAG), input=Path(tar.path).read_bytes())
    yield b
    b.cli("stop", "-y", "--profile", "sandbox-onebox", "--break-lock")
    b.exec("docker", "rm", "-f", "onebox-porthog", check=False)
    b.exec("docker", "rmi", "-f", TAG, check=False)


def test_guard_port_held_by_a_container_is_named(box):
    box.exec("docker", "run", "-d", "--name", "onebox-porthog", "--network", "host", TAG,
             "python3", "-m", "http.server", "8000")
    try:
        deadline = time.monotonic() + 20
        while b":8000 " not in box.exec("ss", "-Htln").stdout:
            assert time.monotonic() < deadline, "the port hog never listened"
            time.sleep(0.1)
        result = box.serve()
        assert result.code == 1, result
        report = result.json()
        assert report["stage"] == "guards"
        # As the login user (not root) another user's process is not named: the container runs as root.
        assert any("port 8000 is taken" in r for r in report["refusals"]), report["refusals"]
        assert box.read(f"{DIR}/engine.pid") is None  # nothing started
    finally:
        box.exec("docker", "rm", "-f", "onebox-porthog", check=False)


def test_guard_memory_floor_names_who_holds_the_pool(box):
    result = box.serve("--set", "single_box.min_free_gib=100000")
    assert result.code == 1, result
    refusal = " ".join(result.json()["refusals"])
    assert "below MIN_FREE_GIB 100000" in refusal and "holding the unified memory pool" in refusal
    assert "(pid " in refusal


def test_guard_incomplete_checkpoint(box):
    shard = sorted((Path(box.head.nvme_dir) / "models" / "DeepSeek-V4.1-Flash").glob("model-*.safetensors"))[-1]
    kept = shard.with_suffix(".kept")
    shard.rename(kept)
    try:
        result = box.serve()
        assert result.code == 1, result
        assert any("is incomplete" in r and shard.name in r for r in result.json()["refusals"])
    finally:
        kept.rename(shard)


def test_serve_status_logs_bench_stop(box):
    result = box.serve()
    assert result.code == 0, result.stdout[-3000:]
    report = result.json()
    assert report["ok"] and report["launcher"] == "native" and report["pid"]
    config = report["health"]["health"]["engine_config"]
    assert (config["arena_slots"], config["max_seq"], config["default_thinking"]) == (6000, 32768, "off")
    pid = report["pid"]
    assert box.read(f"{DIR}/engine.pid").strip() == str(pid)
    assert oct(int(box.exec("stat", "-c", "%a", f"{DIR}/engine.env").stdout.decode(), 8)) == "0o600"

    status = box.cli("--json", "status", "--profile", "sandbox-onebox")
    assert status.code == 0, status
    doc = status.json()
    assert doc["ok"] and doc["drift"] == [] and doc["hosts"][0]["pid"] == pid
    drifted = box.cli("--json", "status", "--profile", "sandbox-onebox", "--set", "single_box.default_effort=90")
    assert any(d.startswith("env DEFAULT_EFFORT: running with 75") for d in drifted.json()["drift"]), drifted

    logs = box.cli("logs", "--profile", "sandbox-onebox", "--tail", "20")
    assert logs.code == 0 and "ready" in logs.stdout, logs

    bench = box.cli("--json", "bench", "--profile", "sandbox-onebox", "--concurrency", "1", "--requests", "2",
                    "--max-tokens", "8", "--prompt-tokens", "16")
    assert bench.code == 0, bench
    level = bench.json()["levels"][0]
    assert len(level["x_engine_stats"]) == 2 and level["x_engine_stats"][0]["arena_slots"] == 6000
    assert bench.json()["server"]["engine_config"]["expert_format"] == "cb3"

    follow_logs_until_a_new_request(box, report["endpoint"])

    smoke = box.cli("--json", "smoke", "--profile", "sandbox-onebox")
    assert smoke.code == 0, smoke
    assert {"thinking_kwargs", "thinking_enable", "thinking_effort"} <= {c["name"] for c in smoke.json()["checks"]}

    stopped = box.cli("--json", "stop", "-y", "--profile", "sandbox-onebox")
    assert stopped.code == 0, stopped
    host = stopped.json()["hosts"][0]
    assert (host["state"], host["pid"], host["memory_back"]) == ("terminated", pid, True)
    # Gone, or a zombie not yet reaped; it may go between the two looks (then its stat reads as None).
    gone = box.exec("test", "-e", f"/proc/{pid}", check=False).returncode != 0
    stat = None if gone else box.read(f"/proc/{pid}/stat")
    assert stat is None or " Z " in stat, stat
    assert box.read(f"{DIR}/engine.pid") is None and box.read(f"{DIR}/deployment.json") is None
    after = box.cli("--json", "status", "--profile", "sandbox-onebox")
    assert after.code == 1 and not after.json()["deployed"]
    audit = box.read("/var/lib/sparkctl/audit.log").splitlines()
    assert "serve" in audit[-2] and "launcher=native" in audit[-2] and "result=ok" in audit[-2]
    assert "stop" in audit[-1] and "result=ok" in audit[-1]
    assert box.read("/var/lib/sparkctl/deploy.lock/info.json") is None


def test_up_converges_the_single_box(box):
    """`up` serves the single-box profile as a host process (no image steps), then finds nothing to do."""
    first = box.cli("--json", "up", *PROFILE, timeout=600)
    assert first.code == 0, first.stdout[-3000:] + first.stderr[-3000:]
    steps = {s["name"]: s for s in first.json()["steps"]}
    assert {steps[n]["status"] for n in ("build", "distribute", "engram")} == {"skipped"}
    assert all("launcher: native" in steps[n]["reason"] for n in ("build", "distribute", "engram"))
    assert steps["serve"]["status"] == "changed" and steps["smoke"]["status"] == "ok", steps
    pid = box.read(f"{DIR}/engine.pid").strip()
    again = box.cli("--json", "up", *PROFILE, timeout=600)
    assert again.code == 0, again.stdout[-3000:]
    steps = {s["name"]: s for s in again.json()["steps"]}
    assert steps["serve"]["status"] == "ok" and "serves it" in steps["serve"]["reason"], steps["serve"]
    assert box.read(f"{DIR}/engine.pid").strip() == pid  # converged: the engine was left running
    drifted = box.cli("--json", "up", *PROFILE, "--set", "single_box.default_effort=90", timeout=600)
    assert drifted.code == 0, drifted.stdout[-3000:]
    serve = next(s for s in drifted.json()["steps"] if s["name"] == "serve")
    assert serve["status"] == "changed" and "DEFAULT_EFFORT" in serve["reason"], serve
    assert box.read(f"{DIR}/engine.pid").strip() != pid
    assert box.cli("--json", "stop", "-y", "--profile", "sandbox-onebox").code == 0


def follow_logs_until_a_new_request(box, endpoint: str) -> None:
    """`logs --follow` streams engine.log: a request made while it runs shows up in it."""
    import httpx

    argv = [sys.executable, "-m", "sparkctl", "-i", str(box.inventory), "logs", "--profile", "sandbox-onebox",
            "--follow", "--tail", "1"]
    env = {k: v for k, v in os.environ.items() if k != "SPARKCTL_INVENTORY"}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        seen = [proc.stdout.readline()]  # the tail: the log exists and the stream is open
        httpx.post(endpoint + "/v1/completions", json={"prompt": "follow me", "max_tokens": 2}, timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "POST /v1/completions" not in seen[-1]:
            seen.append(proc.stdout.readline())
        assert "POST /v1/completions" in seen[-1], seen
    finally:
        proc.terminate()
        proc.wait(10)


def test_engine_dying_at_start_ends_the_wait_with_its_log_tail(box):
    result = box.serve("--env", "EXPERT_FORMAT=bogus")
    assert result.code == 1, result
    report = result.json()
    assert report["stage"] == "health" and "died" in report["message"]
    assert "EXPERT_FORMAT='bogus'" in report["log_tail"]
    # The health wait ended on the death, not on the profile's health timeout: a fraction of it, not a speed.
    timeout = load_profile("sandbox-onebox").profile.serving.health_timeout_s
    assert report["health_seconds"] is not None and report["health_seconds"] < timeout / 2


def test_stop_fails_when_the_memory_does_not_come_back(box):
    served = box.serve()
    assert served.code == 0, served.stdout[-2000:]
    stopped = box.cli("--json", "stop", "-y", "--profile", "sandbox-onebox", "--set", "single_box.min_free_gib=100000",
                      "--set", "native.memory_back_timeout_s=2")
    assert stopped.code == 1, stopped
    host = stopped.json()["hosts"][0]
    assert host["state"] == "terminated" and host["memory_back"] is False
    assert "below MIN_FREE_GIB 100000" in host["error"]
    assert box.read(f"{DIR}/engine.pid") is None  # the engine is gone all the same
