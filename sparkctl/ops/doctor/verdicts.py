"""Verdicts: facts about a host (and what the profile needs) -> pass / warn / fail, with a fix hint.

Pure functions. Per-host verdicts look at one host; cross-host verdicts compare all of them
(driver versions, storage drivers, image IDs, clocks) and name the odd ones out.
"""

from __future__ import annotations

import shlex

from collections import Counter
from dataclasses import asdict, dataclass

from sparkctl.commands.probes import Checkpoint, Disk, DockerInfo, Gpu, Identity, Limit, Link, RdmaPort

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


@dataclass
class CheckResult:
    id: str
    status: str
    detail: str
    hint: str = ""
    setup: str = ""  # the `sparkctl setup` step(s) that fix this result, comma-separated ("" when none can)

    def to_json(self) -> dict:
        return asdict(self)


GiB = 1 << 30
GB = 1e9


def _human_bytes(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def check_gpu(gpus: list[Gpu], *, expected_name: str = "GB10", expected_cc: str = "12.1") -> CheckResult:
    gpu = gpus[0]
    detail = f"{gpu.name}, SM {gpu.compute_cap}, driver {gpu.driver}"
    if expected_name not in gpu.name or gpu.compute_cap != expected_cc:
        return CheckResult("gpu", FAIL, detail + f" (expected {expected_name}, SM {expected_cc})",
                           "this profile targets DGX Spark (GB10, SM 12.1); check the host and its driver")
    return CheckResult("gpu", PASS, detail)


def check_docker(info: DockerInfo, *, needs_nvidia: bool) -> CheckResult:
    detail = f"engine {info.server_version}, storage {info.storage_driver}, runtimes {','.join(info.runtimes) or '-'}"
    if "nvidia" not in info.runtimes:
        status = FAIL if needs_nvidia else WARN
        return CheckResult("docker", status, detail + " (no nvidia runtime)",
                           "install nvidia-container-toolkit and run `nvidia-ctk runtime configure --runtime=docker`, then restart docker")
    return CheckResult("docker", PASS, detail)


_ULIMIT_HINTS = {
    "memlock": "set `* hard memlock unlimited` in /etc/security/limits.conf and LimitMEMLOCK=infinity for docker.service",
    "nofile": "set `* hard nofile 1048576` in /etc/security/limits.conf and LimitNOFILE=1048576 for docker.service",
    "stack": "raise the stack hard limit in /etc/security/limits.conf (and for docker.service)",
}


def _covers(have: int, want: int) -> bool:
    """Does a host limit ``have`` allow ``want`` (-1 = unlimited)?"""
    if have == -1:
        return True
    return want != -1 and have >= want


def check_ulimits(limits: dict[str, Limit], wanted: dict[str, tuple[int, int]]) -> CheckResult:
    """``wanted``: the profile's container ulimits, name -> (soft, hard); a container cannot exceed the host's hard limit."""
    if not wanted:
        return CheckResult("ulimits", SKIP, "no profile: nothing to compare", "pass --profile")
    short = []
    for name, (_, hard) in sorted(wanted.items()):
        have = limits.get(name)
        if have is not None and not _covers(have.hard, hard):
            short.append(name)
    shown = ", ".join(f"{n} {_limit_text(limits[n].hard)} < {_limit_text(wanted[n][1])}" for n in short)
    if short:
        return CheckResult("ulimits", FAIL, f"hard limits too low: {shown}", "; ".join(_ULIMIT_HINTS[n] for n in short if n in _ULIMIT_HINTS))
    listed = ", ".join(f"{n}={_limit_text(limits[n].hard)}" for n in sorted(wanted) if n in limits)
    return CheckResult("ulimits", PASS, f"hard limits cover the profile ({listed})")


def _limit_text(value: int) -> str:
    return "unlimited" if value == -1 else str(value)


def check_rdma(ports: list[RdmaPort], links: dict[str, Link], hcas: tuple[str, ...], interfaces: tuple[str, ...],
               *, expected_mtu: int = 9000, hcas_up: bool = False) -> CheckResult:
    by_device = {p.device: p for p in ports}
    problems, hints = [], []
    if hcas_up:  # the inventory says "every Up HCA": that is what NCCL will use
        hcas = tuple(p.device for p in ports if p.up)
        if not hcas:
            problems.append("no RDMA device is Up (hcas: up)")
            hints.append("cable the ConnectX-7 port and check `ibdev2netdev`")
    else:
        # A GB10's cabled port is two RoCE twins (one per PCIe x4 link, ~100 Gb/s each): an Up
        # device left out of hcas halves the fabric, NCCL_IB_HCA keeps NCCL off it.
        left_out = [p.device for p in ports if p.up and hcas and p.device not in hcas]
        if left_out:
            problems.append(f"{', '.join(left_out)} Up but not in hcas (NCCL uses {len(hcas)} of "
                            f"{len(hcas) + len(left_out)} Up RDMA devices)")
            hints.append(f"add {', '.join(left_out)} to the inventory's hcas (or say hcas: up)")
    for hca in hcas:
        port = by_device.get(hca)
        if port is None:
            problems.append(f"{hca} missing")
            hints.append("check `ibdev2netdev` and the inventory's hcas")
        elif not port.up:
            problems.append(f"{hca} down")
            hints.append(f"bring up {port.netdev} (cable, switch port)")
    mtus = []
    for name in interfaces:
        link = links.get(name)
        if link is None:
            problems.append(f"{name} missing")
            hints.append("check `ip link` and the inventory's fabric_interfaces")
            continue
        mtus.append(f"{name} mtu {link.mtu}")
        if not link.up:
            problems.append(f"{name} down")
            hints.append(shlex.join(["ip", "link", "set", name, "up"]))
        elif link.mtu != expected_mtu:
            problems.append(f"{name} mtu {link.mtu} (expected {expected_mtu})")
            hints.append(shlex.join(["ip", "link", "set", name, "mtu", str(expected_mtu)]) + " (and in netplan), on the switch too")
    if not hcas and not interfaces and not hcas_up:
        return CheckResult("rdma", WARN, f"{len(ports)} RDMA port(s); the inventory names no hcas/fabric_interfaces",
                           "set fabric_interfaces and hcas in the inventory so NCCL uses the ConnectX-7 fabric")
    if problems:
        status = FAIL if any("missing" in p or "down" in p or "no RDMA device" in p for p in problems) else WARN
        return CheckResult("rdma", status, "; ".join(problems), "; ".join(dict.fromkeys(hints)))
    up = ", ".join(f"{p.device}->{p.netdev}" for p in ports if p.up)
    return CheckResult("rdma", PASS, f"{up or 'no ports'}; {', '.join(mtus)}")


def check_disk(disk: Disk, need_bytes: int | None, path: str) -> CheckResult:
    detail = f"{_human_bytes(disk.available)} free on {disk.mountpoint} (for {path})"
    if need_bytes is None:
        return CheckResult("disk", PASS, detail)
    if disk.available < need_bytes:
        return CheckResult("disk", FAIL, detail + f", needs {_human_bytes(need_bytes)}",
                           f"free space on {disk.mountpoint} or point nvme_path at a larger disk")
    return CheckResult("disk", PASS, detail + f", needs {_human_bytes(need_bytes)}")


DOCKER_DISK_MIN_BYTES = 2 * GiB  # below this docker can load no engine image layer, nor start a container


def with_docker_disk(disk: CheckResult, docker_disk: Disk, root_dir: str) -> CheckResult:
    """The disk check, failed too when the folder docker writes images and containers to is (nearly) full."""
    if docker_disk.available >= DOCKER_DISK_MIN_BYTES:
        return disk
    detail = (f"{_human_bytes(docker_disk.available)} free on {docker_disk.mountpoint} where docker keeps its images "
              f"({root_dir}), under {_human_bytes(DOCKER_DISK_MIN_BYTES)}")
    return CheckResult("disk", FAIL, f"{disk.detail}; {detail}",
                       f"free space there (docker image prune, docker system df){'; ' + disk.hint if disk.hint else ''}")


def check_state_dir(state: str, path: str, user: str | None) -> CheckResult:
    """serve writes its files, the deploy lock and the audit log under ``path`` as the SSH user."""
    if state in ("writable", "creatable"):
        return CheckResult("state", PASS, f"{path} {'is writable' if state == 'writable' else 'can be created'}")
    # A command to copy and paste: every value quoted (a path may hold anything the inventory allows).
    command = shlex.join(["install", "-d", "-o", user, path]) if user else \
        "install -d -o \"$USER\" " + shlex.quote(path)
    return CheckResult("state", FAIL, f"{path} {'is not writable' if state == 'read-only' else 'cannot be created'} by this user",
                       f"once, as root on the host: {command}")


def check_memory(meminfo: dict[str, int], budget_gb: float | None) -> CheckResult:
    available = meminfo["MemAvailable"]
    detail = f"MemAvailable {available / GB:.1f} GB of {meminfo.get('MemTotal', 0) / GB:.1f} GB"
    if budget_gb is None:
        return CheckResult("memory", PASS, detail)
    if available < budget_gb * GB:
        return CheckResult("memory", FAIL, detail + f", the plan needs {budget_gb:.1f} GB",
                           "stop what holds memory on this host (old engine containers: `sparkctl stop`), or lower gpu_memory_utilization")
    return CheckResult("memory", PASS, detail + f", the plan needs {budget_gb:.1f} GB")


def check_ports(listening: set[int], wanted: dict[str, int]) -> CheckResult:
    if not wanted:
        return CheckResult("ports", SKIP, "no profile: no ports to check", "pass --profile")
    taken = [f"{name} {port}" for name, port in wanted.items() if port in listening]
    if taken:
        return CheckResult("ports", FAIL, "in use: " + ", ".join(taken),
                           "stop what listens there (`ss -ltnp`), or choose another port with --set serving.port=... / distributed.master_port=...")
    return CheckResult("ports", PASS, "free: " + ", ".join(f"{n} {p}" for n, p in wanted.items()))


def check_checkpoint(ckpt: Checkpoint, model_dir: str) -> CheckResult:
    hint = f"copy the checkpoint to {model_dir} on this host (every shard listed in model.safetensors.index.json)"
    if not ckpt.dir_exists:
        return CheckResult("checkpoint", FAIL, f"{model_dir} does not exist", hint)
    if not ckpt.config:
        return CheckResult("checkpoint", FAIL, "config.json missing", hint)
    if ckpt.index is not True:
        detail = "model.safetensors.index.json missing" if ckpt.index is None else f"index {ckpt.index}"
        return CheckResult("checkpoint", FAIL, detail, hint)
    missing = ckpt.missing
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return CheckResult("checkpoint", FAIL, f"{len(missing)} of {len(ckpt.files)} shards missing or empty: {shown}", hint)
    sync_hint = f"`sparkctl model sync --source ...` replaces just the files that differ ({model_dir})"
    wrong = ckpt.wrong_size
    if wrong:
        shown = ", ".join(f"{n} ({ckpt.files[n]} of {ckpt.expected[n]} bytes)" for n in wrong[:3])
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        against = "the manifest" if ckpt.manifest is True else "their safetensors headers"
        return CheckResult("checkpoint", FAIL, f"{len(wrong)} shard(s) truncated or of the wrong size against {against}: "
                           f"{shown}{more}", sync_hint)
    unknown = sorted(n for n, size in ckpt.files.items() if size and n in ckpt.expected and ckpt.expected[n] is None)
    if unknown:
        return CheckResult("checkpoint", FAIL, f"{len(unknown)} shard(s) with an unreadable safetensors header: "
                           f"{', '.join(unknown[:3])}", sync_hint)
    total = sum(size for size in ckpt.files.values() if size)
    how = "sizes checked against model sync's manifest" if ckpt.manifest is True else "sizes checked against the safetensors headers (no manifest)"
    if isinstance(ckpt.manifest, str):
        how = f"manifest {ckpt.manifest}; sizes checked against the safetensors headers"
    left = f"; {len(ckpt.left_out)} Engram table file(s) left out by model sync" if ckpt.left_out else ""
    return CheckResult("checkpoint", PASS, f"{len(ckpt.files)} shards, {_human_bytes(total)} ({how}{left})")


# ---------------------------------------------------------------- across hosts


def odd_ones_out(values: dict[str, str]) -> tuple[str | None, list[str]]:
    """The most common value, and the hosts that differ from it."""
    if not values:
        return None, []
    common, _ = Counter(values.values()).most_common(1)[0]
    return common, [host for host, value in values.items() if value != common]


def check_same(check_id: str, values: dict[str, str], what: str, hint: str, status_if_differs: str = FAIL) -> dict[str, CheckResult]:
    common, odd = odd_ones_out(values)
    out = {}
    for host, value in values.items():
        if host in odd:
            out[host] = CheckResult(check_id, status_if_differs, f"{what} {value} differs from the others ({common})", hint)
        else:
            out[host] = CheckResult(check_id, PASS, f"{what} {value}" + (" (same on all hosts)" if len(values) > 1 else ""))
    return out


def check_peers(peers: dict[str, str]) -> CheckResult:
    """The head logging in to each worker over SSH (``distribute --from`` sends host to host)."""
    bad = {w: why for w, why in peers.items() if why}
    if not bad:
        return CheckResult("peers", PASS, f"logs in to {len(peers)} worker(s) over SSH (distribute --from)")
    return CheckResult("peers", WARN, "cannot log in to " + ", ".join(f"{w} ({why})" for w, why in bad.items()),
                       "for `distribute --from` the head's user needs a key the workers accept (ssh-copy-id); "
                       "without it the image streams through this machine")


def check_clock(offsets: dict[str, float], *, warn_s: float = 0.5, fail_s: float = 5.0,
                uncertainty: dict[str, float] | None = None) -> dict[str, CheckResult]:
    """``offsets``: host clock minus the control machine's, RTT-corrected; skew is judged against the median host.
    ``uncertainty``: per host, half the SSH round trip the reading took: the host read its clock somewhere
    in that window, so a slow link is not clock skew (only what is left beyond both hosts' windows counts)."""
    if not offsets:
        return {}
    uncertainty = uncertainty or {}
    ordered = sorted(offsets, key=offsets.__getitem__)
    reference_host = ordered[len(ordered) // 2]
    reference = offsets[reference_host]
    out = {}
    for host, offset in offsets.items():
        skew = offset - reference
        margin = uncertainty.get(host, 0.0) + uncertainty.get(reference_host, 0.0) if host != reference_host else 0.0
        beyond = max(0.0, abs(skew) - margin)
        detail = f"{skew:+.3f} s from the other hosts ({offset:+.3f} s from this machine)"
        if margin >= 0.05:
            detail += f", ±{margin:.2f} s for the SSH round trips"
        hint = "enable time sync on every host (`timedatectl set-ntp true`, chrony)"
        if beyond >= fail_s:
            out[host] = CheckResult("clock", FAIL, detail, hint)
        elif beyond >= warn_s:
            out[host] = CheckResult("clock", WARN, detail, hint)
        else:
            out[host] = CheckResult("clock", PASS, detail)
    return out


def check_identity(identities: dict[str, Identity]) -> dict[str, CheckResult]:
    """Same user, OS and kernel on every host: mixed kernels or OS releases break NCCL and the image in odd ways."""
    keys = {h: f"{i.user} / {i.os} / {i.kernel} / {i.arch}" for h, i in identities.items()}
    return check_same("system", keys, "user/OS/kernel/arch", "install the same OS release and kernel on every host", WARN)


def check_rdma_devices(devices: list[str], hcas: tuple[str, ...], hcas_up: bool, up_ports: int) -> CheckResult:
    """The verbs devices the engine container gets with ``--device /dev/infiniband``."""
    wanted = up_ports if hcas_up else len(hcas)
    if not wanted:
        return CheckResult("rdma_devices", SKIP, "the inventory names no hcas: no RDMA device is passed to the container")
    verbs = sorted(d for d in devices if d.startswith("uverbs"))
    listed = ", ".join(f"/dev/infiniband/{d}" for d in devices) or "nothing in /dev/infiniband"
    if not verbs:
        return CheckResult("rdma_devices", FAIL, f"no /dev/infiniband/uverbs* ({listed}): NCCL in the container "
                           "finds no verbs device (\"NET/IB : No device found\")",
                           "load the RDMA modules (modprobe ib_uverbs mlx5_ib) and check `ls /dev/infiniband`")
    if len(verbs) < wanted:
        return CheckResult("rdma_devices", FAIL, f"{len(verbs)} verbs device(s) for {wanted} HCA(s): {listed}",
                           "check `ls /dev/infiniband` and `ibv_devices`")
    if "rdma_cm" not in devices:
        return CheckResult("rdma_devices", WARN, f"{listed}: no rdma_cm", "modprobe rdma_ucm")
    return CheckResult("rdma_devices", PASS, listed)
