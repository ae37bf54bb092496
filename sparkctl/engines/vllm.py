"""vLLM 0.33.0: ``vllm serve`` (native multi-node launcher or Ray), its variables, metrics and answers."""

from __future__ import annotations

from typing import Optional

from sparkctl.commands import vllm as commands
from sparkctl.commands.engine_metrics import delta, value
from sparkctl.commands.env import API_KEY_VARIABLE
from sparkctl.engines.base import Engine, Samples

# Not in vLLM 0.33.0's metric list; read when an engine exports it (commands/engine_metrics' note).
DRAFTS = "vllm:spec_decode_num_drafts"


# What ``images/surface.PROBE`` runs inside the image to read this engine's surface (python3 3.8+,
# the probe's functions ``first`` and ``options`` in scope); fills ``doc``, a section it cannot read stays null.
SURFACE_READER = r'''
def read_vllm(doc):
    make = first("vllm.entrypoints.common.cli_args.make_arg_parser",  # 0.33.0 (what `vllm serve` uses)
                 "vllm.entrypoints.openai.cli_args.make_arg_parser")  # older releases
    Parser = first("vllm.utils.argparse_utils.FlexibleArgumentParser", "vllm.utils.FlexibleArgumentParser")
    if make and Parser:
        doc["flags"] = options(make(Parser()))
    envs = first("vllm.envs.environment_variables")
    doc["envs"] = sorted(envs) if envs else None
    tools = first("vllm.tool_parsers.ToolParserManager", "vllm.entrypoints.openai.tool_parsers.ToolParserManager")
    reasoning = first("vllm.reasoning.ReasoningParserManager")
    # registered names: the eagerly imported ones and the lazily registered ones
    if tools is not None:
        doc["parsers"]["tool_call_parsers"] = sorted(set(getattr(tools, "tool_parsers", {})) | set(getattr(tools, "lazy_parsers", {})))
    if reasoning is not None:
        doc["parsers"]["reasoning_parsers"] = sorted(set(getattr(reasoning, "reasoning_parsers", {})) | set(getattr(reasoning, "lazy_parsers", {})))
    router = first("vllm.entrypoints.openai.api_server.router")
    if router is not None:
        doc["routes"] = sorted({r.path for r in router.routes})
'''


class VLLM(Engine):
    name, label = "vllm", "vLLM"
    env_prefixes = ("VLLM_",)
    reasoning_field = "reasoning"
    metric_prefix = "vllm"
    metrics = {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv_cache_usage": "vllm:kv_cache_usage_perc",  # 0..1
        "prompt_tokens": "vllm:prompt_tokens",
        "generation_tokens": "vllm:generation_tokens",
        "prefix_cache_hits": "vllm:prefix_cache_hits",
        "prefix_cache_queries": "vllm:prefix_cache_queries",
        "preemptions": "vllm:num_preemptions",
        "requests_finished": "vllm:request_success",
        "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_per_pos",
    }
    tp_flag = "--tensor-parallel-size"
    rank_options = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless")
    surface_reader = SURFACE_READER
    engram_resident_hint = "put Engram on disk: --set engram.mode=disk (needs pack-engram and the 7-patch image)"

    @property
    def core_flags(self) -> dict[str, str]:
        return commands.CORE_FLAGS

    def engine_argv(self, profile, spec, rank) -> list[str]:
        return commands.engine_argv(profile, spec, rank)

    def uses_ray(self, profile) -> bool:
        return profile.distributed.launcher == "ray"

    def head_serve_argv(self, profile, spec, rank, head_argv: list[str]) -> list[str]:
        # with Ray the head's container runs `ray start ... && exec vllm serve ...`: the recipe wants the serve
        return commands.serve_argv(profile, spec, rank) if self.uses_ray(profile) else head_argv

    def options_of(self, argv: list[str]) -> Optional[list[str]]:
        return argv[3:] if argv[:2] == ["vllm", "serve"] else None  # after the positional model path

    def recipe_defaults(self, profile) -> dict:
        if not self.uses_ray(profile):
            return {}
        # sparkrun picks its Ray runtime from this default (vllm-ray), as the TP4 vLLM report's recipes do.
        return {f"--{commands.BACKEND}": ("distributed_executor_backend", "ray")}

    def rank_args(self, profile) -> str:
        return "the Ray cluster" if self.uses_ray(profile) else super().rank_args(profile)

    def env(self, profile, host, spec=None) -> dict[str, str]:
        env = {"VLLM_HOST_IP": host.fabric_address}  # the address vLLM advertises to the other ranks
        if profile.engram.mode == "disk":  # the TP4 vLLM report §5.3 (the patched image's Engram-on-disk)
            env["DSV41_ENGRAM_DISK"] = "1"
            env["DSV41_ENGRAM_DISK_THREADS"] = str(profile.engram.disk_threads)
            env["DSV41_ENGRAM_DISK_CHUNK"] = str(profile.engram.disk_chunk)
        if spec is not None:  # the TP8 vLLM report §5.1 / §10.5: avoids the autotune OOM spike
            env.update(commands.autotune_off(profile, spec)[0])
        return env

    def api_key_env(self, key: str, field: str) -> dict[str, str]:
        return {API_KEY_VARIABLE: key}  # vLLM's AuthenticationMiddleware guards /v1/* with it

    def error_in(self, doc: dict):
        return doc.get("error")

    def prefix_cache_hit_rate(self, after: Samples) -> Optional[float]:
        hits, queries = value(after, self.metrics["prefix_cache_hits"]), value(after, self.metrics["prefix_cache_queries"])
        return hits / queries if hits is not None and queries else None

    def prefix_cache_hit_rate_between(self, before: Samples, after: Samples) -> Optional[float]:
        hits = delta(before, after, self.metrics["prefix_cache_hits"])
        queries = delta(before, after, self.metrics["prefix_cache_queries"])
        return hits / queries if hits is not None and queries else None

    def spec_accept_length(self, before: Samples, after: Samples) -> Optional[float]:
        """1 + accepted / drafts when the engine counts drafts; else drafts are decode steps, which are
        generated tokens less each finished request's first (prefill) token less the accepted ones."""
        generated = delta(before, after, self.metrics["generation_tokens"])
        accepted = delta(before, after, self.metrics["spec_accepted_tokens"])
        drafts = delta(before, after, DRAFTS)
        if drafts:
            return 1.0 + (accepted or 0.0) / drafts
        finished = delta(before, after, self.metrics["requests_finished"]) or 0.0
        if generated is None or not accepted:
            return None
        steps = generated - finished - accepted
        return 1.0 + accepted / steps if steps > 0 else None

    def skips_engram_tables(self, engram_mode: str) -> bool:
        return engram_mode == "disk"  # the patched image reads the tables' rows from the NVMe shards


ENGINE = VLLM()
