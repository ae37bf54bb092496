"""The native launcher's scripts and guards, run for real on this machine (sh, /proc, the stand-in
single-box engine as a real process). The commands are those serve runs over SSH; here a local
runner executes the same argv lists."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sparkctl.commands import native as N
from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.errors import ConfigError
from sparkctl.ops import native as ops
from sparkctl.remote.result import CommandResult
from test_standin_support import free_port

ENGINE = [sys.executable, "-m", "sparkctl.standin", "singlebox", "--engine", "v41"]


class LocalConn:
    """Runs an argv list on this machine, as sparkctl.remote.Connection.run does on a host."""

    def run(self, argv, *, timeout=None, stdin=None):
        began = time.monotonic()
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout)
        return CommandResult(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"),
                             time.monotonic() - began)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("box") / "model"
    make_checkpoint(str(path), vocab_size=64)
    return str(path)


@pytest.fixture
def box(tmp_path, checkpoint):
    """A plan for the single-box profile on this machine (inventory address 127.0.0.1)."""
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text(
        "cluster: onebox\npaths:\n  state_dir: %s\nhosts:\n  - name: box\n    address: 127.0.0.1\n    role: head\n"
        % (tmp_path / "state"))
    inventory = load_inventory(str(inventory_file))
    (tmp_path / "work").mkdir()
    started = []

    def make(*sets, envs=(), model=checkpoint):
        port = free_port()
        loaded = load_profile("single-box", sets=[
            f"native.workdir={tmp_path / 'work'}", f"native.command={json.dumps(ENGINE)}",
            f"single_box.model_dir={model}", f"serving.port={port}", "single_box.min_free_gib=0.25",
            "native.stop_grace_s=5", "native.memory_back_timeout_s=30", "max_model_len=4096", *sets],
            envs=["SPARKCTL_STANDIN_ITL_MS=1", *envs])
        plan = ops.plan_native(loaded, inventory, who="test@here", when="2026-11-30T18:00:00Z")
        started.append(plan)
        return plan

    yield make
    for plan in started:  # never leave an engine behind
        ops.stop_native(LocalConn(), plan.paths, plan.profile, grace_s=1, min_free_gib=0, memory_timeout_s=0)


def test_env_file_reads_back_in_sh(tmp_path):
    env = {"MODEL_DIR": "/models/with space", "QUOTE": "it's \"x\" $HOME `id`", "EMPTY": ""}
    path = tmp_path / "engine.env"
    path.write_text(N.env_file_text(env, "title"))
    out = subprocess.run(["sh", "-c", f"set -a; . {path}; set +a; env -0"], capture_output=True, check=True).stdout
    seen = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    assert all(seen[k] == v for k, v in env.items())


@pytest.mark.integration
def test_profile_settings_become_the_engines_env(box):
    plan = box("single_box.default_thinking=on", "single_box.default_effort=90")
    env = plan.env
    assert (env["MAX_SEQ"], env["SPEC"], env["DEFAULT_THINKING"], env["DEFAULT_EFFORT"]) == ("4096", "1", "on", "90")
    assert (env["EXPERT_FORMAT"], env["PRUNE_KEEP"], env["ARENA_GB"], env["MIN_FREE_GIB"]) == ("cb3", "0.39", "87", "0.25")
    assert env["SPARKCTL_PROFILE"] == "single-box"
    files = {f.name: f for f in plan.files}
    assert files["engine.env"].mode == 0o600 and files["launch.sh"].mode == 0o755
    assert json.loads(files["deployment.json"].content)["launcher"] == "native"


@pytest.mark.integration
def test_start_health_status_logs_stop_waits_for_memory(box):
    conn = LocalConn()
    plan = box(envs=["SPARKCTL_STANDIN_HOLD_MB=128", "SPARKCTL_STANDIN_LOAD_S=1"])
    pid = ops.start_native(conn, plan)
    waited, tail = ops.wait_native(conn, plan, timeout_s=120)
    assert waited.ok, tail
    assert waited.probe.health["engine_config"]["arena_slots"] == 6000
    assert ops.native_state(conn, plan.paths, plan.profile) == N.ProcessState("running", pid)
    rss_kib = int(next(l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:")))
    assert rss_kib > 128 * 1024  # the stand-in really holds its memory
    assert oct(os.stat(plan.paths.env_file).st_mode & 0o777) == "0o600"
    assert "ready" in ops.native_log_tail(conn, plan.paths)
    stopped = ops.stop_native(conn, plan.paths, plan.profile, grace_s=plan.stop_grace_s, min_free_gib=plan.min_free_gib,
                              memory_timeout_s=30)
    assert (stopped.state, stopped.pid, stopped.memory_back) == ("terminated", pid, True)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
    assert ops.native_state(conn, plan.paths, plan.profile).state == "stopped"
    assert "received SIGTERM" in ops.native_log_tail(conn, plan.paths)
    again = ops.stop_native(conn, plan.paths, plan.profile, grace_s=1, min_free_gib=0, memory_timeout_s=0)
    assert again.state == "stopped" and again.memory_back is None  # idempotent


@pytest.mark.integration
def test_second_start_replaces_the_running_engine(box):
    conn = LocalConn()
    plan = box()
    first = ops.start_native(conn, plan)
    second = ops.start_native(conn, plan)
    assert second != first
    assert ops.native_state(conn, plan.paths, plan.profile).pid == second
    assert os.path.exists(plan.paths.log + ".1")  # the previous run's log is kept


@pytest.mark.integration
def test_sigkill_after_the_grace_period(box):
    conn = LocalConn()
    stubborn = ["sh", "-c", "trap '' TERM; while :; do sleep 0.2; done"]
    plan = box(f"native.command={json.dumps(stubborn)}", "native.stop_grace_s=1")
    pid = ops.start_native(conn, plan)
    time.sleep(0.5)
    stopped = ops.stop_native(conn, plan.paths, plan.profile, grace_s=1, min_free_gib=0, memory_timeout_s=5)
    assert (stopped.state, stopped.pid) == ("killed", pid)


@pytest.mark.integration
def test_a_pid_that_is_not_ours_is_never_signalled(box, tmp_path):
    conn = LocalConn()
    plan = box()
    os.makedirs(plan.paths.directory, exist_ok=True)
    Path(plan.paths.pidfile).write_text(f"{os.getpid()}\n")  # this test process: no SPARKCTL_PROFILE mark
    assert ops.native_state(conn, plan.paths, plan.profile).state == "stale"
    stopped = ops.stop_native(conn, plan.paths, plan.profile, grace_s=1, min_free_gib=0, memory_timeout_s=0)
    assert stopped.state == "stale" and not os.path.exists(plan.paths.pidfile)


@pytest.mark.integration
def test_health_wait_ends_early_with_the_log_tail_when_the_engine_dies(box):
    conn = LocalConn()
    plan = box(envs=["EXPERT_FORMAT=bogus"])
    ops.start_native(conn, plan)
    timeout_s = 300
    waited, tail = ops.wait_native(conn, plan, timeout_s=timeout_s)
    assert not waited.ok and waited.stopped_by and "gone" in waited.stopped_by
    assert waited.seconds < timeout_s * 0.4  # ends when the engine dies, not at the timeout
    assert "EXPERT_FORMAT='bogus'" in tail


@pytest.mark.integration
def test_guard_port_taken_names_the_process(box):
    plan = box()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", plan.port))
        sock.listen()
        with pytest.raises(ops.GuardRefused) as err:
            ops.start_native(LocalConn(), plan)
    message = str(err.value)
    assert f"port {plan.port} is taken by" in message and f"pid {os.getpid()}" in message
    assert not os.path.exists(plan.paths.pidfile)  # nothing started, nothing written


@pytest.mark.integration
def test_guard_memory_names_who_holds_the_pool(box):
    plan = box("single_box.min_free_gib=100000")
    with pytest.raises(ops.GuardRefused) as err:
        ops.start_native(LocalConn(), plan)
    message = str(err.value)
    assert "below MIN_FREE_GIB 100000" in message and "holding the unified memory pool" in message
    assert "(pid " in message


@pytest.mark.integration
def test_guard_checkpoint_incomplete(box, tmp_path, checkpoint):
    partial = tmp_path / "partial"
    make_checkpoint(str(partial), vocab_size=64)
    shard = sorted(partial.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(ops.GuardRefused) as err:
        ops.start_native(LocalConn(), box(model=str(partial)))
    assert "is incomplete" in str(err.value) and shard.name in str(err.value)
    with pytest.raises(ops.GuardRefused) as err:
        ops.start_native(LocalConn(), box(model=str(tmp_path / "absent")))
    assert "does not exist" in str(err.value)


def test_loopback_engine_refused_when_sparkctl_is_not_on_the_box(tmp_path):
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text("cluster: onebox\nhosts:\n  - name: box\n    address: 192.0.2.7\n    role: head\n")
    loaded = load_profile("single-box")
    with pytest.raises(ConfigError) as err:
        ops.plan_native(loaded, load_inventory(str(inventory_file)), who="t", when="t")
    assert "serving.host" in str(err.value) and "127.0.0.1" in str(err.value)
    opened = load_profile("single-box", sets=["serving.host=0.0.0.0"])
    plan = ops.plan_native(opened, load_inventory(str(inventory_file)), who="t", when="t")
    assert plan.endpoint == "http://192.0.2.7:8000"


def test_parse_room_names_containers_by_cgroup_and_published_port():
    cid = "a" * 64
    room = N.parse_room(json.dumps({
        "mem_available": 5 * 2**30,
        "listeners": {"8000": [{"pid": 10, "command": "docker-proxy", "rss": 0, "container_id": None}],
                      "9000": [{"pid": 11, "command": "python3", "rss": 2**30, "container_id": cid}]},
        "top": [{"pid": 11, "command": "python3", "rss": 2**30, "container_id": cid}],
        "containers": {cid: {"name": "engine", "ports": ""},
                       "b" * 64: {"name": "webui", "ports": "127.0.0.1:8000->8080/tcp"}}}))
    assert ops.port_refusal(8000, room).startswith("port 8000 is taken by container webui")
    assert "docker-proxy" not in ops.port_refusal(8000, room)
    assert "python3 (pid 11, 1.0 GiB, container engine)" in ops.port_refusal(9000, room)
    assert ops.port_refusal(7000, room) is None
    assert "container engine" in ops.memory_refusal(90, room)


def test_serve_dry_run_shows_the_plan_without_secret_values(cli, tmp_path):
    inventory_file = tmp_path / "inventory.yaml"
    inventory_file.write_text("cluster: onebox\nhosts:\n  - name: box\n    address: 127.0.0.1\n    role: head\n")
    result = cli("-i", str(inventory_file), "--json", "serve", "--profile", "single-box", "--dry-run",
                 "--env", "HF_TOKEN=hf_verysecret")
    assert result.code == 0, result
    doc = result.json()
    assert doc["launcher"] == "native" and doc["endpoint"] == "http://127.0.0.1:8000"
    assert doc["guards"] == {"port": 8000, "min_free_gib": 90.0,
                             "checkpoint": "/opt/deepseek-v41-flash-spark/models/DeepSeek-V4.1-Flash"}
    assert doc["env"]["HF_TOKEN"] == "***" and "hf_verysecret" not in result.stdout + result.stderr
    human = cli("-i", str(inventory_file), "serve", "--profile", "single-box", "--dry-run")
    assert human.code == 0 and "MemAvailable >= 90 GiB" in human.stdout


def test_drift_names_changed_settings_and_masks_secrets():
    from sparkctl.ops.native_deploy import env_drift

    lines = env_drift({"MAX_SEQ": "32768", "HF_TOKEN": "old-secret", "GONE": "1"},
                      {"MAX_SEQ": "262144", "HF_TOKEN": "new-secret"})
    assert "env MAX_SEQ: running with 32768, the profile now says 262144" in lines
    assert "env GONE: running with 1, the profile now says (unset)" in lines
    assert not any("secret" in line.split(":", 1)[1] for line in lines if line.startswith("env HF_TOKEN"))
    assert env_drift({"A": "1"}, {"A": "1"}) == []


@pytest.mark.integration
def test_stop_reports_memory_that_does_not_come_back(box):
    conn = LocalConn()
    plan = box()
    pid = ops.start_native(conn, plan)
    began = time.monotonic()
    stopped = ops.stop_native(conn, plan.paths, plan.profile, grace_s=5, min_free_gib=100000, memory_timeout_s=2)
    assert (stopped.state, stopped.pid, stopped.memory_back) == ("terminated", pid, False)
    assert stopped.memory_wait_s >= 2 and time.monotonic() - began < 60
    assert 0 < stopped.mem_available < 100000 * 2**30


def test_status_compares_only_what_the_serve_recorded():
    from sparkctl.ops.drift import replayable_overrides

    recorded = ["max_model_len=65536", "env HF_TOKEN=(not recorded)", "env.SPARKCTL_STANDIN_ITL_MS=(not recorded)",
                "serving.api_key=***"]
    replay, unknown = replayable_overrides(recorded, frozenset())
    assert replay == ["max_model_len=65536"]
    assert unknown == {"HF_TOKEN", "SPARKCTL_STANDIN_ITL_MS"}
    assert replayable_overrides(recorded, frozenset({"HF_TOKEN"}))[1] == {"SPARKCTL_STANDIN_ITL_MS"}


@pytest.mark.integration
def test_start_makes_the_engines_folders_as_the_login_user(box, tmp_path):
    """The folders the engine writes (./results of its checkout, which the container path bind-mounts)
    exist before the start and are the login user's; a missing checkout is named, not made empty."""
    conn = LocalConn()
    plan = box(envs=["SPARKCTL_STANDIN_LOAD_S=0"])
    results = tmp_path / "work" / "results"
    assert plan.folders == [str(results)] and not results.exists()
    assert plan.to_json()["folders"] == [str(results)]
    ops.start_native(conn, plan)
    assert results.is_dir() and results.stat().st_uid == os.getuid()
    ops.stop_native(conn, plan.paths, plan.profile, grace_s=1, min_free_gib=0, memory_timeout_s=0)

    gone = box(f"native.workdir={tmp_path / 'no-checkout'}")
    with pytest.raises(RuntimeError, match=f"cannot create {tmp_path}/no-checkout/results in native.workdir "
                                           f"{tmp_path}/no-checkout: {tmp_path}/no-checkout is not a folder this user can enter"):
        ops.start_native(conn, gone)
    assert not (tmp_path / "no-checkout").exists()
