"""``top``'s view of one host in ONE remote command: the GB10 (nvidia-smi), CPU, RAM and NVMe throughput.

CPU busy and NVMe bytes/s are rates: the command reads /proc/stat and /proc/diskstats twice,
``interval_s`` apart, so one call gives them (no state kept between refreshes). A DGX Spark's GB10
shares its memory with the CPU (nvidia-smi says ``[N/A]`` for memory.used and memory.total), so its
memory is the host's: MemTotal - MemAvailable of /proc/meminfo.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Optional

from sparkctl.commands.probes import ProbeError, parse_meminfo

GPU_FIELDS = "name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
MARK = "@@sparkctl-top:"
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size
_NVME_DISK = re.compile(r"^nvme\d+n\d+\Z")  # whole namespaces, not their partitions (nvme0n1p1)


def host_probe_argv(interval_s: float = 1.0) -> list[str]:
    script = (
        f'echo "{MARK}gpu"; nvidia-smi --query-gpu={GPU_FIELDS} --format=csv,noheader,nounits 2>&1; '
        f'echo "{MARK}gpu-exit $?"; '
        f'echo "{MARK}sample1"; head -n 1 /proc/stat; cat /proc/diskstats; sleep "$1"; '
        f'echo "{MARK}sample2"; head -n 1 /proc/stat; cat /proc/diskstats; '
        f'echo "{MARK}meminfo"; cat /proc/meminfo; echo "{MARK}loadavg"; cat /proc/loadavg'
    )
    return ["sh", "-c", script, "top", f"{interval_s:g}"]


@dataclass
class HostSample:
    gpu_name: Optional[str] = None
    gpu_util_pct: Optional[float] = None
    gpu_temp_c: Optional[float] = None
    gpu_power_w: Optional[float] = None
    gpu_memory_used_bytes: Optional[int] = None
    gpu_memory_total_bytes: Optional[int] = None
    gpu_memory_unified: bool = False
    gpu_error: Optional[str] = None
    cpu_busy_pct: Optional[float] = None
    ram_used_bytes: Optional[int] = None
    ram_total_bytes: Optional[int] = None
    load1: Optional[float] = None
    nvme_devices: tuple[str, ...] = ()
    nvme_read_bytes_per_s: Optional[float] = None
    nvme_write_bytes_per_s: Optional[float] = None

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["nvme_devices"] = list(self.nvme_devices)
        return doc


def _sections(stdout: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith(MARK):
            current, _, rest = line[len(MARK):].partition(" ")
            sections[current] = [rest] if rest else []
        elif current is not None:
            sections[current].append(line)
    return sections


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_cpu_line(line: str) -> tuple[int, int]:
    """(busy, total) jiffies of /proc/stat's first line; idle and iowait are not busy."""
    parts = line.split()
    if not parts or parts[0] != "cpu" or len(parts) < 5:
        raise ProbeError(f"unexpected /proc/stat line: {line!r}")
    values = [int(v) for v in parts[1:9]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def parse_nvme_sectors(lines: list[str]) -> dict[str, tuple[int, int]]:
    """{nvme device: (sectors read, sectors written)} from /proc/diskstats lines."""
    out = {}
    for line in lines:
        parts = line.split()
        if len(parts) >= 10 and _NVME_DISK.match(parts[2]):
            out[parts[2]] = (int(parts[5]), int(parts[9]))
    return out


def parse_host_probe(stdout: str, interval_s: float = 1.0) -> HostSample:
    sections = _sections(stdout)
    for needed in ("sample1", "sample2", "meminfo"):
        if not sections.get(needed):
            raise ProbeError(f"the host probe printed no {needed} section")
    sample = HostSample()

    gpu_lines = [ln for ln in sections.get("gpu", []) if ln.strip()]
    gpu_exit = (sections.get("gpu-exit") or ["1"])[0].strip()
    if gpu_exit == "0" and gpu_lines:
        parts = [p.strip() for p in gpu_lines[0].split(",")]
        if len(parts) == 6:
            sample.gpu_name = parts[0]
            sample.gpu_util_pct, used, total, sample.gpu_temp_c, sample.gpu_power_w = (_number(p) for p in parts[1:])
            if used is not None and total is not None:
                sample.gpu_memory_used_bytes, sample.gpu_memory_total_bytes = int(used * 2**20), int(total * 2**20)
        else:
            sample.gpu_error = f"unexpected nvidia-smi line: {gpu_lines[0][:120]!r}"
    else:
        sample.gpu_error = (gpu_lines[0] if gpu_lines else f"nvidia-smi exited {gpu_exit}")[:160]

    first, second = sections["sample1"], sections["sample2"]
    busy1, total1 = parse_cpu_line(first[0])
    busy2, total2 = parse_cpu_line(second[0])
    if total2 > total1:
        sample.cpu_busy_pct = 100.0 * (busy2 - busy1) / (total2 - total1)
    disks1, disks2 = parse_nvme_sectors(first[1:]), parse_nvme_sectors(second[1:])
    devices = sorted(set(disks1) & set(disks2))
    if devices and interval_s > 0:
        sample.nvme_devices = tuple(devices)
        sample.nvme_read_bytes_per_s = sum(disks2[d][0] - disks1[d][0] for d in devices) * SECTOR_BYTES / interval_s
        sample.nvme_write_bytes_per_s = sum(disks2[d][1] - disks1[d][1] for d in devices) * SECTOR_BYTES / interval_s

    memory = parse_meminfo("\n".join(sections["meminfo"]))
    sample.ram_total_bytes = memory.get("MemTotal")
    if sample.ram_total_bytes is not None:
        sample.ram_used_bytes = sample.ram_total_bytes - memory["MemAvailable"]
    if sample.gpu_name is not None and sample.gpu_memory_total_bytes is None:
        # GB10: one pool of LPDDR5x for CPU and GPU; what the host uses is what the GPU can no longer have
        sample.gpu_memory_unified = True
        sample.gpu_memory_used_bytes, sample.gpu_memory_total_bytes = sample.ram_used_bytes, sample.ram_total_bytes
    load = sections.get("loadavg") or []
    if load and load[0].split():
        sample.load1 = _number(load[0].split()[0])
    return sample
