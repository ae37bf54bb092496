"""The host inventory: which boxes exist, how to reach them, and where their data lives.

Shape (kept stable, other tools read it): a top-level ``hosts:`` list of mappings, each with at
least ``name`` and ``address``; exactly one host has ``role: head``, the others are workers.
Cluster-wide ``defaults`` are merged under every host's own settings.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkctl.config import userconfig
from sparkctl.config.fields import AbsPath, Address, HostPath, InterfaceName, Name, UserName
from sparkctl.config.yamlfile import LocatedYaml, format_loc, load_yaml_file, validation_error
from sparkctl.errors import ConfigError, config_error
from sparkctl.fileio import UserFileError, check_user_file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, protected_namespaces=())  # model_dir is a field, not pydantic's


class SSHSettings(_Strict):
    """Unset fields fall back to ~/.ssh/config, then to OpenSSH's own defaults."""

    user: UserName | None = None
    port: int | None = Field(default=None, ge=1, le=65535, strict=True)
    identity_file: AbsPath | None = None
    proxy_jump: str | None = Field(default=None, pattern=r"^[A-Za-z0-9@._:,\[\]-]+$")


class HostSettings(_Strict):
    """What a host may inherit from ``defaults`` or set for itself."""

    ssh: SSHSettings = SSHSettings()
    nvme_path: HostPath | None = None
    fabric_interfaces: list[InterfaceName] | None = None
    # RDMA devices for NCCL_IB_HCA, or "up": every RDMA device that is Up on the host, asked when a
    # command renders for it (ops/hcas.py; `doctor` lists them).
    hcas: list[InterfaceName] | Literal["up"] | None = None
    # The fabric's subnet: the prefix `setup` gives fabric_addresses, and the rule for a host that
    # lists none: fabric interface k of the host at position i (from 0) gets the subnet's address
    # 11 + i + 100 * k (the sandbox's own numbering: .11, .12, ... and their twins .111, .112, ...).
    fabric_subnet: str | None = None

    @field_validator("fabric_subnet")
    @classmethod
    def _subnet(cls, value):
        if value is None:
            return value
        try:
            return str(ipaddress.ip_network(value, strict=True))
        except ValueError as err:
            raise ValueError(f"{value!r} is not a subnet such as 192.168.100.0/24 ({err})") from None

    @field_validator("hcas", mode="before")
    @classmethod
    def _hcas_list_or_up(cls, value):
        if isinstance(value, str) and value != "up":
            raise ValueError(f"{value!r}: give a list of RDMA device names (`ibdev2netdev`), or 'up' for every Up one")
        return value


class Host(HostSettings):
    name: Name
    address: Address
    role: Literal["head", "worker"] = "worker"
    fabric_addresses: list[Address] = []


class Paths(_Strict):
    model_dir: HostPath = "/mnt/nvme/models/DeepSeek-V4.1-Flash"
    engram_dir: HostPath = "/mnt/nvme/engram"
    hf_cache: HostPath = "/mnt/nvme/hf-cache"
    # sparkctl's own folder on every host: deployed files per profile, the deploy lock, the audit log.
    state_dir: HostPath = "/var/lib/sparkctl"


class Inventory(_Strict):
    cluster: Name = "spark"
    known_hosts: AbsPath | None = None
    defaults: HostSettings = HostSettings()
    paths: Paths = Paths()
    hosts: list[Host] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_hosts(self) -> "Inventory":
        problems = _duplicates(self.hosts) + _head_problems(self.hosts)
        if problems:
            raise _LocatedError(problems[0][0], problems[0][1], more=problems[1:])
        return self


def _duplicates(hosts: list) -> list[tuple[tuple, str]]:
    """Every repeated host name and address (each named at the later host)."""
    problems = []
    seen_names: dict[str, int] = {}
    seen_addresses: dict[str, int] = {}
    for index, host in enumerate(hosts):
        if host.name in seen_names:
            problems.append((("hosts", index, "name"), f"duplicate host name {host.name!r} (also hosts[{seen_names[host.name]}])"))
        seen_names.setdefault(host.name, index)
        for field, addresses in (("address", [host.address]), ("fabric_addresses", host.fabric_addresses)):
            for address in addresses:
                if address in seen_addresses:
                    problems.append((("hosts", index, field),
                                     f"duplicate address {address} (also used by hosts[{seen_addresses[address]}])"))
                seen_addresses.setdefault(address, index)
    return problems


