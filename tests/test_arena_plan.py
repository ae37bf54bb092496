"""The single-box profile's arena plan against the single-box engine's README numbers, and its refusals."""

from __future__ import annotations

import json

import pytest

from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.ops.arena_plan import plan_arena


def arena(*sets):
    return plan_arena(load_profile("single-box", sets=list(sets)).profile)


def test_shipped_default_is_39_percent_in_87_gb_leaving_16_5():
    plan = arena()
    assert plan.fits, plan.problems
    assert (plan.slots_per_layer, plan.slots) == (150, 6000)
    assert round(100 * plan.resident_fraction) == 39
    assert round(plan.arena_gb, 1) == 87.0
    assert round(plan.headroom_gb, 1) == 16.5


def test_fp4_streaming_row_73_8_gb_is_3926_slots_25_6_percent():
    plan = arena("single_box.expert_format=fp4", "single_box.arena_slots=3926", "single_box.arena_gb=null",
                 "single_box.prune_keep=null")
    assert plan.fits
    assert plan.slots == 3926 and plan.routed_experts == 15360
    assert round(plan.arena_gb, 1) == 73.8
    assert round(100 * plan.resident_fraction, 1) == 25.6
    assert round(plan.slot_mb, 1) == 18.8
    assert round(plan.all_experts_fp4_gb, 1) == 288.8


def test_fp4_arena_in_gb_counts_whole_slots():
    plan = arena("single_box.expert_format=fp4", "single_box.arena_gb=20", "single_box.prune_keep=null")
    assert plan.slots == 1063  # 20 GB / 18.8 MB, whole slots only
    assert round(100 * plan.resident_fraction, 1) == 6.9  # the README's 20 GB debug arena: 6.9 %


def test_44_percent_arena_leaving_5_5_gb_is_refused():
    plan = arena("single_box.prune_keep=0.44", "single_box.arena_gb=98")
    assert round(plan.headroom_gb, 1) == 5.5
    assert not plan.fits
    assert any("leaves 5.5 GB" in p and "prefill chunk" in p for p in plan.problems)


def test_killed_combination_refused_at_long_context_only():
    killed = arena("single_box.prune_keep=0.40", "single_box.arena_gb=89.2", "max_model_len=262144")
    assert killed.slots_per_layer == 154  # the README: 154 experts a layer
    assert round(killed.headroom_gb, 1) == 14.3  # more than a prefill chunk: only the kill refuses it
    assert not killed.fits
    assert any("killed" in p and "80,000" in p for p in killed.problems)
    short = arena("single_box.prune_keep=0.40", "single_box.arena_gb=89.2", "max_model_len=65536")
    assert short.fits, short.problems  # 0.40 is for prompts under roughly 80k tokens


def test_measured_256k_point_fits_and_bigger_unmeasured_arena_is_noted():
    assert arena("single_box.prune_keep=0.36", "single_box.arena_gb=81", "max_model_len=262144").fits
    noted = arena("single_box.prune_keep=0.37", "single_box.arena_gb=84", "max_model_len=262144")
    assert noted.fits and any("no measured point" in n for n in noted.notes)


def test_keep_set_larger_than_arena_is_refused():
    plan = arena("single_box.prune_keep=0.39", "single_box.arena_gb=80")
    assert any("keep-set" in p and "arena_gb" in p for p in plan.problems)


def test_bad_single_box_settings_name_the_field():
    with pytest.raises(ConfigError) as err:
        load_profile("single-box", sets=["single_box.prune_keep=1.5"])
    assert "single_box.prune_keep" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_profile("single-box", sets=["native.workdir=relative/dir"])
    assert "native.workdir" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_profile("single-box", sets=["tensor_parallel=2"])
    assert "tensor_parallel must be 1" in str(err.value)


def test_plan_cli_json_and_exit_codes(cli):
    ok = cli("--json", "plan", "--profile", "single-box")
    assert ok.code == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (doc["slots"], doc["resident_pct"], doc["arena_gb"], doc["headroom_gb"]) == (6000, 39.1, 87.0, 16.5)
    refused = cli("plan", "--profile", "single-box", "--set", "single_box.prune_keep=0.40",
                  "--set", "single_box.arena_gb=89.2", "--set", "max_model_len=262144")
    assert refused.code == 1
    assert "refused" in refused.stdout and "killed" in refused.stdout
