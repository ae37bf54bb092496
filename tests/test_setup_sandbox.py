"""A rack's first hour on the sandbox: bare hosts (``sandbox up --bare``), `doctor` naming each gap,
`sparkctl setup` fixing them (root only through ``sudo -n``) and a second run changing nothing,
`doctor` then green; password sudo; and `up --model-source` from bare hosts to a smoke-tested
endpoint, as the ordinary user ``nvidia``.

Each story gets its own bare sandbox (not the session's prepared one): setup changes hosts for good.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sandbox_fixture import ROOT_PREFIX, sandbox_name, skip_reason
from test_standin_support import sparkctl

pytestmark = pytest.mark.sandbox

SETUP_STEPS = ["docker_group", "folders", "fabric", "nvidia_runtime", "ssh_mesh"]


class Bare:
    """A bare sandbox of its own, under its own state root."""

    def __init__(self, name: str, hosts: int, **kind):
        import tempfile

        from sparkctl.sandbox import cluster

        self.root = tempfile.mkdtemp(prefix=ROOT_PREFIX)
        self.name = name
        with _root(self.root):
            self.info = cluster.up_on_free_subnets(name, hosts, cluster.subnet_pairs(199, 150), bare=True, **kind)

    def cli(self, *args: str, timeout: float = 600, env: dict | None = None):
        return sparkctl("-i", self.info.inventory, *args, timeout=timeout, env=env)

    def ssh(self, host, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-i", self.info.identity_file, "-o", f"UserKnownHostsFile={self.info.known_hosts}",
                               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"nvidia@{host.address}", command],
                              capture_output=True, text=True, timeout=60)

    def down(self) -> None:
        import shutil

        from sparkctl.sandbox import cluster

        with _root(self.root):
            if cluster.down(self.name).ok:
                shutil.rmtree(self.root, ignore_errors=True)


class _root:
    def __init__(self, root: str):
        self.root = root

    def __enter__(self):
        self.previous = os.environ.get("SPARKCTL_SANDBOX_ROOT")
        os.environ["SPARKCTL_SANDBOX_ROOT"] = self.root

    def __exit__(self, *exc):
        if self.previous is None:
            os.environ.pop("SPARKCTL_SANDBOX_ROOT", None)
        else:
            os.environ["SPARKCTL_SANDBOX_ROOT"] = self.previous


@pytest.fixture(scope="module")
def bare():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    sandbox = Bare(sandbox_name("b", "bare hosts for setup"), 3)
    yield sandbox
    sandbox.down()


def checks_by_host(report: dict) -> dict[str, dict[str, dict]]:
    return {h["name"]: {c["id"]: c for c in h["checks"]} for h in report["hosts"]}


def statuses(doc: dict) -> dict[str, dict[str, str]]:
    return {h["name"]: {s["name"]: s["status"] for s in h["steps"]} for h in doc["hosts"]}


def test_bare_hosts_start_like_a_rack_and_doctor_names_each_gap(bare):
    head = bare.info.hosts[0]
    out = bare.ssh(head, "id -un; id -Gn; [ -w /var/lib/sparkctl ] && echo state-writable || echo no-state; "
                         "ip -j addr show; ibdev2netdev; ls ~/.ssh; docker info >/dev/null 2>&1 && echo docker || echo no-docker")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "nvidia" and "docker" not in lines[1].split() and lines[2] == "no-state"
    links = {link["ifname"]: link for link in json.loads(lines[3])}
    for twin in ("enp1s0f1np1", "enP2p1s0f1np1"):  # the cabled port's twins: no address, a fresh box's MTU
        assert links[twin]["mtu"] == 1500
        assert [a for a in links[twin]["addr_info"] if a["family"] == "inet"] == []
    assert [line for line in lines[4:8] if line.endswith("(Up)")] == [
        "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)", "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)"]
    assert lines[8:] == ["authorized_keys", "no-docker"]  # no key of its own: the hosts cannot reach each other

    result = bare.cli("--json", "doctor")
    assert result.code == 1
    checks = checks_by_host(json.loads(result.stdout))
    for name, by_id in checks.items():
        assert by_id["docker"]["status"] == "fail" and "permission denied" in by_id["docker"]["detail"]
        assert by_id["docker"]["setup"] == "docker_group,nvidia_runtime"
        assert by_id["state"]["status"] == "fail" and by_id["state"]["setup"] == "folders"
        assert by_id["rdma"]["status"] == "warn" and "mtu 1500" in by_id["rdma"]["detail"]
        assert by_id["rdma"]["setup"] == "fabric"
        assert by_id["gpu"]["setup"] == "" and by_id["checkpoint"]["setup"] == ""  # nothing setup can do
    head_checks = checks[head.name]
    assert head_checks["fabric"]["status"] == "fail" and head_checks["fabric"]["setup"] == "fabric"
    assert head_checks["peers"]["status"] == "warn" and head_checks["peers"]["setup"] == "ssh_mesh"
    human = bare.cli("doctor")
    assert "fix: `sparkctl setup` (folders)" in human.stdout


def test_distribute_from_a_host_fails_clearly_before_setup(bare):
    result = bare.cli("distribute", "--image", "sandbox", "--from", bare.info.hosts[0].name, timeout=300)
    assert result.code != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr  # one line
    assert "sparkctl setup" in result.stderr


def test_setup_fixes_every_gap_through_sudo_n_and_a_second_run_changes_nothing(bare):
    dry = bare.cli("--json", "setup", "--dry-run")
    assert dry.code == 0, dry.stderr
    assert {s for host in statuses(json.loads(dry.stdout)).values() for s in host.values()} == {"planned"}
    assert "docker" not in bare.ssh(bare.info.hosts[0], "id -Gn").stdout  # a dry run changes nothing

    started = time.monotonic()
    first = bare.cli("-v", "--json", "setup")
    seconds = time.monotonic() - started
    assert first.code == 0, first.stderr
    doc = json.loads(first.stdout)
    assert statuses(doc) == {h.name: {s: "changed" for s in SETUP_STEPS} for h in bare.info.hosts}, doc
    for host in doc["hosts"]:
        print(f"\n{host['name']}: " + ", ".join(f"{s['name']} {s['seconds']:.1f}s" for s in host["steps"]))
    print(f"setup of {len(doc['hosts'])} bare hosts: {seconds:.1f} s")
    echoed = [line for line in first.stderr.splitlines() if line.startswith("[spark-")]
    as_root = [line for line in echoed if re.search(r"\$ .*(usermod|install -d|ip link set|nvidia-ctk runtime|kill -HUP)", line)]
    assert len(as_root) >= 4 * len(bare.info.hosts)
    assert all(re.match(r"\[spark-\d\] \$ sudo -n -- ", line) for line in as_root), as_root
    assert not any("StrictHostKeyChecking=no" in line for line in echoed)

    second = bare.cli("--json", "setup")
    assert second.code == 0, second.stderr
    assert statuses(json.loads(second.stdout)) == {h.name: {s: "ok" for s in SETUP_STEPS} for h in bare.info.hosts}

    result = bare.cli("--json", "doctor")
    checks = checks_by_host(json.loads(result.stdout))
    for name, by_id in checks.items():
        failed = {cid: c["detail"] for cid, c in by_id.items() if c["status"] != "pass" and c["status"] != "skip"}
        assert set(failed) == {"checkpoint"}, (name, failed)  # no model yet: the checkpoint step's work, not setup's
    head = bare.info.hosts[0]
    mesh = bare.ssh(head, f"ssh -o BatchMode=yes {bare.info.hosts[2].fabric_address} hostname")  # pinned, not accepted
    assert mesh.returncode == 0 and mesh.stdout.strip() == "spark-3", mesh.stderr


def test_a_missing_bind_mounted_folder_is_created_as_the_user_so_a_second_setup_is_all_ok(bare, tmp_path):
    """A folder the containers bind-mount that does not exist yet (here the HF cache, in a folder the
    user can write) is created by setup as the user: left to Docker it would be root's, and the next
    look would call it not the user's."""
    inventory = yaml.safe_load(Path(bare.info.inventory).read_text())
    cache = f"{inventory['defaults']['nvme_path']}/hf-cache-{os.getpid()}/hub"
    moved = dict(inventory, paths=dict(inventory.get("paths") or {}, hf_cache=cache))
    path = tmp_path / "new-cache.yaml"
    path.write_text(yaml.safe_dump(moved))
    first = sparkctl("-i", str(path), "--json", "setup", timeout=300)
    assert first.code == 0, first.stderr
    assert statuses(json.loads(first.stdout)) == {
        h.name: {s: "changed" if s == "folders" else "ok" for s in SETUP_STEPS} for h in bare.info.hosts}
    for host in json.loads(first.stdout)["hosts"]:
        assert cache in {s["name"]: s for s in host["steps"]}["folders"]["reason"]
    for host in bare.info.hosts:
        owner = bare.ssh(host, f"stat -c %U {cache} {os.path.dirname(cache)}")
        assert owner.stdout.split() == ["nvidia", "nvidia"], owner
    second = sparkctl("-i", str(path), "--json", "setup", timeout=300)
    assert second.code == 0, second.stderr
    assert statuses(json.loads(second.stdout)) == {h.name: {s: "ok" for s in SETUP_STEPS} for h in bare.info.hosts}


