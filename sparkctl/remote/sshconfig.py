"""How to reach a target: the target's own fields, then ~/.ssh/config, then OpenSSH's defaults.

Read from the config (looked up by the target's name, then by its address): User, Port,
IdentityFile, ProxyJump, HostKeyAlias. The address itself always comes from the target, so the
inventory stays the one truth about where a host is. Jump hosts, which are named in ProxyJump
specs, do get the config's HostName.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass

import paramiko

from sparkctl.remote.result import RemoteError
from sparkctl.remote.target import SSHTarget

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


@dataclass(frozen=True)
class Resolved:
    address: str
    port: int
    user: str
    identity_files: tuple[str, ...]  # explicit ones (target, then config); missing files included
    default_identities: bool  # no explicit identity: also try ~/.ssh/id_* (after the agent)
    proxy_jump: str | None
    host_key_alias: str | None


def default_config_path() -> str:
    return os.path.expanduser("~/.ssh/config")


def load_config(path: str | None, host: str) -> paramiko.SSHConfig | None:
    path = os.path.expanduser(path) if path else default_config_path()
    if not os.path.exists(path):
        return None
    try:
        return paramiko.SSHConfig.from_path(path)
    except Exception as err:  # paramiko raises a mix of types for bad configs
        raise RemoteError(host, "other", f"cannot read ssh config {path}: {err}") from None


def _lookup(config: paramiko.SSHConfig | None, names: list[str], host: str) -> dict:
    if config is None:
        return {}
    merged: dict = {}
    for name in names:
        try:
            found = config.lookup(name)
        except Exception as err:  # e.g. "Match exec" without its optional dependency
            raise RemoteError(host, "other", f"cannot evaluate ~/.ssh/config for {name}: {err}") from None
        for key, value in found.items():
            merged.setdefault(key, value)
    return merged


def resolve(target: SSHTarget, ssh_config_path: str | None = None) -> Resolved:
    config = load_config(ssh_config_path, target.name)
    names = [target.name] if target.name == target.address else [target.name, target.address]
    options = _lookup(config, names, target.name)
    port = target.port
    if port is None and options.get("port"):
        try:
            port = int(options["port"])
        except ValueError:
            raise RemoteError(target.name, "other", f"~/.ssh/config gives a bad Port {options['port']!r}") from None
    explicit: list[str] = []
    if target.identity_file:
        explicit.append(os.path.expanduser(target.identity_file))
    for path in options.get("identityfile", []) or []:
        path = os.path.expanduser(path)
        if path not in explicit:
            explicit.append(path)
    jump = target.proxy_jump or options.get("proxyjump")
    if jump and jump.lower() == "none":
        jump = None
    return Resolved(
        address=target.address,
        port=port or 22,
        user=target.user or options.get("user") or getpass.getuser(),
        identity_files=tuple(explicit),
        default_identities=not explicit,
        proxy_jump=jump,
        host_key_alias=target.host_key_alias or options.get("hostkeyalias"),
    )


_HOP_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<port>\d+))?\Z")


def jump_hops(spec: str, via: SSHTarget, ssh_config_path: str | None = None) -> list[SSHTarget]:
    """The hops of a ProxyJump spec, first to last, as SSHTargets (HostName from the config applies).

    A hop that names no identity in the config borrows the destination's identity file, and every
    hop is checked against the destination's known_hosts file too.
    """
    config = load_config(ssh_config_path, via.name)
    hops = []
    for part in spec.split(","):
        part = part.strip()
        match = _HOP_RE.match(part.removeprefix("ssh://"))
        if not match:
            raise RemoteError(via.name, "other", f"cannot parse ProxyJump hop {part!r} (want [user@]host[:port])")
        host = match["host"].strip("[]")
        options = _lookup(config, [host], via.name)
        hops.append(
            SSHTarget(
                name=host,
                address=options.get("hostname") or host,
                port=int(match["port"]) if match["port"] else None,
                user=match["user"],
                identity_file=None if options.get("identityfile") else via.identity_file,
                known_hosts=via.known_hosts,
                proxy_jump=None,  # a hop's own ProxyJump would loop through the same chain; chains are explicit
            )
        )
    return hops
