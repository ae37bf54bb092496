"""The memory plan against the per-rank tables of the TP8 vLLM report §6 (within 10 %)."""

from __future__ import annotations

import pytest

from sparkctl.config.profile import load_profile
from sparkctl.ops.plan import plan_memory

# Transcribed from the TP8 vLLM report §6.1 (TP8-300K) and §6.2 (TP8-1M), GB per rank.
TP8_REPORT = {
    "tp8-300k": {"used": 85.5, "budget": 96.8, "kv_gb": 8.7, "kv_tokens": 1_460_000,
                 "weights": 49.55, "engram_resident": 23.60, "nccl_buffers": 11, "cuda_graphs": 1.5},
    "tp8-1m": {"used": 60.5, "budget": 90.75, "kv_gb": 30,
               "weights": 38, "nccl_buffers": 11, "autotune_spike": 10, "cuda_graphs": 1.5},
}


def within(value: float, expected: float, tolerance: float = 0.10) -> bool:
    return abs(value - expected) <= tolerance * abs(expected)


@pytest.mark.parametrize("name", sorted(TP8_REPORT))
def test_plan_reproduces_tp8_report_tables(name):
    table = TP8_REPORT[name]
    plan = plan_memory(load_profile(name).profile)
    assert plan.fits, plan.problems
    assert within(plan.used_gb, table["used"]), plan.used_gb
    assert within(plan.budget_gb, table["budget"], 0.001), plan.budget_gb
    assert within(plan.kv_cache_gb, table["kv_gb"]), plan.kv_cache_gb
    if "kv_tokens" in table:
        assert within(plan.kv_tokens, table["kv_tokens"]), plan.kv_tokens
    terms = {t.name: t.gb for t in plan.terms}
    for term in ("weights", "engram_resident", "nccl_buffers", "cuda_graphs", "autotune_spike"):
        if term in table:
            assert within(terms[term], table[term]), (term, terms[term])


def test_tp8_1m_keeps_engram_off_the_gpu():
    terms = {t.name: t.gb for t in plan_memory(load_profile("tp8-1m").profile).terms}
    assert terms["engram_resident"] == 0


@pytest.mark.parametrize("name", ["tp8-300k", "tp8-1m"])
def test_default_64_nccl_channels_are_refused_at_tp8(name):
    """The TP8 vLLM report §4.1 / §10.1: NCCL's default 64 channels cost ~37 GB per rank and the model cannot fit."""
    profile = load_profile(name, sets=["env.NCCL_MAX_NCHANNELS=null", "env.NCCL_BUFFSIZE=null"]).profile
    plan = plan_memory(profile)
    nccl = next(t for t in plan.terms if t.name == "nccl_buffers")
    assert within(nccl.gb, 37), nccl.gb
    assert not plan.fits
    assert plan.breaking_term.name == "nccl_buffers"
    assert "NCCL_MAX_NCHANNELS" in plan.problems[0]


def test_all_shipped_vllm_profiles_fit():
    for name in ("tp4", "tp8-300k", "tp8-1m"):
        plan = plan_memory(load_profile(name).profile)
        assert plan.fits, (name, plan.problems)
        assert plan.kv_tokens >= plan.max_model_len


def test_tp4_cannot_hold_1m_context():
    """The TP4 vLLM report §5.1: TP4 runs 300K 'below 1M, memory constrained'."""
    plan = plan_memory(load_profile("tp4", sets=["max_model_len=1048576"]).profile)
    assert not plan.fits
    assert "max_model_len" in plan.problems[0]


def test_autotune_on_at_300k_memory_mode_breaks_the_fit():
    """The TP8 vLLM report §10.5: the 300K configuration disables the AutoTuner to avoid the OOM spike."""
    plan = plan_memory(load_profile("tp8-300k", sets=["autotune=true"]).profile)
    assert not plan.fits
    assert plan.breaking_term.name in {"autotune_spike", "engram_resident"}


def test_budget_above_the_container_limit_is_reported():
    plan = plan_memory(load_profile("tp8-1m", sets=["container.memory=64g"]).profile)
    assert not plan.fits
    assert any("container.memory" in p for p in plan.problems)


def test_plan_cli_json_and_exit_codes(cli):
    ok = cli("plan", "--profile", "tp8-1m", "--json")
    assert ok.code == 0, ok
    data = ok.json()
    for key in ("profile", "fits", "budget_gb", "per_rank", "kv_cache_gb", "kv_tokens"):
        assert key in data
    assert data["profile"] == "tp8-1m" and data["fits"] is True
    assert set(data["per_rank"]) >= {"weights", "engram_resident", "nccl_buffers", "cuda_graphs", "autotune_spike"}

    bad = cli("plan", "--profile", "tp8-1m", "--env", "NCCL_MAX_NCHANNELS=64", "--env", "NCCL_BUFFSIZE=4194304", "--json")
    assert bad.code == 1, bad
    assert bad.json()["fits"] is False
    assert bad.json()["breaks"]["term"] == "nccl_buffers"

    human = cli("plan", "--profile", "tp8-1m", "--env", "NCCL_MAX_NCHANNELS=64", "--env", "NCCL_BUFFSIZE=4194304")
    assert human.code == 1 and "does not fit" in human.stdout and "nccl_buffers" in human.stdout


def test_sglang_engram_tables_count_in_host_memory():
    """With Engram in host memory (stock SGLang's host table) the plan counts the tables per rank,
    and at TP4 they leave no room."""
    plan = plan_memory(load_profile("sglang-tp4-1m", sets=["engram.mode=memory"]).profile)
    engram = next(t for t in plan.terms if t.name == "engram_resident")
    assert within(engram.gb, 188.8 / 4), engram.gb
    assert not plan.fits
    assert plan.breaking_term.name == "engram_resident"