def test_distribute_from_a_host_works_once_setup_has_run(bare, tmp_path):
    """The head builds, then sends to the others over the fabric with the hosts' own keys (ssh_mesh)."""
    from test_build_support import copy_chain

    folder = copy_chain(tmp_path / "sandbox")
    spec = folder / "chain.yaml"
    spec.write_text(spec.read_text().replace("    standin_engine: true", "    standin_engine: false"))  # a small image
    built = bare.cli("--json", "build", "--image", str(folder), "--on", "spark-1", timeout=600)
    assert built.code == 0, built.stderr[-2000:]
    image_id = json.loads(built.stdout)["image_id"]
    result = bare.cli("--json", "distribute", "--image", "sandbox", "--from", "spark-1", timeout=600)
    assert result.code == 0, result.stderr[-2000:]
    rows = {h["name"]: h for h in json.loads(result.stdout)["hosts"]}
    assert {rows[n]["status"] for n in ("spark-2", "spark-3")} == {"loaded"}, rows
    for host in bare.info.hosts:
        seen = bare.ssh(host, "docker image inspect -f '{{.Id}}' sparkctl-sandbox:latest")
        assert seen.stdout.strip() == image_id, (host.name, seen.stderr)


def test_doctor_warns_when_a_twin_is_left_out_of_hcas_and_render_uses_both(bare, tmp_path):
    inventory = yaml.safe_load(Path(bare.info.inventory).read_text())
    one = dict(inventory, defaults=dict(inventory["defaults"], hcas=["rocep1s0f1"]))
    path = tmp_path / "one-twin.yaml"
    path.write_text(yaml.safe_dump(one))
    result = sparkctl("-i", str(path), "--json", "doctor", timeout=300)
    rdma = checks_by_host(json.loads(result.stdout))["spark-1"]["rdma"]
    assert rdma["status"] == "warn" and "roceP2p1s0f1 Up but not in hcas" in rdma["detail"]
    rendered = bare.cli("render", "--profile", "sandbox", "--set", "tensor_parallel=3", "--out", str(tmp_path / "r"))
    assert rendered.code == 0, rendered.stderr
    env = (tmp_path / "r" / "spark-2" / "engine.env").read_text()
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in env.splitlines()
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1,enP2p1s0f1np1" in env.splitlines()


