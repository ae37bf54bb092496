"""What doctor found, judged: one ``CheckResult`` per check, from a host's findings (``gather.py``)
and the verdicts (``verdicts.py``). Each per-host check is one small function of ``Seen`` (the host,
what was read there, what the profile needs); the checks that compare hosts are judged once for the
whole run (``judge_cluster``). A probe that could not be read fails its check with the reason, and
a connection that failed is said to be one, not the host's answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sparkctl import engines
from sparkctl.commands.engine_flags import check_env
from sparkctl.commands.env import container_env
from sparkctl.commands.ranks import RankInfo
from sparkctl.errors import ConfigError
from sparkctl.images import surface
from sparkctl.ops.doctor import verdicts as v
from sparkctl.ops.doctor.expectations import Expectations
from sparkctl.ops.doctor.gather import DoctorFindings
from sparkctl.ops.doctor.verdicts import FAIL, PASS, SKIP, WARN, CheckResult

UNREAD_HINT = "the SSH connection failed while asking (not the host's answer): rerun doctor; if it repeats, see the host's sshd log"


@dataclass
class Seen:
    """One host as found: its inventory entry, what its probes answered, what the profile needs."""

    host: object
    found: DoctorFindings
    exp: Expectations
    is_head: bool


def from_error(check_id: str, found: DoctorFindings, probe_id: str, hint: str) -> CheckResult | None:
    """The failed check when probe ``probe_id`` could not be read (None when it answered)."""
    if probe_id in found.errors:
        return CheckResult(check_id, FAIL, found.errors[probe_id], UNREAD_HINT if probe_id in found.unread else hint)
    return None


def gpu(s: Seen) -> CheckResult:
    return from_error("gpu", s.found, "gpu", "install the NVIDIA driver; `nvidia-smi` must work for this user") or v.check_gpu(
        s.found.facts["gpu"])


def docker(s: Seen) -> CheckResult:
    if not s.exp.uses_docker:
        return CheckResult("docker", SKIP, "the profile's launcher is native: the engine runs without a container")
    return from_error("docker", s.found, "docker", "install Docker and add this user to the docker group; `docker info` must work") or \
        v.check_docker(s.found.facts["docker"], needs_nvidia=s.exp.needs_nvidia_runtime)


def ulimits(s: Seen) -> CheckResult:
    return from_error("ulimits", s.found, "ulimits", "") or v.check_ulimits(s.found.facts["ulimits"], s.exp.ulimits)


def rdma(s: Seen) -> CheckResult:
    f, host = s.found.facts, s.host
    failed = from_error("rdma", s.found, "rdma", "install the Mellanox OFED tools (`ibdev2netdev`)") or from_error(
        "rdma", s.found, "links", "")
    return failed or v.check_rdma(f["rdma"], f["links"], host.hcas, host.fabric_interfaces, hcas_up=host.hcas_up)


def rdma_devices(s: Seen) -> CheckResult:
    up_ports = sum(1 for p in s.found.facts.get("rdma") or [] if p.up)
    return from_error("rdma_devices", s.found, "rdma_devices", "") or v.check_rdma_devices(
        s.found.facts["rdma_devices"], s.host.hcas, s.host.hcas_up, up_ports)


def disk(s: Seen) -> CheckResult:
    f, path = s.found.facts, s.host.nvme_path
    result = from_error("disk", s.found, "disk", f"create {path} on the local NVMe") or v.check_disk(
        f["disk"], s.exp.disk_need_bytes, path)
    if "docker_disk" in f and "docker" in f:
        result = v.with_docker_disk(result, f["docker_disk"], f["docker"].root_dir)
    return result


def state(s: Seen) -> CheckResult:
    f = s.found.facts
    user = f["system"].user if "system" in f else s.host.ssh_user
    return from_error("state", s.found, "state", "") or v.check_state_dir(f["state"], s.exp.state_dir, user)


def memory(s: Seen) -> CheckResult:
    return from_error("memory", s.found, "memory", "") or v.check_memory(s.found.facts["memory"], s.exp.memory_budget_gb)


def ports(s: Seen) -> CheckResult:
    wanted = s.exp.head_ports if s.is_head else s.exp.worker_ports
    if not wanted and s.exp.head_ports:
        return CheckResult("ports", PASS, "workers serve no port (headless)")
    return from_error("ports", s.found, "ports", "install iproute2 (`ss`)") or v.check_ports(s.found.facts["ports"], wanted)


def checkpoint(s: Seen) -> CheckResult:
    return from_error("checkpoint", s.found, "checkpoint", "python3 is needed on the host") or v.check_checkpoint(
        s.found.facts["checkpoint"], s.exp.model_dir)


def fabric(s: Seen) -> CheckResult:
    """(head) each worker's fabric address answers over TCP."""
    if not s.found.reach:
        return CheckResult("fabric", SKIP, "no other host to reach")
    bad = {w: why for w, why in s.found.reach.items() if why}
    if bad:
        return CheckResult("fabric", FAIL, "cannot reach " + ", ".join(f"{w} ({why})" for w, why in bad.items()),
                           "check the fabric addresses, cabling and routes between the hosts")
    return CheckResult("fabric", PASS, f"reaches {len(s.found.reach)} worker(s) over the fabric")


# The checks a host's own findings decide (fabric: the head's only), by check id.
PER_HOST: dict[str, Callable[[Seen], CheckResult]] = {
    "gpu": gpu, "docker": docker, "ulimits": ulimits, "rdma": rdma, "rdma_devices": rdma_devices, "disk": disk,
    "state": state, "memory": memory, "ports": ports, "checkpoint": checkpoint, "fabric": fabric,
}


