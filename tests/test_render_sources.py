"""Every parameter of the source reports' deployment tables (docs/sources.md), against what `sparkctl render` produces.

The expected values are transcribed from the source reports (section cited on each table), not read
from the recipes: if a recipe drifts from the report, these tests say so.
"""

from __future__ import annotations

import json

import pytest

from test_render_helpers import docker_options, engine_flags, image_of, parse_options, render_json, split_engine_argv

# --- the TP4 vLLM report (4x Spark, vLLM TP4) ---------------------------------------------------------------

# §5.1 sparkrun recipe deepseek-v41-flash-tp4.yaml
TP4_REPORT_5_1 = {
    "tensor_parallel": 4,
    "gpu_memory_utilization": 0.80,
    "max_model_len": 300000,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 8192,
    "block_size": 128,
    "distributed-executor-backend": "mp",
}
# §5.2 speculative decoding (the TP8 vLLM report §5.3: the same for both TP8 configurations)
TP4_REPORT_SPECULATIVE = {
    "method": "dspark",
    "num_speculative_tokens": 5,
    "draft_sample_method": "probabilistic",
    "rejection_sample_method": "block",
    "enable_adaptive_verification": False,
}
# §5.3 Engram-on-disk
TP4_REPORT_5_3 = {"DSV41_ENGRAM_DISK": "1", "DSV41_ENGRAM_DISK_THREADS": "32", "DSV41_ENGRAM_DISK_CHUNK": "16"}
# §5.5 serving parameters: JSON-valued options (compared as JSON), plain values, switches
TP4_REPORT_5_5_JSON = {"--default-chat-template-kwargs": {"thinking": False}, "--limit-mm-per-prompt": {"image": 4}}
TP4_REPORT_5_5_VALUES = {"--tool-call-parser": "deepseek_v41", "--reasoning-parser": "deepseek_v41"}
TP4_REPORT_5_5_SWITCHES = ["--enable-auto-tool-choice"]
TP4_REPORT_5_5_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"  # "--compilation-config with CUDA graphs (FULL_AND_PIECEWISE mode)"
# §4.4
TP4_REPORT_4_4 = {"OMP_NUM_THREADS": "1"}

# --- the TP8 vLLM report (8x Spark, vLLM TP8) ---------------------------------------------------------------

# §4.1 NCCL channel reduction
TP8_REPORT_4_1 = {"NCCL_MAX_NCHANNELS": "8", "NCCL_BUFFSIZE": "1048576", "NCCL_NVLS_ENABLE": "0"}
# §4.3 NCCL environment
TP8_REPORT_4_3 = {
    "NCCL_IB_ROCE_VERSION_NUM": "2",
    "NCCL_IB_ADDR_FAMILY": "AF_INET",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_IB_MERGE_NICS": "0",
    "NCCL_CROSS_NIC": "1",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
    "NCCL_CUMEM_ENABLE": "0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "NCCL_DEBUG": "WARN",
}
# §4.2 container limits: ulimit name -> (soft, hard); "stack 67108864" is one value for both
TP8_REPORT_4_2_ULIMITS = {"nofile": (1048576, 1048576), "memlock": (-1, -1), "stack": (67108864, 67108864)}
TP8_REPORT_4_2_CAP_ADD = ["IPC_LOCK"]
TP8_REPORT_4_2_MEMORY = "112g"
# §5.1 TP8-300K and §5.2 TP8-1M
TP8_REPORT_5 = {
    "tp8-300k": {
        "image": "vllm-dsv41:engram-mem", "tensor_parallel": 8, "gpu_memory_utilization": 0.80, "max_model_len": 300000,
        "max_num_seqs": 8, "max_num_batched_tokens": 8192, "block_size": 128, "distributed-executor-backend": "mp",
        # AutoTuner off (§5.1 / §10.5): released vLLM 0.33.0 does not read the reports' variable; its switch does it
        "env": {}, "env_absent": ["DSV41_ENGRAM_DISK", "VLLM_FLASHINFER_AUTOTUNE"], "autotune_off": True,
    },
    "tp8-1m": {
        "image": "vllm-dsv41:latest", "tensor_parallel": 8, "gpu_memory_utilization": 0.75, "max_model_len": 1048576,
        "max_num_seqs": 8, "max_num_batched_tokens": 8192, "block_size": 128, "distributed-executor-backend": "mp",
        "env": {"DSV41_ENGRAM_DISK": "1"}, "env_absent": ["VLLM_FLASHINFER_AUTOTUNE"], "autotune_off": False,
    },
}

# --- the SGLang TP4 report (4x Spark, SGLang TP4, 1M context) -------------------------------------------------

SGLANG_REPORT = {"tp": 4, "context": 1048576}

VLLM_FLAG_OF = {  # the reports' tables' parameter names as vllm serve options
    "tensor_parallel": "--tensor-parallel-size",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "block_size": "--block-size",
    "distributed-executor-backend": "--distributed-executor-backend",
}


@pytest.fixture(scope="module")
def rendered():
    return {name: render_json("--profile", name) for name in ("tp4", "tp8-300k", "tp8-1m", "sglang-tp4-1m")}


def vllm_options(host: dict) -> dict:
    program, options = split_engine_argv(host["engine_argv"])
    assert program[:2] == ["vllm", "serve"]
    return parse_options(options, engine_flags("vllm", "0.33.0"))


