"""Gather facts on every host at once, then judge them: one list of checks per host.

One SSH connection per host; the probes of a host run one after another on it, the hosts in
parallel, so 8 hosts take about as long as 1. A probe that fails becomes a failed check with its
message; an unreachable host still appears, with a failed ``ssh`` check naming the cause.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from sparkctl.commands import facts as F
from sparkctl.commands import probes
from sparkctl.commands.facts import Fact
from sparkctl.ops.ask import FactFailed, ask
from sparkctl.ops.doctor import verdicts as v
from sparkctl.ops.doctor.fixes import annotate
from sparkctl.ops.doctor.verdicts import FAIL, PASS, SKIP, WARN, CheckResult
from sparkctl.ops.steps import OK, StepFailed  # the report as a step's end (outcome)
from sparkctl.remote.result import RemoteError

PROBE_TIMEOUT_S = 20.0
CHECK_ORDER = ["ssh", "system", "gpu", "driver", "docker", "storage", "ulimits", "rdma", "rdma_devices", "fabric", "peers", "disk", "state",
               "memory", "ports", "checkpoint", "image", "surface", "clock"]


@dataclass
class Expectations:
    """What the checks compare against; None/empty where no profile was given."""

    model_dir: str
    state_dir: str
    image_tag: str | None = None
    needs_nvidia_runtime: bool = False
    ulimits: dict[str, tuple[int, int]] = field(default_factory=dict)
    disk_need_bytes: int | None = None
    memory_budget_gb: float | None = None
    head_ports: dict[str, int] = field(default_factory=dict)
    worker_ports: dict[str, int] = field(default_factory=dict)
    reach_port: int = 22
    uses_docker: bool = True  # False for a native launcher: the engine runs as a process, no container


def expectations_for(inventory, profile) -> Expectations:
    model_dir, state_dir = inventory.model.paths.model_dir, inventory.model.paths.state_dir
    if profile is None:
        return Expectations(model_dir=model_dir, state_dir=state_dir)
    from sparkctl.ops.plan import plan_memory
    from sparkctl.ops.serve import head_ports

    plan = plan_memory(profile)
    engram_bytes = profile.memory.engram_total_gb * 1e9 / profile.tensor_parallel if profile.engram.mode == "disk" else 0
    native = profile.launcher == "native"
    # A native engine is a host process: no container limits, no image on disk, and the memory it
    # needs free is its start guard's floor (single_box.min_free_gib), not a container plan's budget.
    return Expectations(
        model_dir=model_dir,
        state_dir=state_dir,
        image_tag=None if native else profile.image.tag,
        uses_docker=not native,
        needs_nvidia_runtime=profile.container.gpus is not None,
        ulimits={} if native else {name: (lim.soft, lim.hard) for name, lim in profile.container.ulimits.items()},
        disk_need_bytes=int(engram_bytes + (0 if native else profile.image.size_gb * 1e9)),
        memory_budget_gb=profile.single_box.min_free_gib * 2**30 / 1e9 if native and profile.single_box else plan.budget_gb,
        head_ports=head_ports(profile, profile.tensor_parallel),  # what serve checks before its start
    )


@dataclass
class DoctorFindings:
    name: str
    facts: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # probe id -> why it could not be read
    clock_offset: float | None = None
    clock_uncertainty: float = 0.0  # half the round trip of the clock reading: when in it the host read its clock
    reach: dict[str, str] = field(default_factory=dict)  # worker name -> "" (ok) or the failure
    unread: set[str] = field(default_factory=set)  # probe ids the connection failed to run (not the host's answer)
    peers: dict[str, str] = field(default_factory=dict)  # head only: worker name -> "" (logged in) or why not


def _probe(conn, facts: DoctorFindings, probe_id: str, fact: Fact, *args) -> None:
    """Ask ``fact`` (with ``args``) on ``conn``; its answer or why it could not be read lands in ``facts``."""
    try:
        facts.facts[probe_id] = ask(conn, fact, *args, timeout=PROBE_TIMEOUT_S)
    except FactFailed as err:  # the host's own answer: a failed check
        facts.errors[probe_id] = err.reason
    except Exception as err:  # the connection failed (after one more try): not the host's answer
        facts.errors[probe_id] = f"{fact.argv(*args)[0]}: {err}"
        facts.unread.add(probe_id)


PROBES_AT_ONCE = 4  # channels per connection at a time; sshd allows 10 sessions per connection by default


def gather(conn, host, exp: Expectations, *, workers_to_reach: list | None = None) -> DoctorFindings:
    from concurrent.futures import ThreadPoolExecutor

    facts = DoctorFindings(host.name)
    # Clock first and alone: its round trip must not wait behind other probes.
    sent = time.time()
    _probe(conn, facts, "clock", F.CLOCK)
    received = time.time()
    if "clock" in facts.facts:
        facts.clock_offset = facts.facts["clock"] - (sent + received) / 2
        facts.clock_uncertainty = (received - sent) / 2
    plan = [  # (probe id, fact, its arguments)
        ("system", F.IDENTITY),
        ("gpu", F.GPUS),
        ("docker", F.DOCKER_INFO),
        ("ulimits", F.ULIMITS),
        ("rdma", F.RDMA_PORTS),
        ("links", F.LINKS),
        ("rdma_devices", F.RDMA_DEVICES),
        ("disk", F.DISK, host.nvme_path),
        ("memory", F.MEMINFO),
        ("state", F.STATE_DIR, exp.state_dir),
        ("ports", F.LISTENING_PORTS),
        ("checkpoint", F.CHECKPOINT, exp.model_dir),
    ]
    if exp.image_tag:
        plan.append(("image", F.IMAGE_ID, exp.image_tag))
    # Independent probes share the one connection on a few channels at once: a round trip each,
    # not a dozen in a row.
    with ThreadPoolExecutor(max_workers=PROBES_AT_ONCE) as pool:
        list(pool.map(lambda item: _probe(conn, facts, *item), plan))
    docker_root = getattr(facts.facts.get("docker"), "root_dir", "")
    if docker_root:  # docker load and docker run write there: a full one fails a distribute after its stream
        _probe(conn, facts, "docker_disk", F.DISK, docker_root)
    for worker in workers_to_reach or []:
        try:
            result = conn.run(probes.tcp_reach_argv(worker.fabric_address, exp.reach_port), timeout=PROBE_TIMEOUT_S)
        except Exception as err:
            facts.reach[worker.name] = str(err)
            continue
        # A refused connection proves the address answers; only silence (timeout) means unreachable.
        refused = "refused" in result.stderr.lower()
        facts.reach[worker.name] = "" if result.exit_code == 0 or refused else (
            "timed out" if result.exit_code == 124 else (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
        )
    return facts


UNREAD_HINT = "the SSH connection failed while asking (not the host's answer): rerun doctor; if it repeats, see the host's sshd log"


def _from_error(check_id: str, facts: DoctorFindings, probe_id: str, hint: str) -> CheckResult | None:
    if probe_id in facts.errors:
        return CheckResult(check_id, FAIL, facts.errors[probe_id], UNREAD_HINT if probe_id in facts.unread else hint)
    return None


def judge_host(host, facts: DoctorFindings, exp: Expectations, is_head: bool) -> dict[str, CheckResult]:
    f = facts.facts
    out: dict[str, CheckResult] = {}
    out["gpu"] = _from_error("gpu", facts, "gpu", "install the NVIDIA driver; `nvidia-smi` must work for this user") or v.check_gpu(f["gpu"])
    if exp.uses_docker:
        out["docker"] = _from_error("docker", facts, "docker", "install Docker and add this user to the docker group; `docker info` must work") or v.check_docker(
            f["docker"], needs_nvidia=exp.needs_nvidia_runtime)
    else:
        out["docker"] = CheckResult("docker", SKIP, "the profile's launcher is native: the engine runs without a container")
    out["ulimits"] = _from_error("ulimits", facts, "ulimits", "") or v.check_ulimits(f["ulimits"], exp.ulimits)
    rdma_error = _from_error("rdma", facts, "rdma", "install the Mellanox OFED tools (`ibdev2netdev`)") or _from_error("rdma", facts, "links", "")
    out["rdma"] = rdma_error or v.check_rdma(f["rdma"], f["links"], host.hcas, host.fabric_interfaces,
                                             hcas_up=host.hcas_up)
    up_ports = sum(1 for p in f.get("rdma") or [] if p.up)
    out["rdma_devices"] = _from_error("rdma_devices", facts, "rdma_devices", "") or v.check_rdma_devices(
        f["rdma_devices"], host.hcas, host.hcas_up, up_ports)
    out["disk"] = _from_error("disk", facts, "disk", f"create {host.nvme_path} on the local NVMe") or v.check_disk(
        f["disk"], exp.disk_need_bytes, host.nvme_path)
    if "docker_disk" in f and "docker" in f:
        out["disk"] = v.with_docker_disk(out["disk"], f["docker_disk"], f["docker"].root_dir)
    user = f["system"].user if "system" in f else host.ssh_user
    out["state"] = _from_error("state", facts, "state", "") or v.check_state_dir(f["state"], exp.state_dir, user)
    out["memory"] = _from_error("memory", facts, "memory", "") or v.check_memory(f["memory"], exp.memory_budget_gb)
    wanted_ports = exp.head_ports if is_head else exp.worker_ports
    if wanted_ports or not exp.head_ports:
        out["ports"] = _from_error("ports", facts, "ports", "install iproute2 (`ss`)") or v.check_ports(f["ports"], wanted_ports)
    else:
        out["ports"] = CheckResult("ports", PASS, "workers serve no port (headless)")
    out["checkpoint"] = _from_error("checkpoint", facts, "checkpoint", "python3 is needed on the host") or v.check_checkpoint(
        f["checkpoint"], exp.model_dir)
    if is_head:
        if facts.reach:
            bad = {w: why for w, why in facts.reach.items() if why}
            if bad:
                out["fabric"] = CheckResult("fabric", FAIL, "cannot reach " + ", ".join(f"{w} ({why})" for w, why in bad.items()),
                                            "check the fabric addresses, cabling and routes between the hosts")
            else:
                out["fabric"] = CheckResult("fabric", PASS, f"reaches {len(facts.reach)} worker(s) over the fabric")
        else:
            out["fabric"] = CheckResult("fabric", SKIP, "no other host to reach")
    return out


def judge_cluster(all_facts: dict[str, DoctorFindings], exp: Expectations) -> dict[str, dict[str, CheckResult]]:
    """Checks that compare hosts: one result per host per check."""
    out: dict[str, dict[str, CheckResult]] = {name: {} for name in all_facts}

    def collect(probe_id, key):
        return {n: key(hf.facts[probe_id]) for n, hf in all_facts.items() if hf.facts.get(probe_id) is not None}

    for host, result in v.check_identity(collect("system", lambda i: i)).items():
        out[host]["system"] = result
    for host, result in v.check_same("driver", collect("gpu", lambda g: g[0].driver), "driver",
                                      "install the same NVIDIA driver on every host").items():
        out[host]["driver"] = result
    for host, result in v.check_same("storage", collect("docker", lambda d: d.storage_driver + (" (containerd store)" if d.containerd_snapshotter else "")),
                                      "storage driver", "use the same Docker storage driver/image store on every host").items():
        out[host]["storage"] = result
    if exp.image_tag:
        for name, hf in all_facts.items():
            if "image" in hf.unread:
                out[name]["image"] = CheckResult("image", FAIL, hf.errors["image"], UNREAD_HINT)
            elif "image" in hf.errors:  # the engine could not say (down, no permission): its words
                out[name]["image"] = CheckResult("image", FAIL, hf.errors["image"],
                                                 "`docker image inspect` must work for this user on the host")
            elif "image" in hf.facts and hf.facts["image"] is None:
                out[name]["image"] = CheckResult("image", FAIL, f"{exp.image_tag} not present",
                                                 f"`sparkctl build` then `sparkctl distribute` ({exp.image_tag})")
        for host, result in v.check_same("image", collect("image", lambda i: i[:19]), f"{exp.image_tag} id",
                                          "`sparkctl distribute` so every host runs the same image").items():
            out[host]["image"] = result
    offsets = {n: hf.clock_offset for n, hf in all_facts.items() if hf.clock_offset is not None}
    uncertainty = {n: hf.clock_uncertainty for n, hf in all_facts.items()}
    for host, result in v.check_clock(offsets, uncertainty=uncertainty).items():
        out[host]["clock"] = result
    for name, hf in all_facts.items():
        for check_id, probe_id in (("system", "system"), ("clock", "clock")):
            if check_id not in out[name] and probe_id in hf.errors:
                out[name][check_id] = CheckResult(check_id, FAIL, hf.errors[probe_id], UNREAD_HINT if probe_id in hf.unread else "")
    return out


@dataclass
class DoctorReport:
    hosts: list[tuple[str, list[CheckResult]]]

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for _, checks in self.hosts for c in checks)

    def outcome(self, later: Callable[[CheckResult], bool] = lambda check: False) -> tuple[str, str]:
        """As a step's end: ok, or StepFailed with each failed check and its fix. A failure ``later``
        says a later step repairs (the image missing, before ``up`` builds it) is left to it, and named."""
        failed = [(host, check) for host, checks in self.hosts for check in checks if check.status == FAIL]
        blocking = [f"{host}: {c.id}: {c.detail}" + (f" (fix: {c.hint})" if c.hint else "") for host, c in failed if not later(c)]
        if blocking:
            raise StepFailed("; ".join(blocking))
        forgiven = [f"{host}: {c.id}" for host, c in failed if later(c)]
        checked = sum(len(checks) for _, checks in self.hosts)
        return OK, f"{checked} checks on {len(self.hosts)} host(s) passed" + (
            f"; left to later steps: {', '.join(forgiven)}" if forgiven else "")

    def to_json(self) -> dict:
        return {"ok": self.ok, "hosts": [{"name": n, "checks": [c.to_json() for c in checks]} for n, checks in self.hosts]}


def run_doctor(inventory, hosts, profile=None, *, accept_new_host_keys: bool = False, connect_timeout: float = 10.0,
               max_workers: int = 16, pool=None) -> DoctorReport:
    """``pool``: the run's connections (``up``'s), else doctor opens its own."""
    from sparkctl.remote.pool import fan_out, run_pool

    exp = expectations_for(inventory, profile)
    head = next((h for h in hosts if h.is_head), hosts[0])
    workers = [h for h in hosts if h.name != head.name]
    by_target_name = {h.name: h for h in hosts}

    def work(conn):
        host = by_target_name[conn.target.name]
        if host.name != head.name:
            return gather(conn, host, exp)
        facts = gather(conn, host, exp, workers_to_reach=workers)
        # While the workers' own probes still run: the workers' connections (their verified host
        # keys) are up by now, or being opened by their threads.
        facts.peers = probe_peers(pool, inventory, head, workers) if workers else {}
        return facts

    with run_pool(pool, connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys) as pool:
        results = fan_out([inventory.ssh_target(h) for h in hosts], work, pool=pool, max_workers=max_workers)
    reached = {r.name: r.value for r in results if r.ok}

    cluster = judge_cluster(reached, exp)
    peers = {w.name: reached[head.name].peers[w.name] for w in workers if head.name in reached and w.name in reached}
    if peers:  # a worker this machine cannot reach has its own failed ssh check
        cluster[head.name]["peers"] = v.check_peers(peers)
    if profile is not None and head.name in reached and reached[head.name].facts.get("image"):
        cluster[head.name]["surface"] = check_surface(profile, hosts, reached[head.name].facts["image"])
    report = []
    for host, result in zip(hosts, results):
        if not result.ok:
            checks = [CheckResult("ssh", FAIL, f"{result.cause or 'error'}: {result.error}", _ssh_hint(result.cause, host))]
            checks += [CheckResult(c, SKIP, "host not reachable") for c in CHECK_ORDER[1:]]
            report.append((host.name, checks))
            continue
        checks = {"ssh": CheckResult("ssh", PASS, f"connected in {result.seconds:.2f} s")}
        checks.update(judge_host(host, result.value, exp, host.name == head.name))
        checks.update(cluster.get(host.name, {}))
        ordered = [annotate(checks[c]) for c in CHECK_ORDER if c in checks]
        report.append((host.name, ordered))
    return DoctorReport(report)


def check_surface(profile, hosts, image_id: str) -> CheckResult:
    """The profile's commands and environments against the engine surface read from the image on
    the head (by image ID; doctor starts no container: `build` or `serve` reads it)."""
    from sparkctl.commands.env import container_env
    from sparkctl.commands.engine_flags import check_env
    from sparkctl.commands.ranks import RankInfo
    from sparkctl.errors import ConfigError
    from sparkctl.images import surface
    from sparkctl import engines

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


def probe_peers(pool, inventory, head, workers) -> dict[str, str]:
    """From the head, log in to each worker the way ``distribute --from HEAD`` will (its own keys,
    the worker's fabric address, only the host key this machine verified). Worker -> "" or why not."""
    from concurrent.futures import ThreadPoolExecutor

    from sparkctl.remote.openssh import peer_check_argv
    from sparkctl.remote.result import RemoteError

    conn = pool.get(inventory.ssh_target(head))

    def one(worker) -> str:
        target = inventory.ssh_target(worker)
        try:
            key = pool.get(target).server_key()
            argv = peer_check_argv(f"{worker.name} {key.get_name()} {key.get_base64()}", worker, target, alias=worker.name)
            result = conn.run(argv, timeout=PROBE_TIMEOUT_S)
        except RemoteError as err:
            return f"could not ask: {err}"
        if result.exit_code == 0:
            return ""
        if result.exit_code == 127:
            return "no ssh client on the head"
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"ssh exit {result.exit_code}"

    with ThreadPoolExecutor(max_workers=PROBES_AT_ONCE) as threads:
        return dict(zip([w.name for w in workers], threads.map(one, workers)))


def _ssh_hint(cause: str | None, host) -> str:
    return {
        "refused": f"start sshd on {host.address} or fix the port",
        "timeout": f"check that {host.address} is up and routable from here",
        "auth": "check the user and identity_file (or ssh-agent) for this host",
        "hostkey-unknown": "verify the host key, then rerun with --accept-new-host-keys to record it",
        "hostkey-changed": "the host key changed: if expected, remove the old key from known_hosts (ssh-keygen -R)",
        "dns": f"{host.address} does not resolve",
    }.get(cause or "", "check SSH access to this host")
