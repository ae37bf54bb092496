"""Render defects found by running the real parsers: a switch set to false must reach the engine as
its negative form, and every variable is checked, not only the engine's own prefix (NCCL's names
against NCCL's list, the other engine's prefix refused, the overlay's prefixes against its list)."""

from __future__ import annotations

import pytest

from sparkctl.commands.engine_flags import check_env, engine_arg_tokens, load_engine_flags, nccl_variables
from sparkctl.errors import ConfigError
from test_render_helpers import render, render_json

VLLM = load_engine_flags("vllm", "0.33.0")
SGLANG = load_engine_flags("sglang", "0.5.23")
SHARED_ENGINES = "/work/shared/engines"


@pytest.mark.parametrize("spec, key, negative", [
    (VLLM, "enable-prefix-caching", "--disable-prefix-caching"),  # an --enable-x / --disable-x pair
    (VLLM, "enforce-eager", "--no-enforce-eager"),  # argparse's BooleanOptionalAction
    (SGLANG, "enable-dsa-fused-indexer", "--no-enable-dsa-fused-indexer"),
    (SGLANG, "disable-radix-cache", None),  # no pair: off is leaving it out
])
def test_a_switch_set_false_renders_its_negative_form(spec, key, negative):
    tokens = engine_arg_tokens({key: False}, spec, owned={})
    assert tokens == ([negative] if negative else [])
    assert engine_arg_tokens({key: None}, spec, owned={}) == []  # null still means "leave it out"


def test_enable_prefix_caching_false_reaches_vllms_argv():
    doc = render_json("--profile", "tp4", "--set", "engine_args.enable-prefix-caching=false")
    argv = doc["hosts"][0]["engine_argv"]
    assert "--disable-prefix-caching" in argv and "--enable-prefix-caching" not in argv


@pytest.mark.parametrize("profile, name, says", [
    ("tp4", "NCCL_NOT_A_REAL", "NCCL does not read NCCL_NOT_A_REAL"),
    ("sglang-tp4-1m", "NCCL_NOT_A_REAL", "NCCL does not read NCCL_NOT_A_REAL"),
    ("tp4", "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE", "is a sglang variable"),
    ("sglang-tp4-1m", "VLLM_HOST_IP", "is a vllm variable"),
    ("sglang-tp4-1m", "DSV41_NOT_A_SWITCH", "the image's overlay does not read DSV41_NOT_A_SWITCH"),
])
def test_foreign_or_unknown_variables_are_refused(profile, name, says):
    result = render("--profile", profile, "--env", f"{name}=1")
    assert result.code == 2, result
    assert says in result.stderr and f"env.{name}" in result.stderr, result.stderr


def test_known_names_pass():
    assert check_env(VLLM, {"NCCL_IB_HCA": "x", "NCCL_PROTO": "^LL128", "DSV41_ENGRAM_DISK": "1"}) == []
    render_json("--profile", "sglang-tp4-1m", "--env", "DSV41_CACHE_GIB=2", "--env", "NCCL_MIN_NCHANNELS=4")
    with pytest.raises(ConfigError, match="did you mean NCCL_MAX_NCHANNELS"):
        check_env(SGLANG, {"NCCL_MAX_NCHANNEL": "8"})


def test_nccl_list_holds_every_name_the_shipped_profiles_use():
    known = nccl_variables()
    for name in ("NCCL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_PROTO", "NCCL_MAX_NCHANNELS", "NCCL_CUMEM_ENABLE",
                 "NCCL_IB_MERGE_NICS", "NCCL_NVLS_ENABLE", "NCCL_IB_ROCE_VERSION_NUM", "NCCL_SOCKET_IFNAME"):
        assert name in known
    assert "NCCL_IB_SUBNET_AWARE_ROUTING" not in known  # the source passes it; NCCL does not read it


def test_the_shipped_sglang_list_holds_only_variables():
    shipped = set(SGLANG.envs)
    assert not {"SGLANG_OLD_NAME", "SGLANG_NEW_NAME", "SGLANG_EXA_"} & shipped
    assert not any(name.endswith("_") for name in shipped)
    try:
        with open(f"{SHARED_ENGINES}/sglang-0.5.23-envs.txt", encoding="utf-8") as handle:
            released = {line.strip() for line in handle if line.strip() and not line.startswith("#")}
    except OSError:
        pytest.skip("the released engine surfaces are not on this machine")
    assert shipped == released


def test_the_overlay_switches_join_the_surface():
    """Render checks the overlay's variables like engine options: the chain's list, plus what the
    surface probe read from the built image's adapter folders."""
    import dataclasses

    from sparkctl.config.profile import load_profile
    from sparkctl.ops.render import with_overlay

    profile = load_profile("sglang-tp4-1m").profile
    shipped = with_overlay(SGLANG, profile)
    assert {"OFFLOAD_MODE", "DSV41_PACKED_DIR"} <= shipped.switches and "DSV41_" in shipped.switch_prefixes
    scanned = with_overlay(dataclasses.replace(SGLANG, switches=frozenset({"DSV41_ONLY_IN_THE_IMAGE"}),
                                               switches_source="the image"), profile)
    assert {"DSV41_ONLY_IN_THE_IMAGE", "OFFLOAD_MODE"} <= scanned.switches
    assert with_overlay(VLLM, load_profile("tp4").profile).switches == frozenset()  # vllm-dsv41 declares none
