"""The SGLang line as its source runs it: the sglang-dsv41 chain, the three profiles' values, and
SGLang's own memory budget on a unified-memory box (sparkctl/ops/plan_sglang.py).

Figures are the source's (MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks, .env*.example and docs/tp4.md)."""

from __future__ import annotations

import json

import pytest

from sparkctl.config.profile import load_profile
from sparkctl.images.chain import load_chain
from sparkctl.images.plan import plan_build
from sparkctl.ops.plan import plan_memory
from sparkctl.ops.plan_sglang import ll128_enabled, nccl_pinned_gb
from test_render_helpers import parse_options, render_json, split_engine_argv, engine_flags

from clirun import run_cli as run_sparkctl

SOURCE_DIGEST = "sha256:3dbc313030a6ef2c5d7de8ecf48e9aece722694a82182cb618cc82b588816349"
BYTES_PER_FULL_TOKEN = 1670.75  # the source's boot line: DSV4 memory calculation


# --- the chain ----------------------------------------------------------------------------------


def test_the_chain_pins_the_sources_base_and_has_the_tp4_line():
    chain = load_chain("sglang-dsv41")
    assert chain.spec.base.image == f"lmsysorg/sglang:dev-dsv41@{SOURCE_DIGEST}"
    assert [layer.spec.name for layer in chain.layers()] == ["adapter", "runtime"]
    tp4 = chain.layers("tp4")
    assert [layer.spec.name for layer in tp4] == ["kernels", "branch", "adapter", "runtime"]
    assert tp4[-1].tag == "sglang-dsv41:tp4" and tp4[0].tag != chain.layers()[0].tag
    names, prefixes = chain.switches()
    assert {"OFFLOAD_MODE", "DSV41_PACKED_DIR", "DSV41_INDEXER_CHUNKED"} <= names and "DSV41_" in prefixes


@pytest.mark.parametrize("variant", [None, "tp4"])
def test_dry_run_without_a_context_prints_the_chain_and_what_it_lacks(tmp_path, variant):
    args = ["--json", "build", "--image", "sglang-dsv41", "--dry-run"] + (["--variant", variant] if variant else [])
    result = run_sparkctl(*args, env={"HOME": str(tmp_path), "SPARKCTL_BUILD_CONTEXT": ""})
    assert result.code == 2, result
    doc = json.loads(result.stdout)  # one document: the plan, failed
    assert doc["ok"] is False and f"{len(doc['missing_inputs'])} build input(s) missing" in result.stderr
    assert doc["base"]["image"].endswith(SOURCE_DIGEST)
    layers = [layer["name"] for layer in doc["layers"]]
    assert layers == (["kernels", "branch", "adapter", "runtime"] if variant else ["adapter", "runtime"])
    lacking = {m["path"] for m in doc["missing_inputs"]}
    assert {"adapter/", "boot.py", "tests/"} <= lacking
    if variant:
        assert {"runtime/sources.manifest", "scripts/fetch_runtime.sh", "runtime/flash_mla_sm120.canary.py"} <= lacking
    text = run_sparkctl(*args[1:], env={"HOME": str(tmp_path), "SPARKCTL_BUILD_CONTEXT": ""})
    assert text.code == 2 and "missing inputs" in text.stdout
    assert any(line.split()[:2] == ["adapter", "adapter/"] for line in text.stdout.splitlines()), text.stdout


def test_a_checkout_with_everything_plans_every_layer(tmp_path):
    ctx = tmp_path / "checkout"
    for rel in ("adapter/sitecustomize.py", "adapter/row_store.cpp", "runtime/flash_mla_sm120.py",
                "runtime/patch_encoding_dsv41.py", "boot.py", "scripts/x.sh", "tests/test_loop_abort.py", "benchmarks/b.py"):
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / rel).write_text(f"# {rel}\n")
    plan = plan_build(load_chain("sglang-dsv41"), context=str(ctx))
    assert plan.missing == []
    runtime = plan.layer("runtime")
    assert runtime.inputs_hash is not None
    assert "ENV PYTHONPATH=/opt/dsv41/adapter" in runtime.dockerfile and "ENTRYPOINT []" in runtime.dockerfile
    assert "COPY runtime/flash_mla_sm120.py /sgl-workspace/sglang/python/sglang/kernels/ops/attention/flash_mla_sm120.py" \
        in runtime.dockerfile


# --- the profiles: the source's values ------------------------------------------------------------

SOURCE = {
    # profile: (.env values) -- CONTEXT_LENGTH, MEM_FRACTION_STATIC, MAX_RUNNING_REQUESTS, CHUNKED_PREFILL_SIZE,
    # MAX_TOTAL_TOKENS, DSPARK_BLOCK_SIZE, TP, EP
    "sglang-tp3": ("262144", "0.95", "4", "1024", "750000", "5", "3", "3"),
    "sglang-tp4-1m": ("1048576", "0.8", "8", "1024", "8000000", "3", "4", "4"),
    "sglang-tp8": ("1048576", "0.8", "16", "4096", "8000000", "5", "8", "2"),
}
FLAGS = ("--context-length", "--mem-fraction-static", "--max-running-requests", "--chunked-prefill-size",
         "--max-total-tokens", "--speculative-dspark-block-size", "--tp-size", "--ep-size")


