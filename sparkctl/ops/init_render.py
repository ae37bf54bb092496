"""The text of the inventory ``sparkctl init`` writes: the hosts' answers, every field commented.

The same shape and comments as inventory.example.yaml (which ships in the wheel), so a user who
later reads the example recognises every line. Values are written with yaml.safe_dump's quoting.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from sparkctl.ops.init import DiscoveredHost, SshChoice


def _scalar(value) -> str:
    """One YAML scalar (JSON's quoting is valid YAML and safe for any string)."""
    text = str(value)
    if text and all(ch.isalnum() or ch in "._-/~@" for ch in text) and text.lower() not in (
            "yes", "no", "on", "off", "true", "false", "null", "~"):
        return text
    return json.dumps(text)


def _flow(values) -> str:
    return "[" + ", ".join(_scalar(v) for v in values) + "]"


def _common(facts: list[DiscoveredHost], attribute: str):
    """The value every reachable host shares, else None (then each host gets its own line)."""
    values = {tuple(getattr(f, attribute)) for f in facts if f.error is None}
    return list(values.pop()) if len(values) == 1 else None


def render_inventory(facts: list[DiscoveredHost], *, cluster: str, ssh: SshChoice, nvme_path: str,
                     paths: dict[str, str], command: str) -> str:
    interfaces, hcas = _common(facts, "interfaces"), _common(facts, "hcas")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# sparkctl inventory, written by `{command}` on {when}.",
        "# Every field is explained in inventory.example.yaml (`sparkctl init --example` writes it);",
        "# `sparkctl inventory check` validates this file, `sparkctl doctor` checks the hosts.",
        "",
        f"cluster: {_scalar(cluster)}",
        "",
    ]
    lines += ["# Host keys are checked against ~/.ssh/known_hosts and this file; unknown or changed keys",
              "# are refused (--accept-new-host-keys records unknown ones, as OpenSSH's accept-new)."]
    lines.append(f"known_hosts: {_scalar(ssh.known_hosts)}" if ssh.known_hosts else "# known_hosts: ~/.ssh/known_hosts")
    lines += ["", "# Settings every host inherits unless it sets its own.", "defaults:", "  ssh:"]
    lines += _ssh_lines(ssh)
    lines.append(f"  nvme_path: {_scalar(nvme_path)}               # local NVMe: Engram shards, image layers, checkpoint copy")
    lines += _fabric_lines("  ", interfaces, hcas, every_host=True)
    lines += ["", "# Where the data lives on every host (bind-mounted into the engine container).", "paths:"]
    lines += [f"  {key}: {_scalar(value)}" for key, value in paths.items()]
    lines += ["", "# One entry per box; the head (rank 0) is first. `address`: what sparkctl reaches over SSH;",
              "# `fabric_addresses`: the ConnectX-7 addresses the ranks use to talk to each other.", "hosts:"]
    for index, host in enumerate(facts):
        lines += _host_lines(host, index, interfaces, hcas)
    return "\n".join(lines) + "\n"


def _ssh_lines(ssh: SshChoice) -> list[str]:
    shown = [("user", ssh.user, "unset -> ~/.ssh/config, then your local user name"),
             ("port", ssh.port, "unset -> ~/.ssh/config, then 22"),
             ("identity_file", ssh.identity_file, "unset -> ~/.ssh/config, ssh-agent, default keys")]
    lines = []
    for key, value, note in shown:
        lines.append(f"    {key}: {_scalar(value)}  # {note}" if value is not None else f"    # {key}:  ({note})")
    lines.append("    # proxy_jump: bastion  (like OpenSSH's ProxyJump)")
    if all(value is None for _, value, _ in shown):
        lines.insert(0, "    {}  # all from ~/.ssh/config and OpenSSH's defaults")
    return lines


def _fabric_lines(indent: str, interfaces, hcas, *, every_host: bool) -> list[str]:
    lines = []
    if interfaces is not None and interfaces:
        lines.append(f"{indent}fabric_interfaces: {_flow(interfaces)}  # the Up ConnectX-7 netdevs (ibdev2netdev)")
    elif every_host:
        lines.append(f"{indent}# fabric_interfaces: [enp1s0f0np0]  (no Up RDMA port answered: fill in, see ibdev2netdev)")
    if hcas is not None and hcas:
        lines.append(f"{indent}hcas: {_flow(hcas)}  # RDMA devices for NCCL_IB_HCA (`hcas: up`: every Up one)")
    elif every_host:
        lines.append(f"{indent}# hcas: [rocep1s0f0]  (no Up RDMA device answered: fill in, or `hcas: up`)")
    return lines


def _host_lines(host: DiscoveredHost, index: int, interfaces, hcas) -> list[str]:
    lines = [f"  - name: {_scalar(host.name)}"]
    if host.error:
        lines[0] += "  # NOT REACHED by init: " + host.error.replace("\n", " ")[:160]
    lines.append(f"    address: {_scalar(host.spec.address)}")
    if index == 0:
        lines.append("    role: head                       # rank 0: serves the API, hosts the rendezvous")
    if host.fabric_addresses:
        lines.append(f"    fabric_addresses: {_flow(host.fabric_addresses)}")
    elif host.error is None:
        lines.append("    # fabric_addresses: []  (no IPv4 address on an Up fabric port)")
    if host.error is None:
        if interfaces is None and host.interfaces:
            lines.append(f"    fabric_interfaces: {_flow(host.interfaces)}")
        if hcas is None and host.hcas:
            lines.append(f"    hcas: {_flow(host.hcas)}")
    return lines
