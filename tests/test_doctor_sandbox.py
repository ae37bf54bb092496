"""doctor against the sandbox cluster: real sshd, real dockerd, stand-in GB10 tools.

Each failure case breaks one host and asserts that host's verdict while the other hosts are
still fully checked. Every test writes its own inventory copy, so cases don't leak.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from clirun import run_cli
from sandbox_fixture import sandbox_cluster, give_to_user  # noqa: F401  (the session's cluster)
from sparkctl.engram.checkpoint_maker import make_checkpoint

pytestmark = pytest.mark.sandbox

TP3 = ["--profile", "sandbox", "--set", "tensor_parallel=3"]
DOCTOR_TIMEOUT_S = 5  # doctor's --timeout in these tests


def doctor(inventory: Path, *args: str, timeout: float = 120) -> tuple[int, dict]:
    """``doctor --json`` in this process (tests/clirun.py): a fresh interpreter per call cost ~1 s of
    CPU and proved nothing a call in process does not."""
    result = run_cli("-i", str(inventory), "doctor", "--json", "--timeout", str(DOCTOR_TIMEOUT_S), *args, timeout=timeout)
    assert result.stdout, result.stderr
    return result.code, json.loads(result.stdout)


def checks_of(report: dict) -> dict[str, dict[str, dict]]:
    return {h["name"]: {c["id"]: c for c in h["checks"]} for h in report["hosts"]}


@pytest.fixture
def inventory(sandbox_cluster, tmp_path):  # noqa: F811
    """A copy of the sandbox inventory whose checkpoint dir holds a small real checkpoint on every host."""
    data = yaml.safe_load(Path(sandbox_cluster.info.inventory).read_text())
    model_dir = "/mnt/nvme/doctor-test/model"
    data["paths"]["model_dir"] = model_dir
    for host in sandbox_cluster.info.hosts:
        local = Path(host.nvme_dir) / "doctor-test" / "model"
        if not (local / "model.safetensors.index.json").exists():
            make_checkpoint(str(local), vocab_size=64)
        give_to_user(host.nvme_dir)  # the login user's, as on a real box
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def edit(path: Path, change) -> Path:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def assert_others_fully_checked(checks: dict, broken: str) -> None:
    for name, by_id in checks.items():
        if name == broken:
            continue
        for check_id in ("ssh", "gpu", "driver", "docker", "rdma", "rdma_devices", "memory", "checkpoint", "clock"):
            assert by_id[check_id]["status"] == "pass", (name, check_id, by_id[check_id])


def test_healthy_sandbox_passes_everything_but_the_missing_image(inventory):
    # A tag no suite builds, so the verdict does not depend on what other tests distributed.
    code, report = doctor(inventory, *TP3, "--set", "image.tag=sparkctl-doctor-absent:never")
    checks = checks_of(report)
    assert set(checks) == {"spark-1", "spark-2", "spark-3"}
    assert_others_fully_checked(checks, broken="")
    head = checks["spark-1"]
    assert head["fabric"]["status"] == "pass" and "2 worker" in head["fabric"]["detail"]
    assert head["peers"] == {"id": "peers", "status": "pass", "hint": "", "setup": "",
                             "detail": "logs in to 2 worker(s) over SSH (distribute --from)"}
    assert "peers" not in checks["spark-2"]  # a head-only check
    assert head["gpu"]["detail"].startswith("NVIDIA GB10, SM 12.1")
    for by_id in checks.values():
        assert by_id["ulimits"]["status"] == "pass"  # the sandbox profile asks no more than the machine allows
        assert by_id["image"]["status"] == "fail"  # nothing built/distributed in this test
    assert code == 1 and report["ok"] is False


def test_every_check_is_told_to_the_reporter_as_its_hosts_step(inventory):
    """Text mode with SPARKCTL_EVENTS=json: the table on stdout, each check's verdict a JSON line on stderr."""
    proc = run_cli("-i", str(inventory), "doctor", "--timeout", str(DOCTOR_TIMEOUT_S), *TP3,
                   "--set", "image.tag=sparkctl-doctor-absent:never", env={"SPARKCTL_EVENTS": "json", "COLUMNS": "200"},
                   timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "spark-3" in proc.stdout and "image" in proc.stdout and "all hosts ready" not in proc.stdout
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    steps = {(e["host"], e["step"]): e for e in events if e["event"] == "looked"}
    assert {e["event"] for e in events} == {"looked"}  # a check never acts
    for host in ("spark-1", "spark-2", "spark-3"):
        assert steps[(host, "ssh")]["status"] == "ok" and steps[(host, "ssh")]["reason"].startswith("connected in")
        image = steps[(host, "image")]
        assert image["status"] == "failed" and "sparkctl-doctor-absent:never not present (fix: " in image["reason"]
    assert steps[("spark-1", "peers")]["status"] == "ok" and ("spark-2", "peers") not in steps


def test_tp4_limits_fail_on_a_machine_with_low_hard_limits(inventory):
    """The real profiles ask memlock unlimited and nofile 1048576; this machine's hard limits are lower."""
    hard_memlock = subprocess.run(["sh", "-c", "ulimit -Hl"], capture_output=True, text=True).stdout.strip()
    if hard_memlock == "unlimited":
        pytest.skip("this machine's memlock hard limit is unlimited")
    _, report = doctor(inventory, "--profile", "tp4", "--set", "tensor_parallel=3")
    for by_id in checks_of(report).values():
        assert by_id["ulimits"]["status"] == "fail" and "memlock" in by_id["ulimits"]["detail"]
        assert "limits.conf" in by_id["ulimits"]["hint"]


def test_stopped_sshd_fails_that_host_only(sandbox_cluster, inventory):  # noqa: F811
    from sparkctl.sandbox import cluster

    started = time.monotonic()
    doctor(inventory, *TP3)  # every host up: what a whole doctor takes on this machine now
    healthy = time.monotonic() - started
    cluster.stop_sshd(sandbox_cluster.info, "spark-2")
    try:
        started = time.monotonic()
        code, report = doctor(inventory, *TP3)
        elapsed = time.monotonic() - started
    finally:
        cluster.start_sshd(sandbox_cluster.info, "spark-2")
    started = time.monotonic()
    doctor(inventory, *TP3)  # and once more after: the slower of the two healthy runs sets the bar
    healthy = max(healthy, time.monotonic() - started)
    checks = checks_of(report)
    ssh = checks["spark-2"]["ssh"]
    assert ssh["status"] == "fail" and "refused" in ssh["detail"] and "sshd" in ssh["hint"]
    assert all(c["status"] == "skip" for cid, c in checks["spark-2"].items() if cid != "ssh")
    assert_others_fully_checked(checks, broken="spark-2")
    assert code == 1
    # A refused connection is neither waited out (the connect timeout) nor retried for long: one host
    # down makes doctor no slower than healthy runs measured just before and after (a ratio: the machine's
    # load sets both; an absolute bound failed at load average 40).
    assert elapsed < 2 * healthy, (elapsed, healthy)


def test_changed_host_key_is_refused(sandbox_cluster, inventory, tmp_path):  # noqa: F811
    known = Path(sandbox_cluster.info.known_hosts).read_text().splitlines()
    address = sandbox_cluster.info.host("spark-3").address
    key_path = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_path)], check=True)
    impostor = key_path.with_suffix(".pub").read_text().split()[:2]
    lines = [line if not line.startswith(address + " ") else f"{address} {' '.join(impostor)}" for line in known]
    (tmp_path / "known_hosts").write_text("\n".join(lines) + "\n")
    edit(inventory, lambda d: d.update(known_hosts=str(tmp_path / "known_hosts")))
    _, report = doctor(inventory, *TP3)
    checks = checks_of(report)
    assert checks["spark-3"]["ssh"]["status"] == "fail"
    assert "hostkey-changed" in checks["spark-3"]["ssh"]["detail"]
    assert_others_fully_checked(checks, broken="spark-3")


