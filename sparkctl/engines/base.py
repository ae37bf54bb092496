"""What every engine plugin answers; a default here is what an engine without that feature does."""

from __future__ import annotations

from typing import Any, Optional

from sparkctl.errors import ConfigError

Samples = dict[str, float]  # /metrics sample name -> value (commands/engine_metrics.parse_exposition)


class Engine:
    """One engine sparkctl can serve. Subclasses set the attributes and override what differs."""

    name: str = ""
    label: str = ""  # as messages name it
    has_flag_surface: bool = True  # options and variables checked against the engine's surface
    # the variable namespace the engine reads: a name there it does not read does nothing
    env_prefixes: tuple[str, ...] = ()
    # the body of ``read_<name>(doc)`` in the image probe (images/surface.PROBE); "" for no surface
    surface_reader: str = ""
    # -- its OpenAI-compatible answers ------------------------------------------------------------
    reasoning_field: str = "reasoning_content"  # where a thinking answer's reasoning arrives
    # the full smoke's checks after the quick ones (auth is added with a key): what an OpenAI-compatible
    # engine with tool and reasoning parsers answers
    smoke_checks: tuple[str, ...] = ("tool_call", "tool_call_stream", "thinking_on", "thinking_off", "completions",
                                     "bad_request")
    # -- its Prometheus /metrics: role -> registered name (commands/engine_metrics) ------------------
    metric_prefix: Optional[str] = None  # the prefix that identifies its samples
    metrics: dict[str, str] = {}
    # -- its multi-node launch, as sparkrun's recipe describes it ----------------------------------
    tp_flag: str = ""
    rank_options: tuple[str, ...] = ()  # per-rank options sparkrun supplies itself
    rank_port_option: str = "--master-port"
    # the serving port listens where serving.host says (a published container port), not on the host network
    listens_on_serving_host: bool = False
    # -- Engram --------------------------------------------------------------------------------
    engram_shard_layout: str = "tensors"  # the shard file layout it reads from NVMe (engram/)
    engram_resident_hint: str = "use more ranks (a higher tensor_parallel): this engine has no Engram-on-disk mode"

    # -- command line (argv built in commands/) ----------------------------------------------------
    @property
    def core_flags(self) -> dict[str, str]:
        """Profile field -> the engine's option."""
        return {}

    def engine_argv(self, profile, spec, rank) -> list[str]:
        raise ConfigError(f"engine {self.name} has no rendered engine command", field="engine")

    def uses_ray(self, profile) -> bool:
        """Whether the ranks meet in a Ray cluster (its port instead of the rendezvous port)."""
        return False

    def head_serve_argv(self, profile, spec, rank, head_argv: list[str]) -> list[str]:
        """The serving command inside the head's container command (what a sparkrun recipe runs)."""
        return head_argv

    def options_of(self, argv: list[str]) -> Optional[list[str]]:
        """The engine's options in a serving command of this engine, None when ``argv`` is not one."""
        return None

    def recipe_defaults(self, profile) -> dict[str, tuple[str, Any]]:
        """Extra sparkrun defaults: option -> (defaults key, value)."""
        return {}

    def rank_args(self, profile) -> str:
        """What sparkrun supplies per rank, as the recipe's comment says it."""
        return ", ".join(self.rank_options)

    # -- environment -------------------------------------------------------------------------------
    def env(self, profile, host, spec=None) -> dict[str, str]:
        """Engine-specific derived variables (``spec``: the engine's surface)."""
        return {}

    def api_key_env(self, key: str, field: str) -> dict[str, str]:
        """The variable carrying the API key into the engine (the 0600 env file only)."""
        raise ConfigError(f"sparkctl knows no API key setting of engine {self.name}", field=field)

    # -- answers and metrics -------------------------------------------------------------------------
    def error_in(self, doc: dict):
        """The error object of a 400 answer, or a sentence saying what the answer lacks."""
        return doc

    def prefix_cache_hit_rate(self, after: Samples) -> Optional[float]:
        """Since the engine started (from one scrape)."""
        return None

    def prefix_cache_hit_rate_between(self, before: Samples, after: Samples) -> Optional[float]:
        return None

    def spec_accept_gauge(self, after: Samples) -> Optional[float]:
        """Speculative decoding's mean accepted length as the engine keeps it (one scrape)."""
        return None

    def spec_accept_length(self, before: Samples, after: Samples) -> Optional[float]:
        """The mean accepted length between two scrapes (None: no speculation seen)."""
        return None

    # -- planning -------------------------------------------------------------------------------------
    def memory_planner(self, profile) -> Optional[str]:
        """``module:function`` of the engine's own memory plan for ``profile``; None: the shared model."""
        return None

    def min_free_gb(self, profile) -> float:
        """MemAvailable every host needs before the start: what the engine will take (GMU x unified memory)."""
        return profile.memory.unified_memory_gb * profile.gpu_memory_utilization

    def skips_engram_tables(self, engram_mode: str) -> bool:
        """Whether the engine loads without the checkpoint's Engram tables (it reads them from NVMe shards)."""
        return False