def test_hcas_up_puts_both_up_twins_in_nccl_ib_hca(bare, tmp_path):
    """`hcas: up`: serve asks each host what is Up (ibdev2netdev) and renders both twins."""
    inventory = yaml.safe_load(Path(bare.info.inventory).read_text())
    up = dict(inventory, defaults=dict(inventory["defaults"], hcas="up"))
    path = tmp_path / "hcas-up.yaml"
    path.write_text(yaml.safe_dump(up))
    plan = sparkctl("-i", str(path), "--json", "serve", "--profile", "sandbox", "--set", "tensor_parallel=3", "--dry-run",
                    timeout=300)
    assert plan.code == 0, plan.stderr
    for host in json.loads(plan.stdout)["hosts"]:
        assert host["env"]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1", host["env"]
        assert "--device" in host["docker_argv"] and "/dev/infiniband" in host["docker_argv"]


def test_password_sudo_stops_in_one_line_and_the_password_shows_nowhere(tmp_path):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    sandbox = Bare(sandbox_name("p", "password sudo"), 1, password_sudo=True)
    try:
        password = Path(sandbox.info.sudo_password_file).read_text().strip()
        refused = sandbox.cli("setup")
        assert refused.code == 1
        assert refused.stderr.strip() == "error: spark-1: sudo asks for a password; run again with --ask-become-pass"
        assert "docker" not in sandbox.ssh(sandbox.info.hosts[0], "id -Gn").stdout  # nothing changed

        seen_in_argv = []
        done = threading.Event()

        def watch_process_list():
            while not done.is_set():
                for pid in os.listdir("/proc"):
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as handle:
                            if password.encode() in handle.read():
                                seen_in_argv.append(pid)
                    except OSError:
                        pass
                time.sleep(0.02)

        watcher = threading.Thread(target=watch_process_list, daemon=True)
        watcher.start()
        try:
            code, output = _with_terminal([sys.executable, "-m", "sparkctl", "-i", sandbox.info.inventory, "-v", "setup",
                                           "--ask-become-pass"], password)
        finally:
            done.set()
            watcher.join()
        assert code == 0, output
        assert "sudo -k -S -p '' -- usermod" in output and password not in output
        assert seen_in_argv == []
        leaked = [str(p) for p in Path(sandbox.info.root).rglob("*")
                  if p.is_file() and p.name != "sudo_password" and p.stat().st_size < 1 << 20
                  and password.encode() in p.read_bytes()]
        assert leaked == []
        assert "docker" in sandbox.ssh(sandbox.info.hosts[0], "id -Gn").stdout
    finally:
        sandbox.down()


