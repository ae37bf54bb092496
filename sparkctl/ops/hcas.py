"""``hcas: up`` made concrete: the RDMA devices that are Up on each host, asked once per command.

A cabled ConnectX-7 port of a GB10 is two Up devices (the twins); NCCL_IB_HCA must name both or
NCCL uses half the fabric. With ``hcas: up`` the inventory does not list them: the commands that
render for the hosts (serve, status, up) ask each host (``ibdev2netdev``) and render with what is
Up, so both twins land in NCCL_IB_HCA. A host that cannot be asked keeps NCCL_IB_HCA unset (NCCL
then picks the active ports itself).
"""

from __future__ import annotations

import dataclasses


def resolve_up_hcas(inventory, pool):
    """``inventory`` with every ``hcas: up`` host's Up RDMA devices filled in (unchanged when none says up)."""
    from sparkctl.commands import facts
    from sparkctl.ops.steps import ask
    from sparkctl.remote.pool import fan_out

    wanting = [h for h in inventory.hosts if h.hcas_up]
    if not wanting:
        return inventory
    results = fan_out([inventory.ssh_target(h) for h in wanting], lambda conn: ask(conn, facts.RDMA_PORTS), pool=pool)
    found = tuple((r.name, tuple(p.device for p in r.value if p.up)) for r in results if r.ok)
    return dataclasses.replace(inventory, up_hcas=found)