@pytest.mark.parametrize("profile", sorted(SOURCE))
def test_profiles_render_the_sources_values(profile):
    doc = render_json("--profile", profile)
    for host in doc["hosts"]:
        program, options = split_engine_argv(host["engine_argv"])
        parsed = parse_options(options, engine_flags("sglang", "0.5.23"))
        assert tuple(parsed[f] for f in FLAGS) == SOURCE[profile]
        assert parsed["--cuda-graph-max-bs-decode"] == parsed["--max-running-requests"]
        assert parsed["--model-path"] == "/models/DeepSeek-V4.1-Flash"
        env = host["env"]
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
        assert env["SGLANG_FLASHINFER_MOE_FUSED_FINALIZE"] == "0"
        assert (env["NCCL_BUFFSIZE"], env["NCCL_LL128_BUFFSIZE"], env["NCCL_PROTO"], env["NCCL_MAX_NCHANNELS"]) == \
            ("1048576", "262144", "^LL128", "8")
        assert env["OFFLOAD_MODE"] == "nvme" and env["DSV41_PACKED_DIR"] == "/engram"
        if profile != "sglang-tp3":
            assert parsed["--min-free-slots-delay"] == "1" and env["DSV41_LAUNCHER"] == "tp4"
            assert (parsed["--fp8-gemm-backend"], parsed["--watchdog-timeout"]) == ("flashinfer_cutlass", "1800")
    if profile == "sglang-tp8":
        assert doc["hosts"][0]["env"]["DSV41_INDEXER_CHUNKED"] == "1"
        assert any("sglang-dsv41:tp4" in a for a in doc["hosts"][0]["docker_argv"])