def test_wrong_identity_file_fails_auth(inventory, tmp_path):
    key_path = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_path)], check=True)

    def use_stranger_key(data):
        data["hosts"][1]["ssh"] = {"identity_file": str(key_path)}

    edit(inventory, use_stranger_key)
    _, report = doctor(inventory, *TP3)
    checks = checks_of(report)
    assert checks["spark-2"]["ssh"]["status"] == "fail"
    assert "auth" in checks["spark-2"]["ssh"]["detail"]
    assert_others_fully_checked(checks, broken="spark-2")


def test_too_small_nvme_fails_disk(sandbox_cluster, inventory):  # noqa: F811
    from sparkctl.sandbox import cluster

    small = "/mnt/nvme-small"
    cluster.exec_in_host(sandbox_cluster.info, "spark-3", ["sh", "-c", f"mkdir -p {small} && (mountpoint -q {small} || mount -t tmpfs -o size=1m tmpfs {small})"], check=True)
    try:
        edit(inventory, lambda d: d["hosts"][2].update(nvme_path=small))
        _, report = doctor(inventory, *TP3)
    finally:
        cluster.exec_in_host(sandbox_cluster.info, "spark-3", ["umount", small])
    checks = checks_of(report)
    disk = checks["spark-3"]["disk"]
    assert disk["status"] == "fail" and "needs" in disk["detail"] and small in disk["detail"]
    for name in ("spark-1", "spark-2"):
        assert checks[name]["disk"]["status"] == "pass"
    assert_others_fully_checked(checks, broken="spark-3")


