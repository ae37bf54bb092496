"""``sparkctl init``: ask each host what it has, and write a commented inventory from the answers.

Each host is asked three things over SSH (the same connection every later verb uses, so a host
that answers here answers doctor too): its host name, ``ibdev2netdev`` (the RDMA devices and the
netdev each one drives, with its link state) and ``ip -o -4 addr show`` (the fabric addresses).
The Up ports give ``fabric_interfaces`` and ``hcas``; the IPv4 addresses on those netdevs give
``fabric_addresses``. What is the same on every host goes into ``defaults``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparkctl.commands.facts import ADDRESSES, HOSTNAME, INIT_RDMA_PORTS
from sparkctl.errors import ConfigError
from sparkctl.ops.steps import ask
from sparkctl.remote.pool import fan_out, run_pool
from sparkctl.remote.target import SSHTarget

_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")


@dataclass(frozen=True)
class HostSpec:
    """One ``--hosts`` entry: ``NAME=ADDRESS`` or ``ADDRESS`` (the name is then the host's own)."""

    address: str
    name: str | None = None


def parse_host_specs(value: str) -> list[HostSpec]:
    specs, seen = [], set()
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        name, _, address = item.rpartition("=")
        if name and not _NAME_OK.match(name):
            raise ConfigError(f"{name!r} is not a host name (letters, digits, . _ -)", field="--hosts")
        if not address or address in seen:
            raise ConfigError(f"{item!r}: an empty or repeated address", field="--hosts")
        seen.add(address)
        specs.append(HostSpec(address=address, name=name or None))
    if not specs:
        raise ConfigError("give the hosts as HOST1,HOST2,... (NAME=ADDRESS or ADDRESS; the first is the head)",
                          field="--hosts")
    return specs


@dataclass
class DiscoveredHost:
    """What one host answered (or why it did not)."""

    spec: HostSpec
    hostname: str = ""
    ports: list = field(default_factory=list)
    addresses: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def name(self) -> str:
        if self.spec.name:
            return self.spec.name
        short = self.hostname.split(".")[0]
        return short if _NAME_OK.match(short) else self.spec.address.replace(":", "-")

    @property
    def interfaces(self) -> list[str]:
        return [p.netdev for p in self.ports if p.up]

    @property
    def hcas(self) -> list[str]:
        return [p.device for p in self.ports if p.up]

    @property
    def fabric_addresses(self) -> list[str]:
        return [a for netdev in self.interfaces for a in self.addresses.get(netdev, [])]

    def to_json(self) -> dict:
        return {"name": self.name, "address": self.spec.address, "ok": self.error is None, "error": self.error,
                "fabric_interfaces": self.interfaces, "hcas": self.hcas, "fabric_addresses": self.fabric_addresses,
                "rdma_ports": [{"device": p.device, "netdev": p.netdev, "up": p.up} for p in self.ports]}


@dataclass(frozen=True)
class SshChoice:
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None


def probe_hosts(specs: list[HostSpec], ssh: SshChoice, *, connect_timeout: float,
                accept_new_host_keys: bool) -> list[DiscoveredHost]:
    """Ask every host at once; a host that cannot be reached carries its error (never raises)."""
    targets = [SSHTarget(name=s.name or s.address, address=s.address, port=ssh.port, user=ssh.user,
                         identity_file=ssh.identity_file, known_hosts=ssh.known_hosts) for s in specs]

    def one(conn):
        return ask(conn, HOSTNAME), ask(conn, INIT_RDMA_PORTS), ask(conn, ADDRESSES)

    with run_pool(connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys) as pool:
        results = fan_out(targets, one, pool=pool)
    facts = []
    for spec, result in zip(specs, results):
        if result.ok:
            hostname, ports, addresses = result.value
            facts.append(DiscoveredHost(spec, hostname=hostname, ports=ports, addresses=addresses))
        else:
            facts.append(DiscoveredHost(spec, error=result.error))
    return facts