def applies(check_id: str, is_head: bool) -> bool:
    return check_id != "fabric" or is_head


def judge_host(host, found: DoctorFindings, exp: Expectations, is_head: bool) -> dict[str, CheckResult]:
    """Every per-host check of one host (the checks that compare hosts: ``judge_cluster``)."""
    seen = Seen(host, found, exp, is_head)
    return {check_id: judge(seen) for check_id, judge in PER_HOST.items() if applies(check_id, is_head)}


def _image(all_found: dict[str, DoctorFindings], exp: Expectations, out: dict) -> None:
    """The profile's image on every host, and the same ID everywhere."""
    for name, hf in all_found.items():
        if "image" in hf.unread:
            out[name]["image"] = CheckResult("image", FAIL, hf.errors["image"], UNREAD_HINT)
        elif "image" in hf.errors:  # the engine could not say (down, no permission): its words
            out[name]["image"] = CheckResult("image", FAIL, hf.errors["image"],
                                             "`docker image inspect` must work for this user on the host")
        elif "image" in hf.facts and hf.facts["image"] is None:
            out[name]["image"] = CheckResult("image", FAIL, f"{exp.image_tag} not present",
                                             f"`sparkctl build` then `sparkctl distribute` ({exp.image_tag})")
    for host, result in v.check_same("image", _collect(all_found, "image", lambda i: i[:19]), f"{exp.image_tag} id",
                                      "`sparkctl distribute` so every host runs the same image").items():
        out[host]["image"] = result


def _collect(all_found: dict[str, DoctorFindings], probe_id: str, key) -> dict:
    return {n: key(hf.facts[probe_id]) for n, hf in all_found.items() if hf.facts.get(probe_id) is not None}


def judge_cluster(all_found: dict[str, DoctorFindings], exp: Expectations) -> dict[str, dict[str, CheckResult]]:
    """Checks that compare hosts: one result per host per check."""
    out: dict[str, dict[str, CheckResult]] = {name: {} for name in all_found}
    for host, result in v.check_identity(_collect(all_found, "system", lambda i: i)).items():
        out[host]["system"] = result
    for host, result in v.check_same("driver", _collect(all_found, "gpu", lambda g: g[0].driver), "driver",
                                      "install the same NVIDIA driver on every host").items():
        out[host]["driver"] = result
    store = _collect(all_found, "docker", lambda d: d.storage_driver + (" (containerd store)" if d.containerd_snapshotter else ""))
    for host, result in v.check_same("storage", store, "storage driver",
                                      "use the same Docker storage driver/image store on every host").items():
        out[host]["storage"] = result
    if exp.image_tag:
        _image(all_found, exp, out)
    offsets = {n: hf.clock_offset for n, hf in all_found.items() if hf.clock_offset is not None}
    uncertainty = {n: hf.clock_uncertainty for n, hf in all_found.items()}
    for host, result in v.check_clock(offsets, uncertainty=uncertainty).items():
        out[host]["clock"] = result
    for name, hf in all_found.items():
        for check_id in ("system", "clock"):
            if check_id not in out[name] and check_id in hf.errors:
                out[name][check_id] = CheckResult(check_id, FAIL, hf.errors[check_id],
                                                  UNREAD_HINT if check_id in hf.unread else "")
    return out


def check_surface(profile, hosts, image_id: str) -> CheckResult:
    """The profile's commands and environments against the engine surface read from the image on
    the head (by image ID; doctor starts no container: `build` or `serve` reads it)."""
    doc = surface.load(image_id, profile.engine)
    short = image_id.split(":", 1)[-1][:12]
    if doc is None:
        return CheckResult("surface", SKIP, f"no {profile.engine} surface read from image {short} yet: checked against the "
                           "shipped lists", "`sparkctl build` reads it after building; `sparkctl serve` reads it on the host")
    try:
        surface.check_version(doc, profile.engine, profile.engine_version)
        spec = surface.as_engine_flags(doc)
        warnings: list[str] = []
        for rank, host in enumerate(hosts):
            env = container_env(profile, host, spec)
            warnings += check_env(spec, env, profile.env)
            engines.get(profile.engine).engine_argv(profile, spec, RankInfo(rank, len(hosts), hosts[0].fabric_address))
    except ConfigError as err:
        return CheckResult("surface", FAIL, f"image {short}: {err.field + ': ' if err.field else ''}{err.detail}",
                           "use an image whose engine has it, or change the profile")
    detail = f"{doc['engine']} {doc['version']} read from image {short}: every option and variable known"
    if warnings:
        return CheckResult("surface", WARN, detail + "; " + "; ".join(dict.fromkeys(warnings)), "")
    return CheckResult("surface", PASS, detail)


SSH_HINTS = {
    "refused": "start sshd on {address} or fix the port",
    "timeout": "check that {address} is up and routable from here",
    "auth": "check the user and identity_file (or ssh-agent) for this host",
    "hostkey-unknown": "verify the host key, then rerun with --accept-new-host-keys to record it",
    "hostkey-changed": "the host key changed: if expected, remove the old key from known_hosts (ssh-keygen -R)",
    "dns": "{address} does not resolve",
}


def check_ssh(connected, host) -> CheckResult:
    """How the connection went (``connected``: the fan-out's HostResult for the host)."""
    if connected.ok:
        return CheckResult("ssh", PASS, f"connected in {connected.seconds:.2f} s")
    hint = SSH_HINTS.get(connected.cause or "", "check SSH access to this host").format(address=host.address)
    return CheckResult("ssh", FAIL, f"{connected.cause or 'error'}: {connected.error}", hint)