def test_taken_serving_port_fails_on_the_head(sandbox_cluster, inventory):  # noqa: F811
    from sparkctl.sandbox import cluster

    listener = cluster.exec_in_host(
        sandbox_cluster.info, "spark-1",
        ["sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1 & echo $!"], check=True)
    pid = int(listener.stdout.strip())
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ss = cluster.exec_in_host(sandbox_cluster.info, "spark-1", ["ss", "-Htln"])
            if b":8000 " in ss.stdout:
                break
            time.sleep(0.1)
        _, report = doctor(inventory, *TP3)
    finally:
        os.kill(pid, 15)
    checks = checks_of(report)
    ports = checks["spark-1"]["ports"]
    assert ports["status"] == "fail" and "serving port 8000" in ports["detail"]
    assert checks["spark-2"]["ports"]["status"] == "pass"
    assert_others_fully_checked(checks, broken="spark-1")


def test_missing_checkpoint_shard_is_named(sandbox_cluster, inventory):  # noqa: F811
    host = sandbox_cluster.info.host("spark-2")
    model = Path(host.nvme_dir) / "doctor-test" / "model"
    shard = sorted(model.glob("*.safetensors"))[-1]
    hidden = shard.with_suffix(".hidden")
    shard.rename(hidden)
    try:
        _, report = doctor(inventory, *TP3)
    finally:
        hidden.rename(shard)
    checkpoint = checks_of(report)["spark-2"]["checkpoint"]
    assert checkpoint["status"] == "fail" and shard.name in checkpoint["detail"]
    assert checks_of(report)["spark-1"]["checkpoint"]["status"] == "pass"


def test_odd_driver_version_is_named(sandbox_cluster, inventory):  # noqa: F811
    from sparkctl.sandbox import cluster, standins

    cluster.set_standin(sandbox_cluster.info, "spark-3", SPARK_DRIVER_VERSION="575.51.03")
    try:
        _, report = doctor(inventory, *TP3)
    finally:
        cluster.set_standin(sandbox_cluster.info, "spark-3", SPARK_DRIVER_VERSION=standins.GB10_DEFAULTS["SPARK_DRIVER_VERSION"])
    checks = checks_of(report)
    assert checks["spark-3"]["driver"]["status"] == "fail" and "575.51.03" in checks["spark-3"]["driver"]["detail"]
    assert checks["spark-1"]["driver"]["status"] == "pass"


