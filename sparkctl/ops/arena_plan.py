"""The single-box engine's memory plan: how many experts its arena holds, and what is left over.

The single-box engine's README ("Why it is built this way", "The numbers") sizes everything from
one box's ~121 GiB: the non-expert weights, the arena of resident experts, and what remains for
KV, activations and the CUDA context. A slot holds one routed expert: 3 x 2304 x 5120 weights at
FP4 (e2m1 + a UE8M0 scale per 32) is 18.8 MB; in the 3-bit codebook format (cb3) 14.48 MB. The
arena is given in GB (ARENA_GB) or, for FP4, in slots; with cb3 the keep fraction (PRUNE_KEEP)
picks ``ceil(keep x 384)`` experts per layer, which must fit in the arena.

Two refusals, both from what the README saw killed by the memory watchdog: a headroom below one
prefill chunk (~10 GB; the 44 % arena left 5.5 GB), and an arena at least as large as a killed
point's at a context beyond what that point is safe for (0.40 / 89.2 GB above ~80k tokens).
Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sparkctl.config.profile import Profile
from sparkctl.ops.plan import Fits

GB = 1e9
GIB = 1 << 30


@dataclass
class ArenaPlan(Fits):
    profile: str
    expert_format: str
    max_seq: int
    routed_experts: int
    slots_per_layer: int | None  # cb3: the keep-set per layer
    slots: int
    slot_mb: float
    arena_gb: float
    keep_set_gb: float | None  # cb3: what the keep-set needs
    visible_gb: float
    non_expert_gb: float
    runtime_gb: float
    prefill_chunk_gb: float
    min_free_gib: float
    all_experts_fp4_gb: float
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def resident_fraction(self) -> float:
        return self.slots / self.routed_experts

    @property
    def headroom_gb(self) -> float:
        return self.visible_gb - self.non_expert_gb - self.runtime_gb - self.arena_gb

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "engine": "single-box",
            "fits": self.fits,
            "expert_format": self.expert_format,
            "max_seq": self.max_seq,
            "routed_experts": self.routed_experts,
            "slots_per_layer": self.slots_per_layer,
            "slots": self.slots,
            "resident_pct": round(100 * self.resident_fraction, 1),
            "slot_mb": round(self.slot_mb, 2),
            "arena_gb": round(self.arena_gb, 1),
            "keep_set_gb": None if self.keep_set_gb is None else round(self.keep_set_gb, 1),
            "visible_gb": round(self.visible_gb, 1),
            "non_expert_gb": self.non_expert_gb,
            "runtime_gb": self.runtime_gb,
            "headroom_gb": round(self.headroom_gb, 1),
            "prefill_chunk_gb": self.prefill_chunk_gb,
            "min_free_gib": self.min_free_gib,
            "all_experts_fp4_gb": round(self.all_experts_fp4_gb, 1),
            "problems": self.problems,
            "notes": self.notes,
        }


def fp4_slot_bytes(sb) -> float:
    return sb.expert_weights * sb.fp4_bits_per_weight / 8


def plan_arena(profile: Profile) -> ArenaPlan:
    sb = profile.single_box
    if sb is None:
        raise ValueError(f"profile {profile.name} has no single_box: section")
    routed = sb.moe_layers * sb.experts_per_layer
    fp4_slot = fp4_slot_bytes(sb)
    per_layer = keep_set_gb = None
    if sb.expert_format == "cb3":
        slot = sb.cb3_slot_mb * 1e6
        # a tiny epsilon: 0.39 x 384 is 149.76 in binary floating point too, but 0.25 x 384 must stay 96
        per_layer = min(sb.experts_per_layer, math.ceil(sb.prune_keep * sb.experts_per_layer - 1e-9))
        slots = per_layer * sb.moe_layers
        keep_set_gb = slots * slot / GB
        arena = sb.arena_gb if sb.arena_gb is not None else keep_set_gb
    else:
        slot = fp4_slot
        if sb.arena_slots is not None:
            slots = sb.arena_slots
            arena = slots * slot / GB
        else:
            slots = int(sb.arena_gb * GB // slot)
            arena = sb.arena_gb
        slots = min(slots, routed)
    plan = ArenaPlan(
        profile=profile.name, expert_format=sb.expert_format, max_seq=profile.max_model_len, routed_experts=routed,
        slots_per_layer=per_layer, slots=slots, slot_mb=slot / 1e6, arena_gb=arena, keep_set_gb=keep_set_gb,
        visible_gb=sb.visible_gib * GIB / GB, non_expert_gb=sb.non_expert_gb, runtime_gb=sb.runtime_gb,
        prefill_chunk_gb=sb.prefill_chunk_gb, min_free_gib=sb.min_free_gib, all_experts_fp4_gb=routed * fp4_slot / GB,
    )
    # The README rounds arena sizes to 0.1 GB: a keep-set within that rounding fits.
    if keep_set_gb is not None and keep_set_gb > arena + 0.05:
        plan.problems.append(
            f"the keep-set ({per_layer} experts a layer at PRUNE_KEEP {sb.prune_keep:g}) needs {keep_set_gb:.1f} GB, "
            f"more than ARENA_GB {arena:g}; raise single_box.arena_gb or lower single_box.prune_keep")
    if plan.headroom_gb < sb.prefill_chunk_gb:
        plan.problems.append(
            f"an arena of {arena:.1f} GB leaves {plan.headroom_gb:.1f} GB, less than one prefill chunk needs "
            f"(~{sb.prefill_chunk_gb:g} GB): the README saw the 44 % arena that left 5.5 GB killed by the memory "
            "watchdog on its first request; lower single_box.arena_gb / prune_keep")
    for point in sb.measured:
        if point.outcome != "killed" or arena < point.arena_gb - 0.05:
            continue
        limit = point.safe_below_tokens
        if limit is None or profile.max_model_len > limit:
            context = f" at MAX_SEQ {profile.max_model_len:,} (safe only below {limit:,} tokens)" if limit else ""
            plan.problems.append(
                f"ARENA_GB {arena:g} is at or above a combination the README saw killed{context}: PRUNE_KEEP "
                f"{point.prune_keep:g} with ARENA_GB {point.arena_gb:g} at MAX_SEQ {point.max_seq:,} ({point.note})")
    served = [p for p in sb.measured if p.outcome == "served" and p.max_seq >= profile.max_model_len]
    if not plan.problems and not any(arena <= p.arena_gb + 0.05 for p in served):
        best = max(served, key=lambda p: p.arena_gb, default=None)
        plan.notes.append(
            f"no measured point served an arena this large at MAX_SEQ {profile.max_model_len:,}"
            + (f"; the largest that did: PRUNE_KEEP {best.prune_keep:g} with ARENA_GB {best.arena_gb:g}" if best else ""))
    return plan


def format_arena_plan(plan: ArenaPlan) -> str:
    lines = [f"arena plan for {plan.profile} (the single-box engine, one box; GB = 10^9 bytes)", ""]
    if plan.slots_per_layer is not None:
        lines.append(f"  keep-set        {plan.slots_per_layer} experts a layer = {plan.slots:,} slots = "
                     f"{100 * plan.resident_fraction:.1f} % of {plan.routed_experts:,} routed experts "
                     f"({plan.expert_format}, {plan.slot_mb:.2f} MB each: {plan.keep_set_gb:.1f} GB)")
    else:
        lines.append(f"  resident set    {plan.slots:,} slots = {100 * plan.resident_fraction:.1f} % of "
                     f"{plan.routed_experts:,} routed experts ({plan.expert_format}, {plan.slot_mb:.1f} MB each); "
                     "every miss is streamed from NVMe")
    lines += [
        f"  {'visible':<16}{plan.visible_gb:>7.1f}",
        f"  {'non-expert':<16}{plan.non_expert_gb:>7.1f}",
        f"  {'arena':<16}{plan.arena_gb:>7.1f}",
        f"  {'runtime':<16}{plan.runtime_gb:>7.1f}   KV at MAX_SEQ {plan.max_seq:,}, activations, CUDA context",
        f"  {'headroom':<16}{plan.headroom_gb:>7.1f}   one prefill chunk needs ~{plan.prefill_chunk_gb:g}",
        f"  (all {plan.routed_experts:,} experts at FP4 would be {plan.all_experts_fp4_gb:.1f} GB; the start guard "
        f"wants MemAvailable >= {plan.min_free_gib:g} GiB)",
        "",
    ]
    lines += [f"note: {n}" for n in plan.notes]
    lines += ["fits"] if plan.fits else [f"refused: {p}" for p in plan.problems]
    return "\n".join(lines)
