"""SGLang 0.5.23 (and the SGLang line's overlay image): ``sglang.launch_server``, its variables,
metrics and answers, its own memory accounting and the packed Engram shards its row store reads."""

from __future__ import annotations

from typing import Optional

from sparkctl.commands import sglang as commands
from sparkctl.commands.engine_metrics import delta, value
from sparkctl.commands.sglang import ENGRAM_SOURCE, OFFLOAD_MODE, PACKED_DIR, SGLANG_ENGRAM_HOST_TABLE
from sparkctl.engines.base import Engine, Samples
from sparkctl.engram.packed import LAYOUT as PACKED_LAYOUT
from sparkctl.errors import ConfigError


def nvme_engram_env(profile) -> dict[str, str]:
    return {
        OFFLOAD_MODE: "nvme",  # the source's only mode on a Spark ("ram" pins ~189 GiB of tables)
        PACKED_DIR: profile.container.engram_mount,
        ENGRAM_SOURCE: profile.container.model_mount,
        SGLANG_ENGRAM_HOST_TABLE: "0",
        "DSV41_IO_THREADS": str(profile.engram.disk_threads),  # the source: a pool services the NVMe misses (96)
    }


# What ``images/surface.PROBE`` runs inside the image to read this engine's surface (python3 3.8+,
# the probe's functions ``first`` and ``options`` in scope); fills ``doc``, a section it cannot read stays null.
SURFACE_READER = r'''
def read_sglang(doc):
    ServerArgs = first("sglang.srt.server_args.ServerArgs")
    if ServerArgs is not None:
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        doc["flags"] = options(parser)
    environ = first("sglang.srt.environ")
    if environ is not None and hasattr(environ, "Envs"):
        # the Envs class's fields (EnvField.__set_name__ records each name), plus the deprecated
        # names it still reads and forwards (module-level tables of _DeprecatedEnv)
        fields = {getattr(v, "name", None) for v in vars(environ.Envs).values()}
        names = set(fields)
        deprecated = getattr(environ, "_DeprecatedEnv", None)
        for table in vars(environ).values():
            if deprecated and isinstance(table, dict) and any(isinstance(v, deprecated) for v in table.values()):
                # only an old name that forwards to a real field (a table of examples such as
                # OLD_NAME -> NEW_NAME is not a variable the engine reads)
                names |= {old for old, entry in table.items()
                          if isinstance(entry, deprecated) and set(map(str, vars(entry).values())) & fields}
        # a bare prefix (SGLANG_EXA_) is a family's stem, not a variable
        doc["envs"] = sorted(n for n in names if isinstance(n, str) and not n.endswith("_")) or None
    # SGLang's parser names are the choices of its own options (they include "auto")
    flags = doc["flags"] or {}
    for option, kind in (("--tool-call-parser", "tool_call_parsers"), ("--reasoning-parser", "reasoning_parsers")):
        if (flags.get(option) or {}).get("choices"):
            doc["parsers"][kind] = flags[option]["choices"]
'''


class SGLang(Engine):
    name, label = "sglang", "SGLang"
    env_prefixes = ("SGLANG_",)
    metric_prefix = "sglang"
    metrics = {
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "kv_cache_usage": "sglang:token_usage",  # 0..1
        "prompt_tokens": "sglang:prompt_tokens_total",
        "generation_tokens": "sglang:generation_tokens_total",
        "prefix_cache_hit_rate": "sglang:cache_hit_rate",  # a gauge the engine keeps
        "preemptions": "sglang:num_retracted_requests_total",
        "requests_finished": "sglang:num_requests_total",
        "spec_accept_length": "sglang:spec_accept_length",  # a gauge: the recent batches' mean
        "spec_verify_calls": "sglang:spec_verify_calls_total",
    }
    tp_flag = "--tp-size"
    rank_options = ("--nnodes", "--node-rank", "--dist-init-addr")
    rank_port_option = "--dist-init-addr HEAD:PORT"
    surface_reader = SURFACE_READER
    engram_shard_layout = PACKED_LAYOUT  # header, weight and scale side by side per row

    @property
    def core_flags(self) -> dict[str, str]:
        return commands.CORE_FLAGS

    def engine_argv(self, profile, spec, rank) -> list[str]:
        return commands.engine_argv(profile, spec, rank)

    def options_of(self, argv: list[str]) -> Optional[list[str]]:
        return argv[3:] if argv[:3] == ["python3", "-m", "sglang.launch_server"] else None

    def env(self, profile, host, spec=None) -> dict[str, str]:
        if profile.engram.mode == "memory":
            return {SGLANG_ENGRAM_HOST_TABLE: "1"}
        return nvme_engram_env(profile)

    def api_key_env(self, key: str, field: str) -> dict[str, str]:
        # SGLang 0.5.23 reads no variable for it (its environ list has none): only --api-key, which
        # would put the key in the process list of the host and in the container's recorded command.
        raise ConfigError("SGLang takes its API key only as the --api-key option, which would show it in "
                          "`ps` and `docker inspect`; serve SGLang without a key behind an authenticating proxy",
                          field=field)

    def error_in(self, doc: dict):
        return doc if doc.get("object") == "error" else "lacks SGLang's object: error"

    def prefix_cache_hit_rate(self, after: Samples) -> Optional[float]:
        return value(after, self.metrics["prefix_cache_hit_rate"])

    def spec_accept_gauge(self, after: Samples) -> Optional[float]:
        return value(after, self.metrics["spec_accept_length"]) or None

    def spec_accept_length(self, before: Samples, after: Samples) -> Optional[float]:
        """One verify call per decode step of a request: generated tokens / verify calls."""
        generated = delta(before, after, self.metrics["generation_tokens"])
        calls = delta(before, after, self.metrics["spec_verify_calls"])
        return generated / calls if generated is not None and calls else None

    def memory_planner(self, profile) -> Optional[str]:
        # SGLang's own accounting on a unified-memory box, when the profile gives its figures
        return "sparkctl.ops.plan_sglang:plan_sglang" if profile.memory.sglang is not None else None


ENGINE = SGLang()
