"""The engines' /metrics parser and figures, on exposition text built from the engines' real metric name lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.commands import engine_metrics as em

# The metric names vLLM 0.33.0 and SGLang 0.5.23 register, listed from the released packages.
NAMES_DIR = Path(__file__).resolve().parent / "data" / "engine-metrics"
NAMES = {"vllm": "vllm-0.33.0-metrics.txt", "sglang": "sglang-0.5.23-metrics.txt"}


def real_names(engine: str) -> list[str]:
    return (NAMES_DIR / NAMES[engine]).read_text().split()


def exposition(engine: str, values: dict[str, float], *, per_pos: tuple[float, ...] = ()) -> str:
    """Prometheus text as the engine writes it: every listed name, counters with their ``_total`` sample
    (a vLLM counter ``x`` is exposed ``x_total``; a name already ending in ``_total`` stays), HELP/TYPE lines,
    a model label, and ``values`` (by registered name) where given, else 0."""
    counters = {"vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
                "vllm:num_preemptions", "vllm:request_success", "vllm:spec_decode_num_accepted_tokens_per_pos"}
    lines = []
    for name in real_names(engine):
        value = values.get(name, 0.0)
        counter = name in counters or name.endswith("_total")
        family = name[:-6] if name.endswith("_total") else name
        lines += [f"# HELP {family} {name} as the engine describes it.", f"# TYPE {family} {'counter' if counter else 'gauge'}"]
        sample = family + "_total" if counter else name
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            for position, count in enumerate(per_pos or (0.0,)):
                lines.append(f'{sample}{{engine="0",model_name="dsv41",position="{position}"}} {count}')
        elif name == "vllm:request_success":
            lines.append(f'{sample}{{engine="0",finished_reason="length",model_name="dsv41"}} {value - 1}')
            lines.append(f'{sample}{{engine="0",finished_reason="stop",model_name="dsv41"}} 1.0')
        else:
            lines.append(f'{sample}{{engine="0",model_name="dsv41"}} {value}')
        if counter:
            lines.append(f'{family}_created{{engine="0",model_name="dsv41"}} 1.7e9')
    return "\n".join(lines) + "\n"


def test_every_name_we_read_is_a_real_metric():
    from sparkctl import engines

    served = engines.served_by_flags()
    assert {plugin.name for plugin in served} == set(NAMES)
    for plugin in served:
        engine = plugin.name
        listed = set(real_names(engine))
        missing = [name for name in plugin.metrics.values() if name not in listed]
        assert not missing, f"{engine}: {missing} are not in {NAMES[engine]}"


def test_vllm_figures_and_rates_between_two_scrapes():
    before = em.parse_exposition(exposition("vllm", {
        "vllm:num_requests_running": 2, "vllm:prompt_tokens": 1000, "vllm:generation_tokens": 500,
        "vllm:prefix_cache_hits": 100, "vllm:prefix_cache_queries": 400, "vllm:request_success": 10,
    }, per_pos=(100, 80, 60)))
    # 10 s later: 5 more requests finished; 2000 tokens generated of which 840 were accepted drafts
    after = em.parse_exposition(exposition("vllm", {
        "vllm:num_requests_running": 3, "vllm:num_requests_waiting": 1, "vllm:kv_cache_usage_perc": 0.42,
        "vllm:prompt_tokens": 6000, "vllm:generation_tokens": 2500, "vllm:prefix_cache_hits": 400,
        "vllm:prefix_cache_queries": 1400, "vllm:num_preemptions": 3, "vllm:request_success": 15,
    }, per_pos=(400, 320, 360)))
    assert em.detect_engine(after) == "vllm"
    assert "vllm:prefix_cache_hits_created" not in after  # creation times are not values
    s = em.summary("vllm", after, before, 10.0)
    assert s["vllm:num_requests_running"] == 3 and s["vllm:num_requests_waiting"] == 1
    assert s["vllm:kv_cache_usage_perc"] == pytest.approx(0.42)
    assert s["vllm:prompt_tokens_total"] == 6000 and s["vllm:num_preemptions_total"] == 3
    assert s["vllm:request_success_total"] == 15  # summed over finished_reason
    assert s["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == 1080  # summed over positions
    assert s["prompt_tokens_per_s"] == pytest.approx(500.0) and s["generation_tokens_per_s"] == pytest.approx(200.0)
    assert s["prefix_cache_hit_rate"] == pytest.approx(300 / 1000)  # over the interval, not since the start
    # generated 2000 = 5 first tokens + steps + 840 accepted -> 1155 steps; 1 + 840/1155
    assert s["spec_accept_length"] == pytest.approx(1 + 840 / 1155)
    # one scrape: no rates, the hit rate since the engine started
    alone = em.summary("vllm", after)
    assert alone["prompt_tokens_per_s"] is None and alone["prefix_cache_hit_rate"] == pytest.approx(400 / 1400)


def test_spec_accept_length_matches_dspark_decoding():
    # 4 requests of 1 + 30 steps each, every step accepting 3 drafts: 1 + 4 tokens per step
    gen = 4 * (1 + 30 * 4)
    before = em.parse_exposition(exposition("vllm", {}, per_pos=(0, 0, 0)))
    after = em.parse_exposition(exposition("vllm", {"vllm:generation_tokens": gen, "vllm:request_success": 4},
                                           per_pos=(120, 120, 120)))
    assert em.spec_accept_length("vllm", before, after) == pytest.approx(4.0)
    assert em.spec_accept_length("vllm", before, before) is None  # nothing decoded
    restarted = em.parse_exposition(exposition("vllm", {"vllm:generation_tokens": 3}, per_pos=(1,)))
    assert em.spec_accept_length("vllm", after, restarted) is None  # counters went back: the engine restarted


def test_drafts_counted_by_the_engine_win():
    """An engine that exports its drafts gets vLLM's own 1 + accepted / drafts (here 1 token emitted per
    step: the derivation from generated tokens would not hold)."""
    from sparkctl.engines.vllm import DRAFTS

    def scrape(gen, drafts, per_pos):
        text = exposition("vllm", {"vllm:generation_tokens": gen, "vllm:request_success": 1}, per_pos=per_pos)
        return em.parse_exposition(text + f"# TYPE {DRAFTS} counter\n{DRAFTS}_total {drafts}\n")
    before, after = scrape(0, 0, (0, 0)), scrape(101, 100, (70, 50))
    assert em.spec_accept_length("vllm", before, after) == pytest.approx(1 + 120 / 100)


def test_sglang_figures():
    before = em.parse_exposition(exposition("sglang", {"sglang:generation_tokens_total": 100,
                                                       "sglang:spec_verify_calls_total": 40}))
    after = em.parse_exposition(exposition("sglang", {
        "sglang:num_running_reqs": 4, "sglang:num_queue_reqs": 2, "sglang:token_usage": 0.25,
        "sglang:prompt_tokens_total": 800, "sglang:generation_tokens_total": 1300, "sglang:cache_hit_rate": 0.6,
        "sglang:num_retracted_requests_total": 1, "sglang:spec_verify_calls_total": 440,
        "sglang:spec_accept_length": 2.9}))
    assert em.detect_engine(after) == "sglang"
    s = em.summary("sglang", after, before, 4.0)
    assert s["sglang:num_running_reqs"] == 4 and s["sglang:num_queue_reqs"] == 2 and s["sglang:token_usage"] == 0.25
    assert s["sglang:num_retracted_requests_total"] == 1 and s["prefix_cache_hit_rate"] == 0.6
    assert s["generation_tokens_per_s"] == pytest.approx(300.0)
    assert s["spec_accept_length"] == pytest.approx(1200 / 400)  # counters beat the engine's recent-batches gauge
    assert em.summary("sglang", after)["spec_accept_length"] == pytest.approx(2.9)  # one scrape: the gauge


def test_not_the_exposition_format():
    with pytest.raises(ValueError):
        em.parse_exposition("this is { not metrics\n")
    assert em.detect_engine(em.parse_exposition("# TYPE up gauge\nup 1\n")) is None
