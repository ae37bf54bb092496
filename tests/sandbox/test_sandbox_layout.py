"""The sandbox's pure half: names, addresses, inventory text, stand-in values. No root needed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from sparkctl.sandbox import layout as L
from sparkctl.sandbox import standins


def test_plan_addresses_names_and_interface_lengths():
    sb = L.plan("default", 4, root="/var/lib/sparkctl/sandbox")
    assert sb.root == "/var/lib/sparkctl/sandbox/default"
    assert [h.name for h in sb.hosts] == ["spark-1", "spark-2", "spark-3", "spark-4"]
    assert [h.address for h in sb.hosts] == ["10.231.0.11", "10.231.0.12", "10.231.0.13", "10.231.0.14"]
    assert [h.fabric_address for h in sb.hosts] == ["10.232.0.11", "10.232.0.12", "10.232.0.13", "10.232.0.14"]
    assert sb.control_address == "10.231.0.1"
    assert sb.blackhole_address == "10.231.0.250"
    assert sb.hosts[0].netns == "sparkctl-default-spark-1"
    assert sb.hosts[0].docker_socket == "/var/lib/sparkctl/sandbox/default/hosts/spark-1/run/docker.sock"
    # "default" is too long for a tag: a stable 6-character hash stands in.
    assert sb.tag == L.interface_tag("default") and len(sb.tag) == 6 and sb.tag != "defaul"
    big = L.plan("a-rather-long-sandbox-name", L.MAX_HOSTS, root="/x")
    names = [big.bridge_mgmt, big.bridge_fabric]
    for h in big.hosts:
        names += [h.veth_mgmt, h.veth_fabric, L.peer_name(h.veth_mgmt), L.peer_name(h.veth_fabric)]
    assert max(len(n) for n in names) <= 15
    assert len(set(names)) == len(names)


def test_short_names_are_their_own_tag():
    sb = L.plan("ci7", 1, root="/x")
    assert (sb.tag, sb.bridge_mgmt, sb.hosts[0].veth_fabric) == ("ci7", "spkci7m", "spkci7f1")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="Bad_Name", hosts=1), "not valid"),
        (dict(name="ok", hosts=0), "between 1 and"),
        (dict(name="ok", hosts=L.MAX_HOSTS + 1), "between 1 and"),
        (dict(name="ok", hosts=1, mgmt_subnet="10.1.0.0/24", fabric_subnet="10.1.0.0/16"), "overlap"),
        (dict(name="ok", hosts=1, mgmt_subnet="10.1.0.0/25"), "smaller than a /24"),
        (dict(name="ok", hosts=1, mgmt_subnet="10.1.0.7/24"), "not a network address"),
        (dict(name="ok", hosts=1, fabric_subnet="fd00::/64"), "only IPv4"),
    ],
)
def test_plan_refuses_bad_requests(kwargs, message):
    with pytest.raises(L.LayoutError, match=message):
        L.plan(root="/x", **kwargs)


def test_other_subnets():
    sb = L.plan("lab", 2, root="/x", mgmt_subnet="192.168.77.0/24", fabric_subnet="172.30.0.0/16")
    assert [h.address for h in sb.hosts] == ["192.168.77.11", "192.168.77.12"]
    assert [h.fabric_address for h in sb.hosts] == ["172.30.0.11", "172.30.0.12"]


def test_inventory_has_exactly_the_agreed_shape():
    sb = L.plan("default", 2, root="/var/lib/sparkctl/sandbox")
    assert yaml.safe_load(L.render_inventory(sb)) == {
        "cluster": "sandbox-default",
        "known_hosts": "/var/lib/sparkctl/sandbox/default/known_hosts",
        "defaults": {
            "ssh": {"user": "nvidia", "port": 22, "identity_file": "/var/lib/sparkctl/sandbox/default/id_ed25519"},
            "nvme_path": "/mnt/nvme",
            "fabric_interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"],
            "hcas": ["rocep1s0f1", "roceP2p1s0f1"],
            "fabric_subnet": "10.232.0.0/24",
        },
        "paths": {
            "model_dir": "/mnt/nvme/models/DeepSeek-V4.1-Flash",
            "engram_dir": "/mnt/nvme/engram",
            "hf_cache": "/mnt/nvme/hf-cache",
        },
        "hosts": [
            {"name": "spark-1", "address": "10.231.0.11", "role": "head", "fabric_addresses": ["10.232.0.11", "10.232.0.111"]},
            {"name": "spark-2", "address": "10.231.0.12", "fabric_addresses": ["10.232.0.12", "10.232.0.112"]},
        ],
    }


def test_inventory_quotes_unusual_paths():
    sb = L.plan("q", 1, root="/tmp/odd dir: yes")
    doc = yaml.safe_load(L.render_inventory(sb))
    assert doc["known_hosts"] == "/tmp/odd dir: yes/q/known_hosts"
    assert doc["defaults"]["ssh"]["identity_file"] == "/tmp/odd dir: yes/q/id_ed25519"


def test_inventory_passes_the_config_loader(tmp_path):
    from sparkctl.config.inventory import load_inventory

    sb = L.plan("default", 3, root=str(tmp_path))
    path = tmp_path / "inventory.yaml"
    path.write_text(L.render_inventory(sb))
    inv = load_inventory(str(path))
    assert [(h.name, h.role, h.address, h.fabric_addresses) for h in inv.hosts] == [
        ("spark-1", "head", "10.231.0.11", ("10.232.0.11", "10.232.0.111")),
        ("spark-2", "worker", "10.231.0.12", ("10.232.0.12", "10.232.0.112")),
        ("spark-3", "worker", "10.231.0.13", ("10.232.0.13", "10.232.0.113")),
    ]
    assert inv.hosts[1].identity_file == str(tmp_path / "default" / "id_ed25519")
    assert inv.hosts[1].ssh_user == "nvidia"  # an ordinary user, as DGX OS; root only through sudo
    assert inv.hosts[1].fabric_interfaces == ("enp1s0f1np1", "enP2p1s0f1np1")  # both twins of the cabled port
    assert inv.model.known_hosts == str(tmp_path / "default" / "known_hosts")


def test_state_round_trip():
    sb = L.plan("rt", 2, root="/x", mgmt_subnet="10.9.0.0/24", fabric_subnet="10.10.0.0/24")
    assert L.SandboxLayout.from_state(sb.to_state()) == sb
    bad = sb.to_state() | {"version": 99}
    with pytest.raises(L.LayoutError, match="version"):
        L.SandboxLayout.from_state(bad)


def test_standin_env_round_trip_and_gpu_uuid():
    values = dict(standins.GB10_DEFAULTS, SPARK_GPU_UUID=standins.gpu_uuid("default/spark-1"))
    assert standins.parse_env(standins.render_env(values)) == values
    assert standins.gpu_uuid("a/spark-1") != standins.gpu_uuid("a/spark-2")
    assert standins.gpu_uuid("a/spark-1").startswith("GPU-") and len(standins.gpu_uuid("x")) == 40


@pytest.fixture
def standin_dir(tmp_path):
    for name, text in standins.scripts("/usr/sbin/runc").items():
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o755)
    values = dict(standins.GB10_DEFAULTS, SPARK_GPU_UUID="GPU-11111111-2222-3333-4444-555555555555")
    (tmp_path / standins.ENV_FILE).write_text(standins.render_env(values))
    return tmp_path


def _sh(path, *args):
    return subprocess.run([str(path), *args], capture_output=True, text=True)


def test_nvidia_smi_standin_queries(standin_dir):
    smi = standin_dir / "nvidia-smi"
    out = _sh(smi, "--query-gpu=name,driver_version,compute_cap,memory.total,uuid", "--format=csv,noheader")
    assert (out.returncode, out.stdout) == (
        0, "NVIDIA GB10, 580.95.05, 12.1, [N/A], GPU-11111111-2222-3333-4444-555555555555\n")
    out = _sh(smi, "--query-gpu=name, memory.total,power.draw", "--format=csv")
    assert out.stdout == "name, memory.total [MiB], power.draw [W]\nNVIDIA GB10, [N/A], 4.73 W\n"
    out = _sh(smi, "--query-gpu=power.draw,utilization.gpu", "--format=csv,noheader,nounits")
    assert out.stdout == "4.73, 0\n"
    out = _sh(smi, "--query-gpu=bogus", "--format=csv")
    assert (out.returncode, out.stdout) == (2, 'Field "bogus" is not a valid field to query.\n')
    assert _sh(smi, "-L").stdout == "GPU 0: NVIDIA GB10 (UUID: GPU-11111111-2222-3333-4444-555555555555)\n"


def test_nvidia_smi_standin_table_is_aligned(standin_dir):
    out = _sh(standin_dir / "nvidia-smi")
    lines = out.stdout.splitlines()
    assert out.returncode == 0
    assert "Driver Version: 580.95.05" in out.stdout and "CUDA Version: 13.0" in out.stdout
    assert any("NVIDIA GB10" in line for line in lines)
    assert {len(line) for line in lines[1:] if line} == {91}


def test_nvidia_smi_standin_can_fail_like_a_missing_driver(standin_dir):
    env_file = standin_dir / standins.ENV_FILE
    values = standins.parse_env(env_file.read_text()) | {"SPARK_NVSMI_FAIL": "1"}
    env_file.write_text(standins.render_env(values))
    out = _sh(standin_dir / "nvidia-smi")
    assert out.returncode == 9 and "couldn't communicate with the NVIDIA driver" in out.stdout


def test_ibdev2netdev_standin_lists_the_four_ports(standin_dir):
    out = _sh(standin_dir / "ibdev2netdev")
    lines = out.stdout.splitlines()
    assert [line.split(" ==> ")[0] for line in lines] == [
        "rocep1s0f0 port 1", "rocep1s0f1 port 1", "roceP2p1s0f0 port 1", "roceP2p1s0f1 port 1"]
    # This machine has no enp1s0f1np1, so the port is Down here (inside a sandbox host it is Up).
    assert lines[1] == "rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)"


def test_cli_refuses_without_root_in_one_line(monkeypatch):
    from typer.testing import CliRunner

    from sparkctl.sandbox.cli import app

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for argv in (["up"], ["status", "--json"], ["down", "--name", "x"]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2, result.output
        text = (result.stderr if hasattr(result, "stderr") else result.output).strip()
        assert len(text.splitlines()) == 1 and "needs root" in text


def test_cli_help_is_import_light():
    code = (
        "import sys, sparkctl.sandbox.cli\n"
        "heavy = [m for m in ('paramiko', 'docker', 'httpx', 'jinja2', 'rich', 'sparkctl.sandbox.cluster') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_a_pidfile_not_yet_written_is_waited_for_not_taken_for_a_dead_dockerd(tmp_path, monkeypatch):
    """dockerd creates its pidfile, then writes the PID: an empty file means "starting", not "exited"."""
    import subprocess
    import threading

    from sparkctl.sandbox import cluster, layout, procs

    host = layout.plan("pidtest", 1, root=str(tmp_path)).hosts[0]
    os.makedirs(os.path.dirname(host.pidfile("dockerd")), exist_ok=True)
    open(host.pidfile("dockerd"), "w").close()  # created, still empty
    daemon = subprocess.Popen(["sleep", "30"], env={"PATH": "/usr/bin:/bin", procs.MARKER_ENV: host.dir})
    monkeypatch.setattr(cluster, "docker_ping", lambda socket_path: True)
    writer = threading.Timer(0.5, lambda: open(host.pidfile("dockerd"), "w").write(str(daemon.pid)))
    writer.start()
    try:
        assert cluster._wait_dockerd(host, timeout=10) == daemon.pid
    finally:
        writer.cancel()
        daemon.kill()
        daemon.wait()
    # A pidfile naming a process that is gone is still "exited", at once.
    with pytest.raises(cluster.SandboxError, match="dockerd exited"):
        cluster._wait_dockerd(host, timeout=10)
