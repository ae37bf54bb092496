"""Facts: a question asked of a host, as its command and its parser together, with a typed answer.

Pure (no I/O). ``sparkctl.ops.ask.ask(conn, FACT, *args)`` -- the one runner -- runs one and
returns the parsed value, so doctor, serve, status, stop, logs and ``up`` ask the same questions
the same way and read the answers by name, never by position. The commands and parsers
themselves stay where they are documented (``sparkctl.commands.probes`` for doctor's,
``sparkctl.commands.serve`` and ``sparkctl.commands.lock`` for the deployment's). Doctor turns a
failed answer into a failed check instead of an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from sparkctl.commands import lock, probes, serve


@dataclass(frozen=True)
class Fact:
    what: str  # for messages: "cannot <what>: ..."
    argv: Callable[..., list[str]]  # the command, from the fact's arguments
    parse: Callable[[str], Any]  # its stdout -> the answer
    # A failing command is an error (the host's, with the command's stderr), never a "no", unless its
    # stderr carries one of these: then the thing asked about is absent and parse("") is the answer.
    # ("docker image inspect" fails alike for "No such image" and for a Docker engine that is down.)
    absent_when: tuple[str, ...] = ()

    def means_absent(self, stderr: str) -> bool:
        return any(marker in stderr for marker in self.absent_when)


@dataclass(frozen=True)
class PortUsers:
    """Who listens where (``ss -Htlnp``): the listening ports and, where ss can tell, their process."""

    listening: frozenset[int]
    users: dict[int, str]  # port -> "python3 (pid 123)" or ""

    def holder(self, port: int) -> str:
        return self.users.get(port) or "another process"


def parse_port_users(stdout: str) -> PortUsers:
    return PortUsers(frozenset(probes.parse_listening_ports(stdout)), serve.parse_port_users(stdout))


def parse_optional_image_id(stdout: str) -> str | None:
    """The ID in an image's inspect document (None: no such image)."""
    doc = probes.parse_image_inspect(stdout)
    return probes.parse_image_id(str(doc["Id"])) if doc is not None else None


def _image_doc_argv(ref: str) -> list[str]:
    return probes.image_inspect_argv(ref, "{{json .}}")


def parse_image_layers(stdout: str) -> tuple[str, ...] | None:
    return serve.parse_image_layers(stdout) if stdout.strip() else None


def image_doc_layers(doc: dict | None) -> tuple[str, ...] | None:
    """The layers in an image's inspect document (None when it has no readable list of them: ask IMAGE_LAYERS)."""
    layers = ((doc or {}).get("RootFS") or {}).get("Layers")
    if not layers or not isinstance(layers, list) or not all(isinstance(layer, str) for layer in layers):
        return None
    return tuple(layers)


def parse_record(stdout: str) -> dict | None:
    try:
        record = json.loads(stdout) if stdout.strip() else None
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def parse_containers_by_id(stdout: str) -> list[serve.Container]:
    """The listing's containers in ID order, whatever order docker listed them in."""
    return sorted(serve.parse_containers(stdout), key=lambda container: container.id)


def parse_named_container(stdout: str) -> serve.Container | None:
    """The one container ``docker inspect NAME`` printed (None when there is none)."""
    found = serve.parse_containers(stdout) if stdout.strip() else []
    return found[0] if found else None


def _constant(argv: list[str]) -> Callable[[], list[str]]:
    return lambda: list(argv)


# containers_argv(profile, name): the profile's containers, any of that name, every running sparkctl one
CONTAINERS = Fact("list containers", serve.containers_argv, parse_containers_by_id)
# container_argv(name): the container of that name now, None when there is none
CONTAINER = Fact("inspect the container", serve.container_argv, parse_named_container, absent_when=serve.NO_SUCH_CONTAINER)
# The ID the tag names on the host (None when the host has no such image), read from the same command as
# IMAGE_DOC: in a run that keeps answers the two questions of one tag are one docker (ask keeps commands' answers).
IMAGE_ID = Fact("inspect the image", _image_doc_argv, parse_optional_image_id, absent_when=probes.NO_SUCH_IMAGE)
# image_layers_argv(image): the image's content (layer diff IDs), None when it is gone
IMAGE_LAYERS = Fact("inspect the image's layers", serve.image_layers_argv, parse_image_layers,
                    absent_when=probes.NO_SUCH_IMAGE)
# image_inspect_argv(ref, "{{json .}}"): the whole inspect document, None when the host has no such image
IMAGE_DOC = Fact("inspect the image", _image_doc_argv, probes.parse_image_inspect,
                 absent_when=probes.NO_SUCH_IMAGE)
PORT_USERS = Fact("list listening ports (ss)", _constant(serve.PORTS_WITH_USERS_ARGV), parse_port_users)
MEMINFO = Fact("read /proc/meminfo", _constant(probes.MEMINFO_ARGV), probes.parse_meminfo)
# record_argv(profile, state_dir): the deployment record serve left on the host, None without one
DEPLOYMENT_RECORD = Fact("read the deployment record", serve.record_argv, parse_record)
# read_lock_argv(path): the deploy lock's details, None when no lock is held
LOCK = Fact("read the deploy lock", lock.read_lock_argv, lock.parse_lock_info)

# doctor's questions (each also a verdict: sparkctl.ops.doctor.verdicts)
CLOCK = Fact("read the clock", _constant(probes.CLOCK_ARGV), probes.parse_clock)
IDENTITY = Fact("identify the system", _constant(probes.IDENTITY_ARGV), probes.parse_identity)
GPUS = Fact("list the GPUs (nvidia-smi)", _constant(probes.GPU_ARGV), probes.parse_gpus)
DOCKER_INFO = Fact("read docker info", _constant(probes.DOCKER_ARGV), probes.parse_docker_info)
ULIMITS = Fact("read the shell's limits", _constant(probes.ULIMIT_ARGV), probes.parse_ulimits)
RDMA_PORTS = Fact("list the RDMA ports (ibdev2netdev)", _constant(probes.RDMA_ARGV), probes.parse_ibdev2netdev)
# init's three questions: the host's name, its RDMA ports if it has the tools, its IPv4 addresses
HOSTNAME = Fact("read the host name", _constant(probes.HOSTNAME_ARGV), lambda out: out.strip())
INIT_RDMA_PORTS = Fact("list the RDMA ports (ibdev2netdev)", _constant(probes.RDMA_IF_ANY_ARGV),
                       lambda out: probes.parse_ibdev2netdev(out) if out.strip() else [])
ADDRESSES = Fact("list the IPv4 addresses", _constant(probes.IPV4_ARGV), probes.parse_ipv4)
RDMA_DEVICES = Fact("list /dev/infiniband", _constant(probes.RDMA_DEVICES_ARGV), probes.parse_rdma_devices)
LINKS = Fact("list the network links", _constant(probes.LINKS_ARGV), probes.parse_links)
# disk_argv(path): the filesystem holding path
DISK = Fact("read the disk (df)", probes.disk_argv, probes.parse_df)
# state_dir_argv(path): whether the SSH user can write the state dir (or create it)
STATE_DIR = Fact("check the state dir", probes.state_dir_argv, probes.parse_state_dir)
LISTENING_PORTS = Fact("list listening ports (ss)", _constant(probes.PORTS_ARGV), probes.parse_listening_ports)
# checkpoint_argv(model_dir): the checkpoint's files, sizes and model sync's manifest
CHECKPOINT = Fact("read the checkpoint", probes.checkpoint_argv, probes.parse_checkpoint)
