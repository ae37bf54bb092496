"""Doctor's probes and verdicts on captured real output (no hosts needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.commands import probes
from sparkctl.ops.doctor import verdicts as v

CAPTURED = Path(__file__).parent / "data" / "captured"


def captured(name: str) -> str:
    return (CAPTURED / name).read_text()


def test_gb10_gpu_passes_and_other_gpus_fail():
    gpus = probes.parse_gpus(captured("gb10-nvidia-smi-query.txt"))
    assert gpus[0].name == "NVIDIA GB10" and gpus[0].compute_cap == "12.1" and gpus[0].driver == "580.95.05"
    assert v.check_gpu(gpus).status == "pass"
    h100 = probes.parse_gpus("NVIDIA H100 80GB HBM3, 550.54.15, 9.0, 81559 MiB\n")
    assert v.check_gpu(h100).status == "fail"


def test_gpu_parser_refuses_garbage():
    with pytest.raises(probes.ProbeError):
        probes.parse_gpus("")
    with pytest.raises(probes.ProbeError):
        probes.parse_gpus("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_docker_info_from_debian_docker_io():
    info = probes.parse_docker_info(captured("docker-info-20.10-debian12.json"))
    assert info.server_version.startswith("20.10")
    assert info.storage_driver == "overlay2"
    assert "runc" in info.runtimes and not info.containerd_snapshotter
    # no nvidia runtime: a profile that needs GPUs fails, a plain check warns
    assert v.check_docker(info, needs_nvidia=True).status == "fail"
    assert v.check_docker(info, needs_nvidia=False).status == "warn"


def test_docker_info_with_nvidia_runtime_and_containerd_store():
    data = json.loads(captured("docker-info-20.10-debian12.json"))
    data["Runtimes"]["nvidia"] = {"path": "nvidia-container-runtime"}
    data["DriverStatus"] = [["driver-type", "io.containerd.snapshotter.v1"]]
    info = probes.parse_docker_info(json.dumps(data))
    assert info.containerd_snapshotter
    assert v.check_docker(info, needs_nvidia=True).status == "pass"


def test_docker_info_without_engine():
    with pytest.raises(probes.ProbeError, match="Cannot connect"):
        probes.parse_docker_info(json.dumps({"ServerErrors": ["Cannot connect to the Docker daemon at unix:///var/run/docker.sock"]}))


def test_ulimits_of_this_machine_are_below_what_tp8_asks():
    limits = probes.parse_ulimits(captured("ulimits-debian12.txt"))
    assert limits["memlock"] == probes.Limit(8192 * 1024, 8192 * 1024)
    assert limits["nofile"] == probes.Limit(20000, 20000)
    assert limits["stack"].hard == -1
    wanted = {"memlock": (-1, -1), "nofile": (1048576, 1048576), "stack": (67108864, 67108864)}
    result = v.check_ulimits(limits, wanted)
    assert result.status == "fail"
    assert "memlock" in result.detail and "nofile" in result.detail and "stack" not in result.detail
    assert "limits.conf" in result.hint
    lowered = {"memlock": (8388608, 8388608), "nofile": (20000, 20000)}
    assert v.check_ulimits(limits, lowered).status == "pass"


def test_rdma_and_mtu_on_a_spark():
    ports = probes.parse_ibdev2netdev(captured("gb10-ibdev2netdev.txt"))
    links = probes.parse_links(captured("gb10-ip-link.txt"))
    assert links["enp1s0f0np0"] == probes.Link("enp1s0f0np0", 9000, True)
    assert not links["enp1s0f1np1"].up
    assert v.check_rdma(ports, links, ("rocep1s0f0", "roceP2p1s0f0"), ("enp1s0f0np0",)).status == "pass"
    # The cabled port's second RoCE twin is Up too: naming one HCA halves the fabric
    half = v.check_rdma(ports, links, ("rocep1s0f0",), ("enp1s0f0np0",))
    assert half.status == "warn" and "roceP2p1s0f0 Up but not in hcas" in half.detail
    assert "hcas: up" in half.hint
    every = v.check_rdma(ports, links, (), ("enp1s0f0np0",), hcas_up=True)
    assert every.status == "pass" and "rocep1s0f0->enp1s0f0np0, roceP2p1s0f0->enP2p1s0f0np0" in every.detail
    down = v.check_rdma(ports, links, ("rocep1s0f1",), ("enp1s0f1np1",))
    assert down.status == "fail" and "rocep1s0f1 down" in down.detail
    missing = v.check_rdma(ports, links, ("mlx5_9",), ("enp1s0f0np0",))
    assert missing.status == "fail" and "mlx5_9 missing" in missing.detail


def test_mtu_1500_on_fabric_is_a_warning():
    links = probes.parse_links(captured("ip-link-debian12.txt"))
    assert links["eth0"].mtu == 1400
    ports = [probes.RdmaPort("rocep1s0f0", 1, "eth0", True)]
    result = v.check_rdma(ports, links, ("rocep1s0f0",), ("eth0",))
    assert result.status == "warn" and "mtu 1400 (expected 9000)" in result.detail


def test_disk_memory_ports_from_this_machine():
    disk = probes.parse_df(captured("df-debian12.txt"))
    assert disk.mountpoint == "/" and disk.available > 0
    assert v.check_disk(disk, disk.available + 1, "/mnt/nvme").status == "fail"
    assert v.check_disk(disk, disk.available - 1, "/mnt/nvme").status == "pass"
    mem = probes.parse_meminfo(captured("meminfo-debian12.txt"))
    assert mem["MemTotal"] >= mem["MemAvailable"] > 0
    assert v.check_memory(mem, budget_gb=mem["MemAvailable"] / 1e9 + 1).status == "fail"
    assert v.check_memory(mem, budget_gb=1).status == "pass"
    ports = probes.parse_listening_ports(captured("ss-htln-debian12.txt") + "LISTEN 0 4096 [::]:8000 [::]:*\n")
    assert {2024, 8000} <= ports
    taken = v.check_ports(ports, {"serving port": 8000, "rendezvous port": 29500})
    assert taken.status == "fail" and "serving port 8000" in taken.detail and "29500" not in taken.detail


def test_checkpoint_verdicts():
    complete = probes.parse_checkpoint(json.dumps({"dir": True, "config": True, "index": True, "files": {"a.safetensors": 10, "b.safetensors": 20}}))
    assert v.check_checkpoint(complete, "/m").status == "pass"
    partial = probes.parse_checkpoint(json.dumps({"dir": True, "config": True, "index": True, "files": {"a.safetensors": 10, "b.safetensors": None}}))
    result = v.check_checkpoint(partial, "/m")
    assert result.status == "fail" and "b.safetensors" in result.detail
    absent = probes.parse_checkpoint(json.dumps({"dir": False, "config": False, "index": None, "files": {}}))
    assert "does not exist" in v.check_checkpoint(absent, "/m").detail


def test_cross_host_checks_name_the_odd_host():
    drivers = v.check_same("driver", {"a": "580.95.05", "b": "580.95.05", "c": "575.51.03"}, "driver", "same driver")
    assert drivers["c"].status == "fail" and "575.51.03" in drivers["c"].detail
    assert drivers["a"].status == drivers["b"].status == "pass"
    clocks = v.check_clock({"a": 0.01, "b": -0.02, "c": 7.5})
    assert clocks["c"].status == "fail" and clocks["a"].status == "pass"
    assert v.check_clock({"a": 0.0, "b": 0.9, "c": 0.0})["b"].status == "warn"


def test_probe_argv_keep_user_values_out_of_shell_text():
    path = "/mnt/nvme dir;reboot"
    argv = probes.disk_argv(path)
    assert argv[-1] == path and path not in argv[2]
    assert probes.tcp_reach_argv("10.0.0.2", 22)[-2:] == ["10.0.0.2", "22"]
    assert probes.checkpoint_argv("/m x")[-1] == "/m x"


def test_state_dir_verdicts():
    assert probes.parse_state_dir("writable\n") == "writable"
    with pytest.raises(probes.ProbeError):
        probes.parse_state_dir("sh: 1: dirname: not found")
    assert v.check_state_dir("creatable", "/var/lib/sparkctl", "nvidia").status == "pass"
    denied = v.check_state_dir("denied", "/var/lib/sparkctl", "nvidia")
    assert denied.status == "fail" and denied.hint == "once, as root on the host: install -d -o nvidia /var/lib/sparkctl"


def test_state_dir_probe_as_a_normal_user(tmp_path):
    """Run the probe's own shell script here: an existing writable folder, a missing one under a writable
    parent, and as an unprivileged user (root may write anywhere) a read-only folder and a missing one
    under a parent it cannot write."""
    import os
    import subprocess

    def answer(path, as_nobody=False):
        demote = (lambda: os.setuid(65534)) if as_nobody and os.geteuid() == 0 else None
        return subprocess.run(probes.state_dir_argv(str(path)), capture_output=True, text=True, check=True,
                              preexec_fn=demote).stdout.strip()

    assert answer(tmp_path) == "writable"
    assert answer(tmp_path / "new") == "creatable"
    if os.geteuid() == 0:
        assert answer("/etc", as_nobody=True) == "read-only"
        assert answer("/etc/sparkctl-never", as_nobody=True) == "denied"


def test_rdma_devices_for_the_container():
    devices = probes.parse_rdma_devices("rdma_cm\nuverbs0\nuverbs1\n")
    assert v.check_rdma_devices(devices, ("rocep1s0f0", "roceP2p1s0f0"), False, 2).status == "pass"
    none = v.check_rdma_devices(probes.parse_rdma_devices(""), ("rocep1s0f0",), False, 2)
    assert none.status == "fail" and "No device found" in none.detail and "ib_uverbs" in none.hint
    short = v.check_rdma_devices(["rdma_cm", "uverbs0"], (), True, 2)
    assert short.status == "fail" and "1 verbs device(s) for 2 HCA(s)" in short.detail
    assert v.check_rdma_devices([], (), False, 2).status == "skip"
