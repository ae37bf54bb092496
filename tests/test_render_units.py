"""The pure builders behind `sparkctl render`, one rule at a time."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from sparkctl.commands import docker, sglang, vllm
from sparkctl.commands.engine_flags import EngineFlags, FlagSpec, engine_arg_tokens, load_engine_flags
from sparkctl.commands.ranks import RankInfo, host_port
from sparkctl.commands.templates import compose_scalar, yaml_scalar
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError

VLLM = load_engine_flags("vllm", "0.33.0")


def test_engine_args_values_are_formatted_by_type():
    args = {
        "speculative-config": {"method": "dspark", "num_speculative_tokens": 5, "enable_adaptive_verification": False},
        "cudagraph-capture-sizes": [1, 2, 4],
        "enforce-eager": True,
        "enable-prefix-caching": False,
        "max-logprobs": 20,
        "kv-cache-memory-bytes": 1.5,
        "kv-cache-dtype": "fp8",
    }
    assert engine_arg_tokens(args, VLLM, owned={}) == [
        "--speculative-config", '{"method":"dspark","num_speculative_tokens":5,"enable_adaptive_verification":false}',
        "--cudagraph-capture-sizes", "[1,2,4]",
        "--enforce-eager",
        "--disable-prefix-caching",  # false: the negative form, else vLLM's default (on) applies
        "--max-logprobs", "20",
        "--kv-cache-memory-bytes", "1.5",
        "--kv-cache-dtype", "fp8",
    ]


def test_an_owned_option_names_why():
    with pytest.raises(ConfigError) as err:
        engine_arg_tokens({"port": 9000}, VLLM, owned=vllm.OWNED_FLAGS)
    assert err.value.field == "engine_args.port" and "serving.port" in str(err.value)


def test_the_final_argv_check_catches_what_the_builder_adds():
    # A flags file without --headless (an engine version that dropped it) must stop the render,
    # even though the option comes from sparkctl itself rather than from engine_args.
    flags = {k: v for k, v in VLLM.flags.items() if k != "--headless"}
    no_headless = dataclasses.replace(VLLM, flags=flags)
    profile = load_profile("tp4").profile
    vllm.engine_argv(profile, no_headless, RankInfo(0, 4, "10.0.0.1"))  # the head has no --headless: fine
    with pytest.raises(ConfigError) as err:
        vllm.engine_argv(profile, no_headless, RankInfo(1, 4, "10.0.0.1"))
    assert err.value.field == "engine_version" and "has no option --headless" in str(err.value)


def test_parser_names_come_from_parsers_json():
    spec = EngineFlags("x", "1", {"--tool-call-parser": FlagSpec(True)}, {"tool_call_parsers": ("a", "b")})
    assert engine_arg_tokens({"tool-call-parser": "b"}, spec, owned={}) == ["--tool-call-parser", "b"]
    with pytest.raises(ConfigError, match="no --tool-call-parser named 'c'"):
        engine_arg_tokens({"tool-call-parser": "c"}, spec, owned={})


def test_ipv6_head_addresses_are_bracketed_where_a_port_follows():
    assert host_port("fd00::1", 29500) == "[fd00::1]:29500"
    assert host_port("10.0.0.1", 29500) == "10.0.0.1:29500"
    profile = load_profile("sglang-tp4-1m").profile
    from sparkctl.ops.render import engine_surface

    argv = sglang.engine_argv(profile, engine_surface(profile), RankInfo(2, 4, "fd00::1"))
    assert argv[argv.index("--dist-init-addr") + 1] == f"[fd00::1]:{profile.distributed.master_port}"


@pytest.mark.parametrize(
    "gpus, expected",
    [(None, None), ("all", {"count": "all"}), ("2", {"count": 2}), ("device=0,1", {"device_ids": ["0", "1"]})],
)
def test_gpu_requests_compose_can_express(gpus, expected):
    assert docker.gpu_request(gpus) == expected


def test_a_gpu_request_compose_cannot_express_is_refused():
    with pytest.raises(ConfigError) as err:
        docker.gpu_request("capabilities=utility")
    assert err.value.field == "container.gpus"


@pytest.mark.parametrize(
    "value",
    ["host", "0.0.0.0", "8000", "yes", "no", "null", "~", "1048576:1048576", "-1:-1", "-1", "-d", "--port", "0o14",
     '{"thinking":false}', "it's", "a b", "x: y", "a,b", "", "line\nbreak", "tab\there", "é", "*alias", "&anchor", "!tag"],
)
def test_yaml_scalars_read_back_as_the_same_string(value):
    assert yaml.safe_load(f"key: {yaml_scalar(value)}\n")["key"] == value
    assert yaml.safe_load(f"- {yaml_scalar(value)}\n") == [value]


def test_yaml_scalars_keep_numbers_and_booleans():
    assert yaml.safe_load(f"k: {yaml_scalar(0.8)}")["k"] == 0.8
    assert yaml.safe_load(f"k: {yaml_scalar(300000)}")["k"] == 300000
    assert yaml.safe_load(f"k: {yaml_scalar(False)}")["k"] is False


def test_compose_scalars_escape_interpolation():
    assert yaml.safe_load(f"k: {compose_scalar('a$b')}")["k"] == "a$$b"
