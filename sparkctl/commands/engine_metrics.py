"""The engines' Prometheus ``/metrics``: parse the text, pick the figures an operator watches, by their real names.

Names are the ones vLLM 0.33.0 and SGLang 0.5.23 register (the engines' metric name lists). A counter
registered as ``vllm:prompt_tokens`` is exposed as ``vllm:prompt_tokens_total``; a name that already ends in
``_total`` (SGLang's ``sglang:prompt_tokens_total``) is exposed as it is. A figure is the sum over its label
sets (one engine serves one model; a per-position counter sums to the total).

Derived figures need two scrapes (``before``, ``after``): tokens/s, the prefix-cache hit rate over the
interval, and speculative decoding's mean accepted length:

* vLLM 0.33.0 lists accepted draft tokens per position (``vllm:spec_decode_num_accepted_tokens_per_pos``)
  but not the number of drafts. Every decode step of a request emits 1 + accepted tokens, and the first
  token of a request comes from its prefill, so over an interval where the requests that started also
  finished, generated = finished requests + steps + accepted: steps = generated - finished - accepted,
  and the mean accepted length (the bonus token included, as the TP4 vLLM report's "mean acceptance" of
  4.9-5.3 of 5 counts it) is 1 + accepted / steps. An engine that also counts its drafts
  (``vllm:spec_decode_num_drafts``, vLLM's SpecDecodingProm in other versions) gets vLLM's own
  formula, 1 + accepted / drafts.
* SGLang counts verify calls (``sglang:spec_verify_calls_total``): one per decode step of a request, so
  the mean accepted length is generated tokens / verify calls.
"""

from __future__ import annotations

from typing import Optional

from sparkctl import engines

# Each engine's names, role -> registered name, live in its plugin (``sparkctl/engines/``).


def metric_names(engine: Optional[str]) -> dict[str, str]:
    """Role -> registered name for ``engine`` ({} for none, or an engine without /metrics)."""
    return engines.get(engine).metrics if engine in engines.names() else {}


# The figures shown as they are (gauges) and those that only grow (counters), by role.
GAUGES = ("running", "waiting", "kv_cache_usage", "prefix_cache_hit_rate", "spec_accept_length")
COUNTERS = ("prompt_tokens", "generation_tokens", "prefix_cache_hits", "prefix_cache_queries", "preemptions",
            "requests_finished", "spec_accepted_tokens", "spec_verify_calls")

Samples = dict[str, float]  # sample name -> value summed over its label sets


def parse_exposition(text: str) -> Samples:
    """Prometheus text exposition -> {sample name: value summed over label sets}. Raises ValueError on text
    that is not the exposition format."""
    # Imported here, the one path that parses: prometheus_client (~0.3 s) is not needed for `top`'s
    # first frame, which draws the engine table's labels before any scrape.
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):  # a counter's creation time, not a value
                continue
            samples[sample.name] = samples.get(sample.name, 0.0) + float(sample.value)
    return samples


def detect_engine(samples: Samples) -> Optional[str]:
    prefixes = {name.split(":", 1)[0] for name in samples if ":" in name}
    for engine in engines.served_by_flags():
        if engine.metric_prefix in prefixes:
            return engine.name
    return None


def value(samples: Samples, name: str) -> Optional[float]:
    """A metric by its registered name: the gauge itself, or the counter's ``_total`` sample."""
    for candidate in (name, name + "_total"):
        if candidate in samples:
            return samples[candidate]
    return None


def exposed_name(samples: Samples, name: str) -> str:
    return name if name in samples or name.endswith("_total") else name + "_total"


def delta(before: Samples, after: Samples, name: str) -> Optional[float]:
    a, b = value(before, name), value(after, name)
    if a is None or b is None or b < a:  # absent, or the engine restarted between the scrapes
        return None
    return b - a


def spec_accept_length(engine: str, before: Samples, after: Samples) -> Optional[float]:
    """Mean accepted length of speculative decoding between two scrapes (None: no speculation seen)."""
    return engines.get(engine).spec_accept_length(before, after)


def summary(engine: str, after: Samples, before: Optional[Samples] = None, seconds: Optional[float] = None) -> dict:
    """{real metric name: value} for what ``top`` shows, then the derived figures (rates over the interval
    between ``before`` and ``after`` when given)."""
    plugin = engines.get(engine)
    names = plugin.metrics
    out: dict = {}
    for role in GAUGES + COUNTERS:
        name = names.get(role)
        if name is None:
            continue
        v = value(after, name)
        if v is not None:
            out[exposed_name(after, name)] = v
    derived: dict = {"prompt_tokens_per_s": None, "generation_tokens_per_s": None,
                     "prefix_cache_hit_rate": plugin.prefix_cache_hit_rate(after),  # since the engine started
                     "spec_accept_length": plugin.spec_accept_gauge(after)}
    if before is not None and seconds and seconds > 0:
        for role, key in (("prompt_tokens", "prompt_tokens_per_s"), ("generation_tokens", "generation_tokens_per_s")):
            d = delta(before, after, names[role])
            derived[key] = None if d is None else d / seconds
        between = plugin.prefix_cache_hit_rate_between(before, after)
        if between is not None:
            derived["prefix_cache_hit_rate"] = between
        accept = plugin.spec_accept_length(before, after)
        if accept is not None:
            derived["spec_accept_length"] = accept
    out.update(derived)
    return out
