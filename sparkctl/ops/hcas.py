"""``hcas: up`` made concrete: the RDMA devices that are Up on each host, asked once per command.

A cabled ConnectX-7 port of a GB10 is two Up devices (the twins); NCCL_IB_HCA must name both or
NCCL uses half the fabric. With ``hcas: up`` the inventory does not list them: the commands that
render for the hosts (serve, status, up, render) ask each host (``ibdev2netdev``) and render with
what is Up, so both twins land in NCCL_IB_HCA. A host that cannot be asked keeps NCCL_IB_HCA unset (NCCL
then picks the active ports itself). ``render`` asks no host unless ``--ask-hosts``: it then says, per
host, what it rendered or why NCCL_IB_HCA is not in its files; without, one line names the hosts
it did not resolve and how to ask.
"""

from __future__ import annotations

import dataclasses

from sparkctl.commands import facts
from sparkctl.ops.steps import ask
from sparkctl.remote.pool import fan_out


def resolve_up_hcas(inventory, pool):
    """``inventory`` with every ``hcas: up`` host's Up RDMA devices filled in (unchanged when none says up)."""
    return ask_up_hcas(inventory, pool)[0]


def ask_up_hcas(inventory, pool) -> tuple[object, dict[str, str]]:
    """As ``resolve_up_hcas``, and why each host that says up could not be asked (host -> error)."""
    wanting = [h for h in inventory.hosts if h.hcas_up]
    if not wanting:
        return inventory, {}
    results = fan_out([inventory.ssh_target(h) for h in wanting], lambda conn: ask(conn, facts.RDMA_PORTS), pool=pool)
    found = tuple((r.name, tuple(p.device for p in r.value if p.up)) for r in results if r.ok)
    return dataclasses.replace(inventory, up_hcas=found), {r.name: r.error for r in results if not r.ok}


AT_START = "serve and up set it when they start, to the RDMA devices Up on each host then"


def render_notes(hosts, missed: dict[str, str], *, asked: bool) -> list[str]:
    """What ``render`` says about its ``hcas: up`` hosts: the devices it found Up on each (NCCL_IB_HCA
    as rendered), or why NCCL_IB_HCA is not in the files (unreachable, none Up); not asked (render's
    default: it asks no host), one line naming them all and how to ask."""
    wanting = [h for h in hosts if h.hcas_up]
    if not asked:
        if not wanting:
            return []
        return [f"hcas: up on {', '.join(h.name for h in wanting)}: NCCL_IB_HCA is not rendered (render asks no "
                f"host; --ask-hosts asks each which RDMA devices are Up); {AT_START}"]
    notes = []
    for host in wanting:
        if host.hcas:
            notes.append(f"{host.name}: hcas: up -> NCCL_IB_HCA={','.join(host.hcas)} (the RDMA devices Up there "
                         f"now; {AT_START})")
        elif host.name in missed:
            notes.append(f"{host.name}: hcas: up: NCCL_IB_HCA is not rendered (the host could not be asked: "
                         f"{missed[host.name]}); {AT_START}")
        else:
            notes.append(f"{host.name}: hcas: up: no RDMA device is Up there, so NCCL_IB_HCA is not rendered "
                         "(`sparkctl doctor` names the port); NCCL then falls back to sockets")
    return notes
