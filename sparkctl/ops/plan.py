"""The per-rank memory plan: will a profile fit in a GB10's unified memory, and how much KV is left?

Every input comes from the profile (``memory:`` holds model and hardware facts, the rest is the
deployment): weights and Engram tables are totals split over TP ranks; NCCL buffers grow with
peers, channels and buffer size; the profiling run briefly holds the larger of the activation peak
and the autotune spike. What remains of ``GMU x unified memory`` is KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module

from sparkctl import engines
from sparkctl.config.profile import Profile

GB = 1e9
MiB = 1 << 20


@dataclass
class Term:
    name: str
    gb: float
    detail: str
    hint: str


class Fits:
    """What every memory plan answers (this one and the single-box engine's arena plan): it fits
    when it names no problem."""

    problems: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems


@dataclass
class MemoryPlan(Fits):
    profile: str
    tensor_parallel: int
    unified_memory_gb: float
    gpu_memory_utilization: float
    budget_gb: float
    terms: list[Term]
    kv_cache_gb: float
    kv_tokens: int
    max_model_len: int
    kv_needed_gb: float
    container_memory_gb: float | None
    problems: list[str] = field(default_factory=list)
    breaking_term: Term | None = None
    extra: dict = field(default_factory=dict)  # engine-specific figures (SGLang: its own budget, pin, transient)

    @property
    def used_gb(self) -> float:
        return sum(t.gb for t in self.terms)

    def to_json(self) -> dict:
        as_given = ("profile", "fits", "tensor_parallel", "unified_memory_gb", "gpu_memory_utilization")
        return {
            **{name: getattr(self, name) for name in as_given},
            "budget_gb": round(self.budget_gb, 2),
            "used_gb": round(self.used_gb, 2),
            "per_rank": {t.name: round(t.gb, 2) for t in self.terms},
            "details": {t.name: t.detail for t in self.terms},
            "kv_cache_gb": round(self.kv_cache_gb, 2),
            "kv_tokens": self.kv_tokens,
            "max_model_len": self.max_model_len,
            "kv_needed_gb": round(self.kv_needed_gb, 2),
            "container_memory_gb": None if self.container_memory_gb is None else round(self.container_memory_gb, 2),
            "problems": self.problems,
            "breaks": None
            if self.breaking_term is None
            else {"term": self.breaking_term.name, "gb": round(self.breaking_term.gb, 2), "hint": self.breaking_term.hint},
            **({"sglang": self.extra} if self.extra else {}),
        }


def _nccl_settings(profile: Profile) -> tuple[int, int]:
    nccl = profile.memory.nccl
    channels = int(profile.env.get("NCCL_MAX_NCHANNELS", nccl.default_channels))
    buffsize = int(profile.env.get("NCCL_BUFFSIZE", nccl.default_buffsize))
    return channels, buffsize


def _cuda_graphs_enabled(profile: Profile) -> bool:
    args = profile.engine_args
    if args.get("enforce-eager") or args.get("disable-cuda-graph"):
        return False
    compilation = args.get("compilation-config")
    if isinstance(compilation, dict) and str(compilation.get("cudagraph_mode", "")).upper() == "NONE":
        return False
    return True


def _size_to_gb(text: str) -> float:
    units = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.lower()
    if text[-1] in units:
        return int(text[:-1]) * units[text[-1]] / GB
    return int(text) / GB


def plan_memory(profile: Profile) -> MemoryPlan:
    """Per rank: the shared model of the terms below, or the engine's own accounting when it has one."""
    engine = engines.get(profile.engine)
    planner = engine.memory_planner(profile)
    if planner is not None:
        module, _, function = planner.partition(":")
        return getattr(import_module(module), function)(profile)
    m = profile.memory
    terms = _terms(profile, engine)
    budget = profile.gpu_memory_utilization * m.unified_memory_gb
    kv_gb = budget - sum(t.gb for t in terms)
    container_gb = _size_to_gb(profile.container.memory) if profile.container.memory else None
    plan = MemoryPlan(
        profile=profile.name, tensor_parallel=profile.tensor_parallel, unified_memory_gb=m.unified_memory_gb,
        gpu_memory_utilization=profile.gpu_memory_utilization, budget_gb=budget, terms=terms,
        kv_cache_gb=kv_gb, kv_tokens=max(0, int(kv_gb * GB // m.kv_bytes_per_token)),
        max_model_len=profile.max_model_len, kv_needed_gb=profile.max_model_len * m.kv_bytes_per_token / GB,
        container_memory_gb=container_gb,
    )
    _judge(plan, profile)
    return plan


def _terms(profile: Profile, engine) -> list[Term]:
    """What each rank holds besides KV cache, each with what it comes from and how to shrink it."""
    m = profile.memory
    tp = profile.tensor_parallel
    in_memory = profile.engram.mode == "memory"
    channels, buffsize = _nccl_settings(profile)
    peers = tp - 1
    weights = m.weights_total_gb / tp + (m.engram_memory_gpu_total_gb / tp if in_memory else 0.0)
    nccl = peers * (m.nccl.fixed_gb_per_peer + m.nccl.gb_per_channel_mib_per_peer * channels * buffsize / MiB)
    graphs = m.cuda_graphs_gb if _cuda_graphs_enabled(profile) else 0.0
    autotune = m.autotune_spike_gb if profile.autotune else 0.0
    activations = m.activation_bytes_per_batched_token * profile.max_num_batched_tokens / GB
    # The profiling run holds the larger of the two at once, not their sum.
    activation_extra = max(0.0, activations - autotune)
    return [
        Term("weights", weights,
             f"{m.weights_total_gb:g} GB / TP{tp}" + (f" + Engram GPU-side {m.engram_memory_gpu_total_gb:g} GB / TP{tp}" if in_memory else ""),
             "use more ranks (a higher tensor_parallel)"),
        Term("engram_resident", m.engram_total_gb / tp if in_memory else 0.0,
             f"{m.engram_total_gb:g} GB of tables / TP{tp} in pinned host memory" if in_memory else "Engram on local NVMe (engram.mode=disk)",
             engine.engram_resident_hint),
        Term("nccl_buffers", nccl,
             f"{peers} peers x (fixed {m.nccl.fixed_gb_per_peer:g} + {channels} channels x {buffsize / MiB:g} MiB)",
             "reduce NCCL channels and buffers: --env NCCL_MAX_NCHANNELS=8 --env NCCL_BUFFSIZE=1048576"),
        Term("cuda_graphs", graphs, "captured CUDA graphs" if graphs else "CUDA graphs disabled",
             "disable CUDA graphs (slower decode)"),
        Term("autotune_spike", autotune, "DeepGEMM/CUTLASS autotune while profiling" if autotune else "autotune off",
             "turn the AutoTuner off: --set autotune=false"),
        Term("activation_peak", activation_extra,
             f"profiling run at {profile.max_num_batched_tokens} batched tokens ({activations:.2f} GB"
             + (f", {activations - activation_extra:.2f} GB of it under the autotune spike)" if autotune else ")"),
             "lower max_num_batched_tokens"),
    ]


def _judge(plan: MemoryPlan, profile: Profile) -> None:
    """The plan's problems: KV cache short of max_model_len (blaming one term), a container limit too low."""
    shortfall = plan.kv_needed_gb - plan.kv_cache_gb
    if shortfall > 0:
        plan.breaking_term = t = _breaking_term(plan.terms, shortfall)
        if plan.kv_cache_gb <= 0:
            plan.problems.append(
                f"the per-rank terms ({plan.used_gb:.1f} GB) exceed the budget ({plan.budget_gb:.1f} GB = GMU "
                f"{profile.gpu_memory_utilization:g} x {plan.unified_memory_gb:g} GB); "
                f"{t.name} ({t.gb:.1f} GB: {t.detail}) breaks it — {t.hint}"
            )
        else:
            plan.problems.append(
                f"KV cache of {plan.kv_cache_gb:.1f} GB holds {plan.kv_tokens} tokens, fewer than max_model_len "
                f"{profile.max_model_len} (needs {plan.kv_needed_gb:.1f} GB); {t.name} ({t.gb:.1f} GB: {t.detail}) "
                f"breaks it — {t.hint}, or lower max_model_len"
            )
    container_gb = plan.container_memory_gb
    if container_gb is not None and plan.budget_gb > container_gb:
        plan.problems.append(
            f"the engine may use {plan.budget_gb:.1f} GB but container.memory is {profile.container.memory} "
            f"({container_gb:.1f} GB); lower gpu_memory_utilization or raise container.memory"
        )


def _breaking_term(terms: list[Term], shortfall: float) -> Term:
    """The term to blame: the largest one that alone covers the shortfall and that the profile can
    change (NCCL settings, autotune, Engram placement, ...); weights only when nothing else covers it."""
    covering = [t for t in terms if t.gb >= shortfall]
    adjustable = [t for t in covering if t.name != "weights"]
    return max(adjustable or covering or terms, key=lambda t: t.gb)


def format_plan(plan: MemoryPlan) -> str:
    lines = [
        f"memory plan for {plan.profile} (TP{plan.tensor_parallel}, per rank; GB = 10^9 bytes)",
        "",
    ]
    for t in plan.terms:
        lines.append(f"  {t.name:<17}{t.gb:>8.2f}   {t.detail}")
    if plan.extra:
        # here, not at the top: plan_sglang builds on this module's MemoryPlan
        from sparkctl.ops.plan_sglang import format_lines

        lines += [f"  {'total':<17}{plan.used_gb:>8.2f}",
                  f"  {'static pool':<17}{plan.budget_gb:>8.2f}   mem fraction {plan.gpu_memory_utilization:g} x "
                  f"{plan.unified_memory_gb:g} GB node", *format_lines(plan), ""]
        lines += ["fits"] if plan.fits else [f"does not fit: {p}" for p in plan.problems]
        return "\n".join(lines)
    lines += [
        f"  {'total':<17}{plan.used_gb:>8.2f}",
        f"  {'budget':<17}{plan.budget_gb:>8.2f}   GMU {plan.gpu_memory_utilization:g} x {plan.unified_memory_gb:g} GB unified memory",
        f"  {'KV cache':<17}{plan.kv_cache_gb:>8.2f}   {plan.kv_tokens:,} tokens (max_model_len {plan.max_model_len:,} needs {plan.kv_needed_gb:.2f} GB)",
        "",
    ]
    if plan.fits:
        lines.append("fits")
    else:
        lines += [f"does not fit: {p}" for p in plan.problems]
    return "\n".join(lines)
