"""What doctor reads on a host: every probe's answer, or why it could not be read.

Each probe is a fact asked through the one fact runner (``ops/ask.py``), so its retry policy holds:
a connection that drops mid-question is asked once more, a command that fails is the host's answer
(``FactFailed``, never a "no"), and a connection that fails twice is kept apart as *unread* (not the
host's answer). One SSH connection per host: the clock first and alone (its round trip must not wait
behind other probes), then the others on a few channels at once. The head also reaches each worker
over the fabric, and logs in to each as ``distribute --from`` will (``probe_peers``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkctl.commands import facts as F
from sparkctl.commands import probes
from sparkctl.commands.facts import Fact
from sparkctl.ops.ask import FactFailed, ask
from sparkctl.ops.doctor.expectations import Expectations
from sparkctl.remote.openssh import peer_check_argv
from sparkctl.remote.result import RemoteError

PROBE_TIMEOUT_S = 20.0
PROBES_AT_ONCE = 4  # channels per connection at a time; sshd allows 10 sessions per connection by default


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


def probe(conn, found: DoctorFindings, probe_id: str, fact: Fact, *args) -> None:
    """Ask ``fact`` (with ``args``) on ``conn``; its answer or why it could not be read lands in ``found``."""
    try:
        found.facts[probe_id] = ask(conn, fact, *args, timeout=PROBE_TIMEOUT_S)
    except FactFailed as err:  # the host's own answer: a failed check
        found.errors[probe_id] = err.reason
    except Exception as err:  # the connection failed (after one more try): not the host's answer
        found.errors[probe_id] = f"{fact.argv(*args)[0]}: {err}"
        found.unread.add(probe_id)


def _read_clock(conn, found: DoctorFindings) -> None:
    sent = time.time()
    probe(conn, found, "clock", F.CLOCK)
    received = time.time()
    if "clock" in found.facts:
        found.clock_offset = found.facts["clock"] - (sent + received) / 2
        found.clock_uncertainty = (received - sent) / 2


def _plan(host, exp: Expectations) -> list[tuple]:
    """The independent probes: (probe id, fact, its arguments)."""
    plan = [("system", F.IDENTITY), ("gpu", F.GPUS), ("docker", F.DOCKER_INFO), ("ulimits", F.ULIMITS),
            ("rdma", F.RDMA_PORTS), ("links", F.LINKS), ("rdma_devices", F.RDMA_DEVICES),
            ("disk", F.DISK, host.nvme_path), ("memory", F.MEMINFO), ("state", F.STATE_DIR, exp.state_dir),
            ("ports", F.LISTENING_PORTS), ("checkpoint", F.CHECKPOINT, exp.model_dir)]
    if exp.image_tag:
        plan.append(("image", F.IMAGE_ID, exp.image_tag))
    return plan


def _reach(conn, address: str, port: int) -> str:
    """"" when ``address:port`` answers from this host (a refusal proves it does), else why not."""
    try:
        result = conn.run(probes.tcp_reach_argv(address, port), timeout=PROBE_TIMEOUT_S)
    except Exception as err:
        return str(err)
    if result.exit_code == 0 or "refused" in result.stderr.lower():  # only silence (timeout) means unreachable
        return ""
    if result.exit_code == 124:
        return "timed out"
    return (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]


def gather(conn, host, exp: Expectations, *, workers_to_reach: list | None = None) -> DoctorFindings:
    found = DoctorFindings(host.name)
    _read_clock(conn, found)  # first and alone
    # Independent probes share the one connection on a few channels at once: a round trip each,
    # not a dozen in a row.
    with ThreadPoolExecutor(max_workers=PROBES_AT_ONCE) as pool:
        list(pool.map(lambda item: probe(conn, found, *item), _plan(host, exp)))
    docker_root = getattr(found.facts.get("docker"), "root_dir", "")
    if docker_root:  # docker load and docker run write there: a full one fails a distribute after its stream
        probe(conn, found, "docker_disk", F.DISK, docker_root)
    for worker in workers_to_reach or []:
        found.reach[worker.name] = _reach(conn, worker.fabric_address, exp.reach_port)
    return found


def probe_peers(pool, inventory, head, workers) -> dict[str, str]:
    """From the head, log in to each worker the way ``distribute --from HEAD`` will (its own keys,
    the worker's fabric address, only the host key this machine verified). Worker -> "" or why not."""
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