def _head_problems(hosts: list) -> list[tuple[tuple, str]]:
    heads = [i for i, h in enumerate(hosts) if h.role == "head"]
    if not heads:
        return [(("hosts",), "no host has 'role: head'; mark exactly one host as the head")]
    if len(heads) > 1:
        return [(("hosts", heads[1], "role"), f"two heads (hosts[{heads[0]}] and hosts[{heads[1]}]); exactly one host may be the head")]
    return []


class _LocatedError(ValueError):
    """A cross-field validation failure that belongs to one field (so the error names its line);
    ``more``: the other such failures found in the same pass, (loc, message) each."""

    def __init__(self, loc: tuple, message: str, more: list | None = None):
        super().__init__(message)
        self.loc = loc
        self.more = more or []


DEFAULT_NVME_PATH = "/mnt/nvme"


@dataclass(frozen=True)
class HostView:
    """One host with the defaults merged in: what every verb works with."""

    name: str
    address: str
    role: str
    index: int
    ssh_user: str | None
    ssh_port: int | None
    identity_file: str | None
    proxy_jump: str | None
    nvme_path: str
    fabric_addresses: tuple[str, ...]
    fabric_interfaces: tuple[str, ...]
    hcas: tuple[str, ...]
    hcas_up: bool = False  # the inventory says "every Up HCA" (hcas: up)
    fabric_subnet: str | None = None

    @property
    def is_head(self) -> bool:
        return self.role == "head"

    @property
    def fabric_address(self) -> str:
        """The address other ranks use to reach this host: the first fabric address, else management."""
        return self.fabric_addresses[0] if self.fabric_addresses else self.address


@dataclass(frozen=True)
class LoadedInventory:
    model: Inventory
    path: str
    # `hcas: up` resolved: (host, the RDMA devices Up on it when asked), see ops/hcas.resolve_up_hcas.
    up_hcas: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def hosts(self) -> list[HostView]:
        found = dict(self.up_hcas)
        return [_merge(i, h, self.model.defaults, found.get(h.name)) for i, h in enumerate(self.model.hosts)]

    @property
    def head(self) -> HostView:
        return next(h for h in self.hosts if h.is_head)

    def pick(self, names: list[str] | None, *, field: str = "--hosts") -> list[HostView]:
        """The named hosts (every host when none are named): the one host-selection rule."""
        return pick_hosts(self.hosts, names, field=field)

    def host(self, name: str, *, field: str) -> HostView:
        """The host called ``name`` (``field`` is the option that named it, for the error)."""
        return pick_hosts(self.hosts, [name], field=field)[0]

    def ssh_target(self, host: HostView):
        # here, not at the top: config sits below the transport (docs/architecture.md), and this is
        # its one link to it, taken only when a host is reached
        from sparkctl.remote.target import SSHTarget

        return SSHTarget(
            name=host.name,
            address=host.address,
            port=host.ssh_port,
            user=host.ssh_user,
            identity_file=host.identity_file,
            known_hosts=self.model.known_hosts,
            proxy_jump=host.proxy_jump,
        )


def pick_hosts(hosts: list, names: list[str] | None, *, field: str = "--hosts") -> list:
    """The hosts named, in the order named; all of ``hosts`` when ``names`` is empty or None.
    An unknown name, or a name given twice, is refused (a host cannot take two places)."""
    if not names:
        return list(hosts)
    by_name = {h.name: h for h in hosts}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ConfigError(f"unknown host {unknown[0]!r} (inventory has: {', '.join(by_name)})", field=field)
    if len(set(names)) != len(names):
        raise ConfigError("a host is named twice", field=field)
    return [by_name[n] for n in names]


def _merge(index: int, host: Host, defaults: HostSettings, up_hcas: tuple[str, ...] | None = None) -> HostView:
    def pick(own, inherited):
        return own if own is not None else inherited

    hcas = pick(host.hcas, defaults.hcas)
    return HostView(
        name=host.name,
        address=host.address,
        role=host.role,
        index=index,
        ssh_user=pick(host.ssh.user, defaults.ssh.user),
        ssh_port=pick(host.ssh.port, defaults.ssh.port),
        identity_file=pick(host.ssh.identity_file, defaults.ssh.identity_file),
        proxy_jump=pick(host.ssh.proxy_jump, defaults.ssh.proxy_jump),
        nvme_path=pick(host.nvme_path, defaults.nvme_path) or DEFAULT_NVME_PATH,
        fabric_addresses=tuple(host.fabric_addresses) or _derived_fabric_addresses(
            index, pick(host.fabric_subnet, defaults.fabric_subnet), pick(host.fabric_interfaces, defaults.fabric_interfaces)),
        fabric_interfaces=tuple(pick(host.fabric_interfaces, defaults.fabric_interfaces) or ()),
        hcas=(up_hcas or ()) if hcas == "up" else tuple(hcas or ()),
        hcas_up=hcas == "up",
        fabric_subnet=pick(host.fabric_subnet, defaults.fabric_subnet),
    )


