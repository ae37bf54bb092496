"""top's host probe: one shell command, run here for real (sh, /proc, the sandbox's stand-in nvidia-smi), and its parser."""

from __future__ import annotations

import os
import subprocess

import pytest

from sparkctl.commands.host_probe import (MARK, ProbeError, host_probe_argv, parse_cpu_line, parse_host_probe,
                                          parse_nvme_sectors)
from sparkctl.sandbox.standins import NVIDIA_SMI


def run_probe(tmp_path, interval: float = 0.3, smi: str | None = NVIDIA_SMI, host_env: str = "") -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / ".sandbox-host.env").write_text(host_env)  # the stand-in's per-host values
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text(smi)
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    proc = subprocess.run(host_probe_argv(interval), capture_output=True, text=True, env=env, timeout=30)
    return proc.stdout


def test_one_command_reads_gb10_cpu_ram(tmp_path):
    sample = parse_host_probe(run_probe(tmp_path), 0.3)
    # the stand-in prints what a GB10 prints: name, 0 %, memory [N/A] (unified), 42 C, 4.73 W
    assert sample.gpu_error is None and sample.gpu_name == "NVIDIA GB10"
    assert sample.gpu_util_pct == 0 and sample.gpu_temp_c == 42 and sample.gpu_power_w == pytest.approx(4.73)
    assert sample.gpu_memory_unified and sample.gpu_memory_total_bytes == sample.ram_total_bytes
    with open("/proc/meminfo") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    assert sample.ram_total_bytes == total_kb * 1024 and 0 < sample.ram_used_bytes < sample.ram_total_bytes
    assert sample.cpu_busy_pct is not None and 0 <= sample.cpu_busy_pct <= 100
    assert sample.load1 is not None
    assert sample.to_json()["gpu_name"] == "NVIDIA GB10"


def test_without_nvidia_smi_the_rest_still_reads(tmp_path):
    sample = parse_host_probe(run_probe(tmp_path, smi=None), 0.3)
    assert sample.gpu_name is None and "nvidia-smi" in sample.gpu_error
    assert sample.ram_total_bytes and sample.cpu_busy_pct is not None
    sample = parse_host_probe(run_probe(tmp_path, host_env="SPARK_NVSMI_FAIL=1\n"), 0.3)  # driver not loaded
    assert sample.gpu_name is None and "couldn't communicate with the NVIDIA driver" in sample.gpu_error


DISKSTATS_1 = """ 259       0 nvme0n1 1000 0 80000 500 2000 0 160000 900 0 1200 1400 0 0 0 0
 259       1 nvme0n1p1 900 0 70000 400 1900 0 150000 800 0 1100 1200 0 0 0 0
   7       0 loop0 5 0 10 0 0 0 0 0 0 0 0 0 0 0 0
 259       2 nvme1n1 10 0 800 1 20 0 1600 2 0 3 3 0 0 0 0"""
DISKSTATS_2 = """ 259       0 nvme0n1 1100 0 100480 520 2100 0 180480 950 0 1300 1500 0 0 0 0
 259       1 nvme0n1p1 1000 0 90480 420 2000 0 170480 850 0 1200 1300 0 0 0 0
   7       0 loop0 5 0 10 0 0 0 0 0 0 0 0 0 0 0 0
 259       2 nvme1n1 10 0 2848 1 20 0 1600 2 0 3 3 0 0 0 0"""


def canned(gpu: str = "NVIDIA GB10, 87, [N/A], [N/A], 61, 35.20", gpu_exit: int = 0) -> str:
    return "\n".join([
        f"{MARK}gpu", gpu, f"{MARK}gpu-exit {gpu_exit}",
        f"{MARK}sample1", "cpu  1000 0 1000 8000 0 0 0 0 0 0", DISKSTATS_1,
        f"{MARK}sample2", "cpu  1300 0 1300 8300 100 0 0 0 0 0", DISKSTATS_2,
        f"{MARK}meminfo", "MemTotal:       128000000 kB", "MemFree:         1000000 kB", "MemAvailable:   28000000 kB",
        f"{MARK}loadavg", "3.50 2.00 1.00 4/900 12345",
    ]) + "\n"


def test_rates_from_the_two_samples():
    sample = parse_host_probe(canned(), interval_s=2.0)
    assert sample.cpu_busy_pct == pytest.approx(100 * 600 / 1000)  # iowait is not busy
    # whole namespaces only (nvme0n1p1 is inside nvme0n1; loop0 is not NVMe): 20480 + 2048 sectors read in 2 s
    assert sample.nvme_devices == ("nvme0n1", "nvme1n1")
    assert sample.nvme_read_bytes_per_s == pytest.approx((20480 + 2048) * 512 / 2.0)
    assert sample.nvme_write_bytes_per_s == pytest.approx(20480 * 512 / 2.0)
    assert sample.gpu_util_pct == 87 and sample.gpu_power_w == pytest.approx(35.2)
    assert sample.gpu_memory_unified and sample.gpu_memory_used_bytes == (128000000 - 28000000) * 1024
    assert sample.load1 == 3.5


def test_a_gpu_with_its_own_memory_keeps_it():
    sample = parse_host_probe(canned("NVIDIA H100, 50, 1024, 81559, 40, 300"), 1.0)
    assert not sample.gpu_memory_unified and sample.gpu_memory_used_bytes == 1024 * 2**20


def test_broken_output_is_one_clear_error():
    with pytest.raises(ProbeError, match="sample2"):
        parse_host_probe(canned().split(f"{MARK}sample2")[0])
    with pytest.raises(ProbeError):
        parse_cpu_line("intr 1 2 3")
    assert parse_nvme_sectors(["garbage"]) == {}
    odd = parse_host_probe(canned("something, else"), 1.0)
    assert odd.gpu_name is None and "unexpected nvidia-smi line" in odd.gpu_error