def _probe_while_sessions_drop(sandbox_cluster, inventory, argv: list[str], drops: int):  # noqa: F811
    """Run one doctor probe on spark-2 and kill the SSH session serving it ``drops`` times."""
    import threading

    from sparkctl.commands.facts import Fact
    from sparkctl.config.inventory import load_inventory
    from sparkctl.ops.doctor.gather import DoctorFindings, probe
    from sparkctl.remote.pool import ConnectionPool
    from sparkctl.sandbox import cluster

    loaded = load_inventory(inventory)
    spark2 = next(h for h in loaded.hosts if h.name == "spark-2")
    started = Path(sandbox_cluster.info.host("spark-2").nvme_dir) / "doctor-test" / "probe-started"
    facts = DoctorFindings("spark-2")
    with ConnectionPool(connect_timeout=10) as pool:
        conn = pool.get(loaded.ssh_target(spark2))
        conn.connect()
        slow = Fact("run the slow probe", lambda: list(argv), str.strip)
        asking = threading.Thread(target=probe, args=(conn, facts, "slow", slow))
        asking.start()
        for _ in range(drops):
            deadline = time.monotonic() + 20
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert started.exists(), "the probe never started on spark-2"
            started.unlink()
            assert cluster.drop_ssh_sessions(sandbox_cluster.info, "spark-2"), "no SSH session to drop"
        asking.join(60)
        assert not asking.is_alive()
    return facts


def test_a_connection_dropped_mid_probe_is_asked_again_on_a_new_one(sandbox_cluster, inventory):  # noqa: F811
    # The first run marks its start and hangs until its session is killed; the second answers.
    script = 'if [ -e "$1.seen" ]; then echo answered; else touch "$1.seen" "$1"; sleep 60; fi'
    marker = "/mnt/nvme/doctor-test/probe-started"
    seen = Path(sandbox_cluster.info.host("spark-2").nvme_dir) / "doctor-test" / "probe-started.seen"
    seen.unlink(missing_ok=True)
    try:
        facts = _probe_while_sessions_drop(sandbox_cluster, inventory, ["sh", "-c", script, "sh", marker], drops=1)
    finally:
        seen.unlink(missing_ok=True)
    assert facts.errors == {} and facts.facts["slow"] == "answered"


def test_a_connection_that_drops_twice_is_reported_as_unread_not_as_the_hosts_answer(sandbox_cluster, inventory):  # noqa: F811
    from sparkctl.ops.doctor.judge import UNREAD_HINT, from_error

    script = 'touch "$1"; sleep 60'
    facts = _probe_while_sessions_drop(sandbox_cluster, inventory,
                                       ["sh", "-c", script, "sh", "/mnt/nvme/doctor-test/probe-started"], drops=2)
    assert facts.unread == {"slow"} and "dropped" in facts.errors["slow"]
    verdict = from_error("docker", facts, "slow", "install Docker")
    assert verdict.status == "fail" and verdict.hint == UNREAD_HINT


def test_a_head_that_cannot_log_in_to_the_workers_is_a_warning(sandbox_cluster, inventory):  # noqa: F811
    key = Path(sandbox_cluster.info.host("spark-1").user_home) / ".ssh" / "id_ed25519"
    hidden = key.with_suffix(".hidden")
    key.rename(hidden)
    try:
        _, report = doctor(inventory, *TP3, "--set", "image.tag=sparkctl-doctor-absent:never")
    finally:
        hidden.rename(key)
    peers = checks_of(report)["spark-1"]["peers"]
    assert peers["status"] == "warn" and "ssh-copy-id" in peers["hint"]
    for worker in ("spark-2", "spark-3"):
        address = sandbox_cluster.info.host(worker).fabric_address
        assert f"{worker} (nvidia@{address}: Permission denied (publickey).)" in peers["detail"]
    assert_others_fully_checked(checks_of(report), broken="")
