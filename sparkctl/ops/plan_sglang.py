"""SGLang's own memory accounting on a unified-memory box (the SGLang line; recipes/_dsv41-sglang.yaml).

On a GB10 host RAM is GPU memory, so SGLang sizes its KV pool from what the OS still has available
once the weights are in (MemAvailable): it keeps back 5 % of that and 0.1 GB, and the part of the
node that the memory fraction leaves outside the static pool. What is left is the budget the boot
line reports (``DSV4 memory calculation: bytes_per_full_token=1670.75 ... full_token=N``); a KV
pin (``--max-total-tokens``) above it dies or is clamped, so the plan refuses it. Outside the static
pool lives the prefill transient of the indexer, ~14 B x chunk x prefix at its peak (bounded by
the chunked indexer, DSV41_INDEXER_CHUNKED=1), which must fit there too.

Every figure is per rank; rank 0 (the head) also carries the HTTP server, tokenizer and
detokenizer, so it is the tighter one and the one shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.config.profile import Profile
from sparkctl.ops.plan import MemoryPlan, Term, _breaking_term

GB = 1e9
GiB = float(1 << 30)
MiB = float(1 << 20)
# The indexer's peak across layers is 14 B = 3.5 ratio-1 layers x 4 B of fp32 logits per (chunk row,
# prefix token); the chunked indexer caps each layer's logits at its budget.
_FP32 = 4


@dataclass
class RankBudget:
    """One rank's figures (GB)."""

    terms: dict[str, float]  # what comes out of the node before the KV pool
    free_after_weights: float  # MemAvailable once weights, buffers and runtime are in
    kv_budget: float  # what SGLang offers the KV pool
    outside_pool: float  # what the memory fraction leaves outside the static pool for transients


def _env_int(profile: Profile, name: str, default: int) -> int:
    try:
        return int(profile.env.get(name, default))
    except ValueError:
        return default


def ll128_enabled(proto: str | None) -> bool:
    """NCCL_PROTO: unset (all protocols), a list ('LL,Simple'), or an exclusion ('^LL128')."""
    if not proto:
        return True
    names = {p.strip().upper() for p in proto.lstrip("^").split(",")}
    return ("LL128" not in names) if proto.startswith("^") else ("LL128" in names)


def nccl_pinned_gb(profile: Profile) -> tuple[float, str]:
    """NCCL's connection buffers in pinned host RAM, from the rendered NCCL settings."""
    s, nccl = profile.memory.sglang, profile.memory.nccl
    channels = _env_int(profile, "NCCL_MAX_NCHANNELS", s.nccl_connections_at_channels)
    buffsize = _env_int(profile, "NCCL_BUFFSIZE", nccl.default_buffsize)
    ll128 = _env_int(profile, "NCCL_LL128_BUFFSIZE", s.nccl_ll128_default_bytes) if ll128_enabled(profile.env.get("NCCL_PROTO")) else 0
    peers = max(0, profile.tensor_parallel - 1)
    connections = s.nccl_connections * channels / s.nccl_connections_at_channels * peers / s.nccl_connections_at_peers
    per_connection = buffsize + ll128 + s.nccl_ll_mib * MiB
    detail = (f"{connections:.0f} connections ({channels} channels, {peers} peers) x "
              f"({buffsize / MiB:g} MiB Simple + {ll128 / MiB:g} MiB LL128 + {s.nccl_ll_mib:g} MiB LL)")
    return connections * per_connection / GB, detail


def weights_gb(profile: Profile) -> tuple[float, str]:
    s, tp = profile.memory.sglang, profile.tensor_parallel
    pad = s.dense_pad.get(tp, 1.0)
    gib = s.experts_gib / tp + s.dense_gib / tp * pad + s.draft_gib
    detail = f"experts {s.experts_gib:g} GiB / TP{tp} + dense {s.dense_gib:g} GiB / TP{tp}" + \
        (f" x {pad:g} (padded heads)" if pad != 1 else "") + f" + draft {s.draft_gib:g} GiB"
    return gib * GiB / GB, detail


def engram_gb(profile: Profile) -> tuple[float, float, str]:
    """(tables in memory, row cache, detail): on NVMe the tables cost nothing in memory, the optional
    row cache costs DSV41_CACHE_GIB per host."""
    cache = float(profile.env.get("DSV41_CACHE_GIB", 0) or 0) * GiB / GB
    if profile.engram.mode == "memory":
        return profile.memory.engram_total_gb / profile.tensor_parallel, cache, \
            f"{profile.memory.engram_total_gb:g} GB of tables / TP{profile.tensor_parallel} in host memory"
    return 0.0, cache, "Engram on local NVMe (packed shards): no tables in memory"