def assert_table(options: dict, table: dict) -> None:
    for parameter, expected in table.items():
        flag = VLLM_FLAG_OF[parameter]
        actual = options[flag]
        if isinstance(expected, float):
            assert float(actual) == pytest.approx(expected), (flag, actual)
        elif isinstance(expected, int):
            assert int(actual) == expected, (flag, actual)
        else:
            assert actual == expected, (flag, actual)


def test_tp4_matches_tp4_report_5_1_on_every_rank(rendered):
    hosts = rendered["tp4"]["hosts"]
    assert len(hosts) == TP4_REPORT_5_1["tensor_parallel"]  # "4 nodes x 1 GPU"
    for host in hosts:
        assert_table(vllm_options(host), TP4_REPORT_5_1)


@pytest.mark.parametrize("profile", ["tp4", "tp8-300k", "tp8-1m"])
def test_speculative_config_is_tp4_report_5_2(rendered, profile):
    for host in rendered[profile]["hosts"]:
        assert json.loads(vllm_options(host)["--speculative-config"]) == TP4_REPORT_SPECULATIVE


@pytest.mark.parametrize("profile", ["tp4", "tp8-1m"])
def test_engram_on_disk_env_is_tp4_report_5_3(rendered, profile):
    for host in rendered[profile]["hosts"]:
        for name, value in TP4_REPORT_5_3.items():
            assert host["env"][name] == value, name


@pytest.mark.parametrize("profile", ["tp4", "tp8-300k", "tp8-1m"])
def test_serving_flags_are_tp4_report_5_5(rendered, profile):
    for host in rendered[profile]["hosts"]:
        options = vllm_options(host)
        for flag, expected in TP4_REPORT_5_5_JSON.items():
            assert json.loads(options[flag]) == expected, flag
        for flag, expected in TP4_REPORT_5_5_VALUES.items():
            assert options[flag] == expected, flag
        for flag in TP4_REPORT_5_5_SWITCHES:
            assert options[flag] is True, flag
        assert json.loads(options["--compilation-config"])["cudagraph_mode"] == TP4_REPORT_5_5_CUDAGRAPH_MODE


# The SGLang line follows its own source (tests/test_sglang_line.py), not the vLLM reports' extras.
@pytest.mark.parametrize("profile", ["tp4", "tp8-300k", "tp8-1m"])
def test_omp_threads_is_tp4_report_4_4(rendered, profile):
    for host in rendered[profile]["hosts"]:
        assert host["env"]["OMP_NUM_THREADS"] == TP4_REPORT_4_4["OMP_NUM_THREADS"]


@pytest.mark.parametrize("profile", ["tp8-300k", "tp8-1m"])
def test_nccl_env_is_tp8_report_4_1_and_4_3(rendered, profile):
    for host in rendered[profile]["hosts"]:
        for name, value in {**TP8_REPORT_4_1, **TP8_REPORT_4_3}.items():
            assert host["env"][name] == value, name


@pytest.mark.parametrize("profile", ["tp4", "tp8-300k", "tp8-1m"])
def test_container_limits_are_tp8_report_4_2(rendered, profile):
    for host in rendered[profile]["hosts"]:
        pairs = docker_options(host["docker_argv"], host["engine_argv"])
        ulimits = {}
        for option, value in pairs:
            if option == "--ulimit":
                name, _, limits = value.partition("=")
                soft, _, hard = limits.partition(":")
                ulimits[name] = (int(soft), int(hard or soft))
        assert ulimits == TP8_REPORT_4_2_ULIMITS
        assert [v for o, v in pairs if o == "--cap-add"] == TP8_REPORT_4_2_CAP_ADD
        assert [v for o, v in pairs if o == "--memory"] == [TP8_REPORT_4_2_MEMORY]


@pytest.mark.parametrize("profile", sorted(TP8_REPORT_5))
def test_tp8_configurations_are_tp8_report_5(rendered, profile):
    expected = TP8_REPORT_5[profile]
    hosts = rendered[profile]["hosts"]
    assert len(hosts) == expected["tensor_parallel"]
    table = {k: v for k, v in expected.items() if k in VLLM_FLAG_OF}
    for host in hosts:
        assert image_of(host["docker_argv"], host["engine_argv"]) == expected["image"]
        assert_table(vllm_options(host), table)
        for name, value in expected["env"].items():
            assert host["env"][name] == value, name
        for name in expected["env_absent"]:
            assert name not in host["env"], name
        switch = "--disable-flashinfer-autotune"
        assert (switch in host["engine_argv"]) == expected["autotune_off"]
        assert switch in engine_flags("vllm", "0.33.0")  # the released parser has it


def test_sglang_matches_sglang_report(rendered):
    hosts = rendered["sglang-tp4-1m"]["hosts"]
    assert len(hosts) == SGLANG_REPORT["tp"]
    for host in hosts:
        program, options = split_engine_argv(host["engine_argv"])
        parsed = parse_options(options, engine_flags("sglang", "0.5.23"))
        assert program == ["python3", "-m", "sglang.launch_server"]
        assert int(parsed["--tp-size"]) == SGLANG_REPORT["tp"]
        assert int(parsed["--context-length"]) == SGLANG_REPORT["context"]
        # Engram packed per node on NVMe (~48 GiB/node at TP4): the source's image reads the shards
        # from the engram mount (OFFLOAD_MODE=nvme); the host table is off.
        assert any(":/engram" in arg for arg in host["docker_argv"])
        assert host["env"]["SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"] == "0" and host["env"]["OFFLOAD_MODE"] == "nvme"
        assert parsed.get("--speculative-algorithm") == "DSPARK"  # the speculative draft verified