def parse_inventory(doc: LocatedYaml) -> LoadedInventory:
    if not isinstance(doc.data, dict):
        raise ConfigError("an inventory is a YAML mapping with a 'hosts:' list", file=doc.file, line=doc.line_of(()))
    try:
        model = Inventory.model_validate(doc.data)
    except ValidationError as err:
        located = _find_located_error(err)
        if located is not None:
            raise config_error([ConfigError(message, file=doc.file, field=format_loc(loc), line=doc.line_of(loc))
                                for loc, message in [(located.loc, str(located)), *located.more]]) from None
        raise validation_error(err, doc) from None
    _check_named_files(model, doc)
    return LoadedInventory(model=model, path=doc.file)


def _check_named_files(model: "Inventory", doc: LocatedYaml) -> None:
    """known_hosts and every identity_file: a regular file of bounded size where one exists (a FIFO
    would hang the connection, /dev/zero fill the memory, a folder fail deep inside paramiko)."""
    named = [(("known_hosts",), model.known_hosts), (("defaults", "ssh", "identity_file"), model.defaults.ssh.identity_file)]
    named += [(("hosts", i, "ssh", "identity_file"), h.ssh.identity_file) for i, h in enumerate(model.hosts) if h.ssh]
    for loc, path in named:
        if not path:
            continue
        try:
            check_user_file(path)
        except UserFileError as err:
            raise ConfigError(f"{path} {err}", file=doc.file, field=format_loc(loc), line=doc.line_of(loc)) from None


def _find_located_error(err: ValidationError) -> _LocatedError | None:
    for entry in err.errors():
        ctx_error = (entry.get("ctx") or {}).get("error")
        if isinstance(ctx_error, _LocatedError):
            return ctx_error
    return None


def resolve_inventory_path(cli_value: str | None) -> str:
    """``--inventory``, then ``$SPARKCTL_INVENTORY``, then ``./inventory.yaml``, then the per-user
    one (``sparkctl init`` writes it); none: an error saying how to make one."""
    if cli_value:
        return cli_value
    if os.environ.get("SPARKCTL_INVENTORY"):
        return os.environ["SPARKCTL_INVENTORY"]
    if os.path.exists("inventory.yaml"):
        return "inventory.yaml"
    per_user = userconfig.default_inventory()
    if per_user is not None:
        return str(per_user)
    raise userconfig.no_inventory_error(["-i", "$SPARKCTL_INVENTORY", "./inventory.yaml",
                                         str(userconfig.config_dir() / userconfig.INVENTORY_FILE)])


def load_inventory(path: str | Path) -> LoadedInventory:
    return parse_inventory(load_yaml_file(path))



FIRST_FABRIC_OFFSET = 11
TWIN_FABRIC_OFFSET = 100
DEFAULT_FABRIC_PREFIX = 24


def _derived_fabric_addresses(index: int, subnet: str | None, interfaces) -> tuple[str, ...]:
    """The fabric_subnet rule (see HostSettings) for a host that lists no fabric_addresses."""
    if not subnet or not interfaces:
        return ()
    net = ipaddress.ip_network(subnet)
    return tuple(str(net.network_address + FIRST_FABRIC_OFFSET + index + TWIN_FABRIC_OFFSET * k)
                 for k in range(len(interfaces)))


def fabric_plan(host: HostView) -> list[tuple[str, str]]:
    """(interface, "address/prefix") for each fabric interface of ``host`` that has an address."""
    prefix = ipaddress.ip_network(host.fabric_subnet).prefixlen if host.fabric_subnet else DEFAULT_FABRIC_PREFIX
    return [(name, f"{address}/{prefix}") for name, address in zip(host.fabric_interfaces, host.fabric_addresses)]
