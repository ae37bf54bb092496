"""The one place that builds an ``ssh`` command line, and how a bulk stream reaches a host.

Two kinds of argv: this machine's ssh client reaching a host (``client_argv``, for the bulk
streams that measured faster over OpenSSH than over paramiko, see bench/distribute_transport.py),
and one host reaching another over the fabric (``peer_argv``: the relay of ``distribute --from``,
model sync's sender, doctor's ``peers`` check). Both are argv lists, never a shell line, with
StrictHostKeyChecking=yes and BatchMode: a host key is pinned, by the inventory's known_hosts
here or by the keys this machine verified (written to a file the peer command names) there.

A route is where a stream connects: a host's fabric address when this machine's ssh greets us
there (HostKeyAlias keeps the key check on the management name), else the management address.
``choose_routes`` probes every host at once (a dead fabric address costs one timeout in all).
"""

from __future__ import annotations

import math
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

from sparkctl.remote.argv import join_argv

# AES-GCM first: with AES instructions (x86 AES-NI, Arm's crypto extensions on the GB10) it streamed
# 419 MiB/s here against 311 MiB/s for OpenSSH's default chacha20 (bench/distribute_transport.py).
BULK_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr"

# No prompts, strict host keys, fail fast on a dead peer, no compression.
BULK_SSH_OPTIONS = ["-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10",
                    "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "Compression=no",
                    "-o", "LogLevel=ERROR", "-o", "ClearAllForwardings=yes", "-c", BULK_CIPHERS]



def bulk_ssh_options(connect_timeout: float = 10.0) -> list[str]:
    """BULK_SSH_OPTIONS with the connect timeout asked for (``--connect-timeout``; ssh takes whole
    seconds, so a fraction is rounded up)."""
    return [f"ConnectTimeout={max(1, math.ceil(connect_timeout))}" if o == "ConnectTimeout=10" else o
            for o in BULK_SSH_OPTIONS]


SSH_FAILED = 255  # what the ssh client exits with when the connection itself failed
# In a peer argv: the known-hosts file the agent on the sending host writes the verified keys to.
KNOWN_HOSTS_PLACEHOLDER = "{known_hosts}"
ROUTE_PROBE_SECONDS = 1.0


@dataclass(frozen=True)
class Route:
    """How a stream reaches a host: the SSH target (management address) and where to connect."""

    name: str
    target: object  # sparkctl.remote.target.SSHTarget
    address: str
    via_fabric: bool = False

    def host_key_alias(self) -> str | None:
        if not self.via_fabric:
            return None
        port = self.target.port or 22
        return self.target.address if port == 22 else f"[{self.target.address}]:{port}"


def reachable(address: str, port: int, timeout: float = ROUTE_PROBE_SECONDS) -> bool:
    """True when an SSH server greets us at ``address:port`` within ``timeout`` seconds in all (a bare
    TCP connect is not enough: a proxy on the default route may accept any connection)."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            sock.settimeout(remaining)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def choose_route(name: str, target, fabric_addresses: tuple[str, ...], transport: str = "openssh",
                 probe: Callable[[str, int], bool] = reachable) -> Route:
    """The fabric address when this machine reaches its sshd there (the host key is still checked
    under the management name: HostKeyAlias), else the management address. ``transport`` is
    either: both honour the alias."""
    if not getattr(target, "proxy_jump", None):
        port = target.port or 22
        for address in fabric_addresses:
            if address != target.address and probe(address, port):
                return Route(name, target, address, via_fabric=True)
    return Route(name, target, target.address)


def choose_routes(hosts: Sequence[tuple[str, object, tuple[str, ...]]],
                  probe: Callable[[str, int], bool] = reachable) -> dict[str, Route]:
    """``choose_route`` for every (name, target, fabric addresses) at once, in parallel."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(hosts)), thread_name_prefix="sparkctl-route") as threads:
        routes = threads.map(lambda h: choose_route(h[0], h[1], h[2], probe=probe), hosts)
        return {route.name: route for route in routes}


def _quote_paths(paths: list[str]) -> str:
    return " ".join(f'"{p}"' if " " in p else p for p in paths)


def client_argv(route: Route, remote: Sequence[str], connect_timeout: float = 10.0) -> list[str]:
    """This machine's ssh client running ``remote`` on ``route`` (no local shell involved): the
    inventory's known_hosts and ~/.ssh/known_hosts, its identity, port, user and ProxyJump."""
    target = route.target
    argv = ["ssh", *bulk_ssh_options(connect_timeout)]
    known = [p for p in (target.known_hosts, os.path.expanduser("~/.ssh/known_hosts")) if p]
    argv += ["-o", "UserKnownHostsFile=" + _quote_paths(known)]
    alias = route.host_key_alias()
    if alias:
        argv += ["-o", f"HostKeyAlias={alias}"]
    if target.port:
        argv += ["-p", str(target.port)]
    if target.user:
        argv += ["-l", target.user]
    if target.identity_file:
        argv += ["-i", os.path.expanduser(target.identity_file), "-o", "IdentitiesOnly=yes"]
    if target.proxy_jump:
        argv += ["-J", target.proxy_jump]
    return argv + ["--", route.address, join_argv(remote)]


def peer_options(host, target, alias: str, connect_timeout: float = 10.0) -> list[str]:
    """Options for reaching inventory ``host`` from another host: its fabric address, the other
    host's own keys or agent, the host key checked under ``alias`` (the known-hosts file is the
    caller's), ending ``-- ADDRESS`` (the remote command follows)."""
    options = [*bulk_ssh_options(connect_timeout), "-o", f"HostKeyAlias={alias}"]
    if target.port:
        options += ["-p", str(target.port)]
    if target.user:
        options += ["-l", target.user]
    return options + ["--", host.fabric_address]


def peer_argv(host, target, alias: str, remote: Sequence[str], connect_timeout: float = 10.0) -> list[str]:
    """The ssh command a sending host runs to reach ``host``'s ``remote`` over the fabric, trusting
    only the host keys this machine verified (the agent replaces KNOWN_HOSTS_PLACEHOLDER)."""
    return ["ssh", "-o", f"UserKnownHostsFile={KNOWN_HOSTS_PLACEHOLDER}", *peer_options(host, target, alias, connect_timeout),
            join_argv(remote)]


def known_hosts_lines(keys: dict) -> str:
    """known_hosts text for {name: paramiko key}: what a peer argv's placeholder file holds."""
    return "".join(f"{name} {key.get_name()} {key.get_base64()}\n" for name, key in keys.items())


# From the head: log in to a worker the way `distribute --from HEAD` will (BatchMode, its own keys,
# only the host key this machine verified, under HostKeyAlias) and run `true`. $1 is the
# known_hosts line, written to a temporary file that is removed afterwards.
_PEER_CHECK_SCRIPT = (
    'f=$(mktemp) || exit 97; printf "%s\\n" "$1" > "$f"; shift; '
    'ssh -o UserKnownHostsFile="$f" "$@" </dev/null; rc=$?; rm -f "$f"; exit $rc'
)


def peer_check_argv(known_hosts_line: str, host, target, alias: str) -> list[str]:
    """Run on one host: log in to ``host`` as ``peer_argv`` will, and run ``true``."""
    return ["sh", "-c", _PEER_CHECK_SCRIPT, "peer-ssh", known_hosts_line, *peer_options(host, target, alias), "true"]
