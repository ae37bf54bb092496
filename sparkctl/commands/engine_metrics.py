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

VLLM = {
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

SGLANG = {
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

ENGINES = {"vllm": VLLM, "sglang": SGLANG}

# Not in vLLM 0.33.0's list; read when an engine exports it (see the module's note).
VLLM_DRAFTS = "vllm:spec_decode_num_drafts"

# The figures shown as they are (gauges) and those that only grow (counters), by role.
GAUGES = ("running", "waiting", "kv_cache_usage", "prefix_cache_hit_rate", "spec_accept_length")
COUNTERS = ("prompt_tokens", "generation_tokens", "prefix_cache_hits", "prefix_cache_queries", "preemptions",
            "requests_finished", "spec_accepted_tokens", "spec_verify_calls")

Samples = dict[str, float]  # sample name -> value summed over its label sets


def parse_exposition(text: str) -> Samples:
    """Prometheus text exposition -> {sample name: value summed over label sets}. Raises ValueError on text
    that is not the exposition format."""
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
    for engine in ("vllm", "sglang"):
        if engine in prefixes:
            return engine
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
    names = ENGINES[engine]
    generated = delta(before, after, names["generation_tokens"])
    if engine == "sglang":
        calls = delta(before, after, names["spec_verify_calls"])
        return generated / calls if generated is not None and calls else None
    accepted = delta(before, after, names["spec_accepted_tokens"])
    drafts = delta(before, after, VLLM_DRAFTS)
    if drafts:
        return 1.0 + (accepted or 0.0) / drafts
    finished = delta(before, after, names["requests_finished"]) or 0.0
    if generated is None or not accepted:
        return None
    steps = generated - finished - accepted
    return 1.0 + accepted / steps if steps > 0 else None


def summary(engine: str, after: Samples, before: Optional[Samples] = None, seconds: Optional[float] = None) -> dict:
    """{real metric name: value} for what ``top`` shows, then the derived figures (rates over the interval
    between ``before`` and ``after`` when given)."""
    names = ENGINES[engine]
    out: dict = {}
    for role in GAUGES + COUNTERS:
        name = names.get(role)
        if name is None:
            continue
        v = value(after, name)
        if v is not None:
            out[exposed_name(after, name)] = v
    derived: dict = {"prompt_tokens_per_s": None, "generation_tokens_per_s": None, "prefix_cache_hit_rate": None,
                     "spec_accept_length": None}
    if engine == "sglang":
        derived["prefix_cache_hit_rate"] = value(after, names["prefix_cache_hit_rate"])
        derived["spec_accept_length"] = value(after, names["spec_accept_length"]) or None
    else:
        hits, queries = value(after, names["prefix_cache_hits"]), value(after, names["prefix_cache_queries"])
        if hits is not None and queries:
            derived["prefix_cache_hit_rate"] = hits / queries  # since the engine started
    if before is not None and seconds and seconds > 0:
        for role, key in (("prompt_tokens", "prompt_tokens_per_s"), ("generation_tokens", "generation_tokens_per_s")):
            d = delta(before, after, names[role])
            derived[key] = None if d is None else d / seconds
        if engine == "vllm":
            hits = delta(before, after, names["prefix_cache_hits"])
            queries = delta(before, after, names["prefix_cache_queries"])
            if hits is not None and queries:
                derived["prefix_cache_hit_rate"] = hits / queries
        accept = spec_accept_length(engine, before, after)
        if accept is not None:
            derived["spec_accept_length"] = accept
    out.update(derived)
    return out