def test_expandable_segments_true_is_refused_with_the_reason():
    result = run_sparkctl("--inventory", "inventory.example.yaml", "render", "--profile", "sglang-tp4-1m",
                          "--env", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert result.code == 2, result
    assert "PYTORCH_CUDA_ALLOC_CONF" in result.stderr and "NaN" in result.stderr


# --- SGLang's memory budget ---------------------------------------------------------------------


def test_tp4_fits_with_about_40_gb_free_and_the_pin_under_the_budget():
    plan = plan_memory(load_profile("sglang-tp4-1m").profile)
    assert plan.fits, plan.problems
    x = plan.extra
    assert 38 <= x["free_after_weights_gb"]["head"] <= 44  # the source: "~40 GB ... stays free" at TP4
    assert x["kv_pin_gb"] == round(8_000_000 * BYTES_PER_FULL_TOKEN / 1e9, 2) == 13.37
    assert 0 < x["kv_budget_gb"]["head"] - x["kv_pin_gb"] < 1  # the pin sits just under the budget
    assert abs(x["prefill_transient_gb"] - 15.03) < 0.05  # ~15 GB for a 1024 chunk at 1M
    assert 23 < x["outside_pool_gb"]["head"] < 26  # ~24 GiB outside the static pool, less rank 0's servers


def test_the_budget_at_090_is_the_16m_tokens_of_the_boot_line():
    plan = plan_memory(load_profile("sglang-tp4-1m", sets=["gpu_memory_utilization=0.9"]).profile)
    assert 15.5e6 < plan.kv_tokens < 16.5e6  # "~16M tokens (~26.7 GB per rank)"


def test_tp3_shows_the_heads_thin_margin():
    plan = plan_memory(load_profile("sglang-tp3").profile)
    assert plan.fits, plan.problems
    x = plan.extra
    head_margin = x["outside_pool_gb"]["head"] - x["prefill_transient_gb"]
    tp4 = plan_memory(load_profile("sglang-tp4-1m").profile).extra
    assert 0 < head_margin < 2 < tp4["outside_pool_gb"]["head"] - tp4["prefill_transient_gb"]
    assert x["free_after_weights_gb"]["head"] < x["free_after_weights_gb"]["worker"]
    text = run_sparkctl("plan", "--profile", "sglang-tp3")
    assert text.code == 0 and "prefill transient" in text.stdout and "margin 1.3" in text.stdout


@pytest.mark.parametrize("sets, envs, term", [
    (["engine_args.max-total-tokens=9000000"], [], "kv_pin"),
    (["max_num_batched_tokens=4096"], [], "prefill_transient"),
    (["engram.mode=memory"], [], "engram_resident"),
])
def test_refusals_name_the_term(sets, envs, term):
    args = ["--json", "plan", "--profile", "sglang-tp4-1m"] + [a for s in sets for a in ("--set", s)]
    result = run_sparkctl(*args)
    assert result.code == 1, result
    doc = json.loads(result.stdout)
    assert doc["fits"] is False and doc["breaks"]["term"] == term
    assert doc["problems"][0].startswith(term) or term in doc["problems"][0]


def test_the_chunked_indexer_makes_4096_safe_at_1m():
    refused = plan_memory(load_profile("sglang-tp4-1m", sets=["max_num_batched_tokens=4096"]).profile)
    assert not refused.fits
    chunked = plan_memory(load_profile("sglang-tp4-1m", sets=["max_num_batched_tokens=4096"],
                                       envs=["DSV41_INDEXER_CHUNKED=1"]).profile)
    assert chunked.fits, chunked.problems
    assert chunked.extra["prefill_transient_gb"] < 8


def test_nccl_buffers_come_from_the_rendered_settings():
    tuned = load_profile("sglang-tp4-1m").profile
    assert nccl_pinned_gb(tuned)[0] < 0.25  # the source measured 0.14 GB with its four settings
    defaults = load_profile("sglang-tp4-1m", envs=["NCCL_BUFFSIZE=4194304", "NCCL_LL128_BUFFSIZE=4915200",
                                                   "NCCL_PROTO=LL,LL128,Simple", "NCCL_MAX_NCHANNELS=32"]).profile
    assert 4.4 < nccl_pinned_gb(defaults)[0] < 5.2  # 4.7 GiB / 5.0 GB per node with NCCL's defaults
    assert (ll128_enabled(None), ll128_enabled("^LL128"), ll128_enabled("LL,Simple"), ll128_enabled("LL128")) == \
        (True, False, False, True)


def test_engram_on_nvme_costs_no_tables_in_memory():
    disk = plan_memory(load_profile("sglang-tp4-1m").profile)
    memory = plan_memory(load_profile("sglang-tp4-1m", sets=["engram.mode=memory"]).profile)
    by_name = {t.name: t.gb for t in disk.terms}
    assert by_name["engram_resident"] == 0
    assert abs({t.name: t.gb for t in memory.terms}["engram_resident"] - 188.8 / 4) < 0.01


def test_tp8_with_ep1_and_b12x_next_is_refused_as_the_source_does():
    result = run_sparkctl("--inventory", "inventory.example.yaml", "render", "--profile", "sglang-tp8",
                          "--set", "engine_args.ep-size=1")
    assert result.code == 2, result
    assert "288-wide expert slice" in result.stderr and "engine_args.ep-size" in result.stderr
    # EP2 (576 per rank) is the source's TP8 line and renders
    assert run_sparkctl("--inventory", "inventory.example.yaml", "render", "--profile", "sglang-tp8").code == 0


def test_tp8_carries_every_switch_of_the_sources_production_line():
    """.env.tp8.example's active EXTRA_CONTAINER_ENV line, value for value (38 switches)."""
    line = ("DSV41_INDEXER_CHUNKED=1 SGLANG_DSPARK_FOLDED_SAMPLING=2 SGLANG_ROCE_ALLREDUCE=1 SGLANG_ROCE_MAX_SIZE=2097152 "
            "B12X_ROCE_HCA=rocep1s0f0,roceP2p1s0f0 B12X_ROCE_CACHE_DIR=/state/b12x-roce B12X_COMPILE_CACHE_DIR=/state/b12x-compile "
            "SPARK_PREFILL_TP_SPLIT=1 SPARK_PREFILL_TP_MIN_CONTEXT=32768 SPARK_PREFILL_TP_MIN_ROWS=1024 SGLANG_RUST_BUILD_MODE=never "
            "DSV41_FAST_LOAD=1 DSV41_FAST_LOAD_EP_SIZE=2 DSV41_FAST_LOAD_TP_SLICE=auto DSV41_FAST_LOAD_N_EXPERTS=384 "
            "DSV41_FAST_LOAD_INFLIGHT_GB=6 DSV41_ENGRAM_PREFETCH=1 DSV41_SHARED_PAD_K=1 DSV41_WO_A_W8=1 DSV41_DRAFT_TAU=0.7 "
            "DSV41_DRAFT_HEAD_FP8=1 DSV41_DRAFT_HEAD_FP8_IMPL=tp4 DSV41_BLOCK_VERIFY=1 DSV41_FOLDED_FENCE=1 "
            "DSV41_VERIFY_CAP=conf:0.1 DSV41_AUTOTUNE_KEEP=1 DSV41_WO_A_W8_MID=1 DSV41_WO_A_W8_DROP=1 "
            "DSV41_REPLICATED_SPLIT=wqkv_a,engram.wkv DSV41_DRAFT_MAIN_PROJ_SPLIT=1 DSV41_ROCE_GATHER=2097152 DSV41_ROUTER_LIVE=1 "
            "DSV41_MOE_B12X_NEXT=1 DSV41_MOE_B12X_NEXT_DETERMINISTIC=1 DSV41_HC_FUSED=1 DSV41_PREFILL_SP=1 "
            "DSV41_PREFILL_SP_FP8=1 DSV41_L2_PREFETCH=1")
    expected = dict(pair.split("=", 1) for pair in line.split())
    env = load_profile("sglang-tp8").profile.env
    assert len(expected) == 38
    assert {name: env.get(name) for name in expected} == expected
