"""``pack-engram``: plan which rows go to which host (pure), then cut and ship them.

Plan: config.json -> layout (primes, heads, per-rank rows) -> hosts by rank (``select_hosts``)
-> shard plans (byte ranges of the safetensors files) when the tensors are present.
Execute: see ``pack`` and ``verify`` below (they use ``sparkctl.remote``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkctl.engram.layout import EngramConfig, EngramLayout, LayoutError, plan_layout
from sparkctl.engram.shards import ShardPlan
from sparkctl.errors import ConfigError


@dataclass
class PackPlan:
    profile: str
    checkpoint: str
    config: EngramConfig
    layout: EngramLayout
    hosts: list  # HostView per rank, rank order
    engram_dir: str
    shards: list[ShardPlan] | None  # None: config only (no tensors to cut)

    @property
    def tp(self) -> int:
        return self.layout.tp

    def shard(self, layer: int, rank: int) -> ShardPlan | None:
        for s in self.shards or ():
            if s.layer == layer and s.rank == rank:
                return s
        return None

    def shards_of_rank(self, rank: int) -> list[ShardPlan]:
        return [s for s in self.shards or () if s.rank == rank]


def layout_for(config: EngramConfig, tp: int) -> EngramLayout:
    try:
        return plan_layout(config, tp)
    except LayoutError as err:
        raise ConfigError(str(err)) from None


def plan_pack(profile, inventory, wanted_hosts: list[str] | None, checkpoint: str) -> tuple[PackPlan, str | None]:
    """The whole pack, without I/O beyond reading config.json and the safetensors headers."""
    from sparkctl.config.profile import select_hosts
    from sparkctl.engram.config import load_engram_config
    from sparkctl.engram.safetensors_index import is_engram_tensor, load_tensors
    from sparkctl.engram.shards import plan_shards

    config = load_engram_config(checkpoint)
    layout = layout_for(config, profile.tensor_parallel)
    hosts, note = select_hosts(profile, inventory.hosts, wanted_hosts)
    root = str(Path(checkpoint).resolve())
    tensors = load_tensors(root, lambda name: is_engram_tensor(name, config.layer_ids))
    shards = plan_shards(layout, tensors, root, config.source) if tensors is not None else None
    plan = PackPlan(
        profile=profile.name, checkpoint=str(checkpoint), config=config, layout=layout, hosts=list(hosts),
        engram_dir=inventory.model.paths.engram_dir, shards=shards,
    )
    return plan, note


def layout_json(plan: PackPlan) -> dict:
    """The ``--dry-run --json`` document (shape fixed by issue 5)."""
    layers = []
    for layer in plan.layout.layers:
        ranks = []
        for rank, rows in enumerate(layer.ranks):
            shard = plan.shard(layer.layer, rank)
            ranks.append({
                "rank": rank,
                "host": plan.hosts[rank].name,
                "start": rows.start,
                "end": rows.end,
                "bytes": shard.size if shard is not None else None,
            })
        layers.append({"layer": layer.layer, "rows": layer.rows, "heads": list(layer.heads), "ranks": ranks})
    return {"tp": plan.tp, "layers": layers}


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def format_layout(plan: PackPlan) -> str:
    lines = [f"Engram layout for TP{plan.tp} ({plan.checkpoint}), shards go to {plan.engram_dir} on each host"]
    for layer in plan.layout.layers:
        per_rank = layer.ranks[0].end_head - layer.ranks[0].first_head
        lines.append(f"layer {layer.layer}: {layer.rows} rows, {len(layer.heads)} hash heads, {per_rank} per rank")
        for rank, rows in enumerate(layer.ranks):
            shard = plan.shard(layer.layer, rank)
            lines.append(
                f"  rank {rank}  {plan.hosts[rank].name:<16} rows [{rows.start}, {rows.end})  "
                f"heads [{rows.first_head}, {rows.end_head})  {human_bytes(shard.size if shard else None)}"
            )
    if plan.shards is None:
        lines.append("(config only: no safetensors in the checkpoint directory, so no byte sizes)")
    return "\n".join(lines)