def rank_budget(profile: Profile, head: bool) -> RankBudget:
    s = profile.memory.sglang
    node = s.node_memory_gib * GiB / GB
    tables, cache, _ = engram_gb(profile)
    terms = {
        "weights": weights_gb(profile)[0],
        "engram_resident": tables,
        "engram_cache": cache,
        "nccl_buffers": nccl_pinned_gb(profile)[0],
        "runtime": s.runtime_gb,
        "head_extra": s.head_extra_gib * GiB / GB if head else 0.0,
    }
    free = node - sum(terms.values())
    kept_back = s.kept_back_fraction * free + s.kept_back_gb
    outside = (1 - profile.gpu_memory_utilization) * node
    terms["kept_back"] = kept_back
    return RankBudget(terms, free, free - kept_back - outside, outside - terms["head_extra"])


def prefill_transient_gb(profile: Profile) -> tuple[float, str]:
    """The indexer's per-chunk transient at a full-length prompt."""
    s = profile.memory.sglang
    chunk, prefix = profile.max_num_batched_tokens, profile.max_model_len
    raw = s.indexer_bytes_per_chunk_token * chunk * prefix
    detail = f"{s.indexer_bytes_per_chunk_token:g} B x chunk {chunk} x prefix {prefix:,}"
    if str(profile.env.get("DSV41_INDEXER_CHUNKED", "0")).strip().lower() not in ("", "0", "off", "false"):
        budget = _env_int(profile, "DSV41_INDEXER_LOGITS_BUDGET_BYTES", s.indexer_logits_budget_bytes)
        bounded = s.indexer_bytes_per_chunk_token / _FP32 * budget
        if bounded < raw:
            return bounded / GB, detail + f", bounded by the chunked indexer ({budget / GiB:g} GiB of logits per layer)"
    return raw / GB, detail