def _with_terminal(argv: list[str], password: str) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal, typing ``password`` at its prompt; (exit code, all it printed)."""
    import pty

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    buffer, typed = b"", False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        buffer += data
        if not typed and b"password" in buffer:
            os.write(fd, (password + "\n").encode())
            typed = True
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), buffer.decode(errors="replace")


def test_up_goes_from_bare_hosts_to_a_smoke_tested_endpoint_as_nvidia(tmp_path):
    """The whole first hour in one command: setup, doctor, checkpoint, build, distribute, engram, serve, smoke."""
    from sparkctl.engram.checkpoint_maker import make_checkpoint

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    sandbox = Bare(sandbox_name("e", "up from bare hosts"), 3)
    try:
        source = make_checkpoint(str(tmp_path / "ckpt"), vocab_size=64).path
        profile = ["--profile", "sandbox", "--set", "tensor_parallel=3"]
        refused = sandbox.cli("--json", "up", *profile, "--model-source", source, "--no-setup")
        assert refused.code == 1
        doc = json.loads(refused.stdout)
        assert doc["steps"][0]["name"] == "setup" and doc["steps"][0]["status"] == "failed"
        assert "--no-setup" in doc["steps"][0]["reason"] and "docker_group" in doc["steps"][0]["reason"]

        started = time.monotonic()
        result = sandbox.cli("--json", "up", *profile, "--model-source", source, timeout=1500)
        seconds = time.monotonic() - started
        assert result.code == 0, result.stderr[-3000:]
        doc = json.loads(result.stdout)
        steps = {s["name"]: s for s in doc["steps"]}
        assert [s["name"] for s in doc["steps"]][0] == "setup"
        assert {n: s["status"] for n, s in steps.items()} == {
            "setup": "changed", "doctor": "ok", "checkpoint": "changed", "build": "changed", "distribute": "changed",
            "engram": "changed", "serve": "changed", "smoke": "ok"}, doc
        print(f"\nbare to endpoint: {seconds:.1f} s; " + ", ".join(f"{n} {s['seconds']:.1f}s" for n, s in steps.items()))
        head = sandbox.info.hosts[0]
        owner = sandbox.ssh(head, "stat -c %U /var/lib/sparkctl/sandbox /mnt/nvme/models/DeepSeek-V4.1-Flash/config.json")
        assert owner.stdout.split() == ["nvidia", "nvidia"], owner  # everything the run wrote is the user's
        again = sandbox.cli("--json", "up", *profile, "--model-source", source, timeout=900)
        assert again.code == 0, again.stderr[-2000:]
        assert {s["name"]: s["status"] for s in json.loads(again.stdout)["steps"]}["setup"] == "ok"
    finally:
        sandbox.down()
