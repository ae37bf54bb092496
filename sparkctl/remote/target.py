"""Where a command goes: one SSH destination, as the inventory (or a caller) describes it.

Fields left ``None`` are filled from ``~/.ssh/config`` (User, Port, IdentityFile, ProxyJump), then
from OpenSSH's defaults (local user name, port 22, ssh-agent and ~/.ssh/id_* keys).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SSHTarget:
    name: str  # the inventory's name for the host; used in every message
    address: str  # what we connect to (IP or DNS name); never replaced by ssh_config's HostName
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None  # an extra known_hosts file (the inventory's), besides ~/.ssh/known_hosts
    proxy_jump: str | None = None  # OpenSSH ProxyJump syntax: [user@]host[:port][,[user@]host[:port]...]
    # The name the host key is checked under when ``address`` is another of the host's addresses
    # (its fabric address): OpenSSH's HostKeyAlias, e.g. the management address.
    host_key_alias: str | None = None

    def __str__(self) -> str:
        return self.name