def plan_sglang(profile: Profile):
    """The MemoryPlan of an SGLang profile: the head's terms, its KV budget, the pin and the transient."""
    s, m = profile.memory.sglang, profile.memory
    head, worker = rank_budget(profile, head=True), rank_budget(profile, head=False)
    node = s.node_memory_gib * GiB / GB
    _, _, engram_detail = engram_gb(profile)
    details = {
        "weights": (weights_gb(profile)[1], "use more ranks (a higher tensor_parallel)"),
        "engram_resident": (engram_detail, "put Engram on NVMe: --set engram.mode=disk (the sglang-dsv41 image, pack-engram)"),
        "engram_cache": ("the overlay's row cache (DSV41_CACHE_GIB per host)", "lower DSV41_CACHE_GIB"),
        "nccl_buffers": (nccl_pinned_gb(profile)[1],
                         "cut NCCL's pinned buffers: --env NCCL_BUFFSIZE=1048576 --env NCCL_PROTO=^LL128 --env NCCL_MAX_NCHANNELS=8"),
        "runtime": ("CUDA context, torch and allocator", "nothing to set"),
        "head_extra": ("rank 0: HTTP server, tokenizer, detokenizer", "nothing to set"),
        "kept_back": (f"SGLang keeps {s.kept_back_fraction:.0%} of MemAvailable and {s.kept_back_gb:g} GB back",
                      "nothing to set"),
    }
    terms = [Term(name, gb, *details[name]) for name, gb in head.terms.items()]
    pin_tokens = profile.engine_args.get("max-total-tokens")
    kv_gb = head.kv_budget
    kv_tokens = max(0, int(kv_gb * GB // m.kv_bytes_per_token))
    plan = MemoryPlan(
        profile=profile.name, tensor_parallel=profile.tensor_parallel, unified_memory_gb=round(node, 2),
        gpu_memory_utilization=profile.gpu_memory_utilization, budget_gb=profile.gpu_memory_utilization * node,
        terms=terms, kv_cache_gb=kv_gb, kv_tokens=kv_tokens, max_model_len=profile.max_model_len,
        kv_needed_gb=profile.max_model_len * m.kv_bytes_per_token / GB, container_memory_gb=None,
    )
    transient, transient_detail = prefill_transient_gb(profile)
    plan.extra = {
        "free_after_weights_gb": {"head": round(head.free_after_weights, 2), "worker": round(worker.free_after_weights, 2)},
        "kv_budget_gb": {"head": round(head.kv_budget, 2), "worker": round(worker.kv_budget, 2)},
        "kv_pin_tokens": pin_tokens,
        "kv_pin_gb": None if pin_tokens is None else round(pin_tokens * m.kv_bytes_per_token / GB, 2),
        "outside_pool_gb": {"head": round(head.outside_pool, 2), "worker": round(worker.outside_pool, 2)},
        "prefill_transient_gb": round(transient, 2),
        "prefill_transient": transient_detail,
    }
    _judge(plan, profile, head, transient, transient_detail)
    return plan


def _judge(plan, profile: Profile, head: RankBudget, transient: float, transient_detail: str) -> None:
    """The problems, each naming its term: no KV at all, a pin above the budget, too short a pool,
    a transient larger than what stays outside the static pool."""
    m = profile.memory
    pin = profile.engine_args.get("max-total-tokens")
    if head.kv_budget <= 0:
        fixed = ("kept_back", "runtime", "head_extra")
        worst = _breaking_term([t for t in plan.terms if t.name not in fixed], -head.kv_budget)
        plan.breaking_term = worst
        plan.problems.append(f"SGLang's KV budget on the head is {head.kv_budget:.2f} GB (MemAvailable after weights "
                             f"{head.free_after_weights:.2f} GB, minus what it keeps back and "
                             f"{1 - profile.gpu_memory_utilization:.2f} x node outside the static pool); "
                             f"{worst.name} ({worst.gb:.1f} GB: {worst.detail}) breaks it — {worst.hint}")
    elif isinstance(pin, int) and pin * m.kv_bytes_per_token / GB > head.kv_budget:
        pin_gb = pin * m.kv_bytes_per_token / GB
        fits = int(head.kv_budget * GB // m.kv_bytes_per_token)
        plan.breaking_term = Term("kv_pin", pin_gb, f"{pin:,} tokens x {m.kv_bytes_per_token:,} B", "lower engine_args.max-total-tokens")
        plan.problems.append(f"kv_pin: engine_args.max-total-tokens {pin:,} needs {pin_gb:.2f} GB but SGLang's budget on the "
                             f"head is {head.kv_budget:.2f} GB ({fits:,} tokens): SGLang would refuse to start or clamp "
                             "the pool — lower the pin (not the memory fraction, which keeps the prefill transient safe)")
    elif not isinstance(pin, int) and plan.kv_tokens < profile.max_model_len:
        plan.breaking_term = max(plan.terms, key=lambda t: t.gb)
        plan.problems.append(f"KV budget of {plan.kv_cache_gb:.2f} GB holds {plan.kv_tokens:,} tokens, fewer than "
                             f"max_model_len {profile.max_model_len:,}")
    if transient > head.outside_pool:
        term = Term("prefill_transient", transient, transient_detail,
                    "set env DSV41_INDEXER_CHUNKED=1 (the chunked indexer) or lower max_num_batched_tokens")
        plan.breaking_term = plan.breaking_term or term
        plan.problems.append(f"prefill_transient: {transient_detail} = {transient:.1f} GB at a full-length prompt, but the "
                             f"memory fraction {profile.gpu_memory_utilization:g} leaves {head.outside_pool:.1f} GB outside "
                             f"the static pool on the head — {term.hint}")


def format_lines(plan) -> list[str]:
    """The SGLang figures `plan` prints under the terms."""
    x = plan.extra
    lines = [
        f"  {'free after weights':<19}{x['free_after_weights_gb']['head']:>6.2f}   MemAvailable once weights are in "
        f"(workers {x['free_after_weights_gb']['worker']:.2f})",
        f"  {'KV budget':<19}{x['kv_budget_gb']['head']:>6.2f}   what SGLang offers the pool on the head "
        f"(workers {x['kv_budget_gb']['worker']:.2f}); {plan.kv_tokens:,} tokens",
    ]
    if x["kv_pin_tokens"] is not None:
        margin = x["kv_budget_gb"]["head"] - x["kv_pin_gb"]
        lines.append(f"  {'KV pin':<19}{x['kv_pin_gb']:>6.2f}   --max-total-tokens {x['kv_pin_tokens']:,} "
                     f"(margin {margin:.2f} GB on the head)")
    lines.append(f"  {'prefill transient':<19}{x['prefill_transient_gb']:>6.2f}   {x['prefill_transient']} "
                 f"(outside the pool: {x['outside_pool_gb']['head']:.2f} GB on the head, "
                 f"margin {x['outside_pool_gb']['head'] - x['prefill_transient_gb']:.2f})")
    return lines
