"""The engine plugins (sparkctl/engines/): one per profile engine, each answering what callers ask."""

from __future__ import annotations

import typing

import pytest

from sparkctl import engines
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError
from sparkctl.images import surface
from sparkctl.ops import smoke


def test_every_profile_engine_has_a_plugin_and_nothing_else_is_registered():
    assert set(engines.names()) == set(typing.get_args(Profile.model_fields["engine"].annotation))
    for name in engines.names():
        assert engines.get(name).name == name


def test_an_unknown_engine_is_one_line_naming_the_field():
    with pytest.raises(ConfigError) as err:
        engines.get("tgi")
    assert err.value.field == "engine" and "'tgi'" in err.value.detail and "vllm" in err.value.detail


@pytest.mark.parametrize("name", engines.names())
def test_every_smoke_check_a_plugin_lists_exists(name):
    checks = engines.get(name).smoke_checks
    assert checks, name
    missing = [check for check in checks if not callable(getattr(smoke._Smoke, f"check_{check}", None))]
    assert not missing


def test_the_single_box_checks_are_its_readme_switches():
    names = smoke.check_names(False, None, "single-box")
    assert names[:3] == list(smoke.QUICK) and set(smoke.THINKING_SWITCHES) <= set(names)
    assert smoke.check_names(False, "k", "single-box")[-1] == "auth"
    assert "bad_request" in smoke.check_names(False, None, "sglang")


def test_the_image_probe_reads_each_flag_surface_engine():
    compile(surface.PROBE, "probe", "exec")
    for engine in engines.served_by_flags():
        assert f"def read_{engine.name}(doc):" in surface.PROBE
    assert not engines.get("single-box").surface_reader


def test_serving_commands_are_recognised_by_their_own_engine_only():
    vllm, sglang = engines.get("vllm"), engines.get("sglang")
    serve = ["vllm", "serve", "/model", "--port", "8000"]
    launch = ["python3", "-m", "sglang.launch_server", "--port", "30000"]
    assert vllm.options_of(serve) == ["--port", "8000"] and sglang.options_of(serve) is None
    assert sglang.options_of(launch) == ["--port", "30000"] and vllm.options_of(launch) is None
    assert surface.options_of(["ray", "start", "--block"]) is None


def test_error_shapes_differ_as_the_engines_answer():
    shaped = {"message": "bad", "type": "BadRequestError", "code": 400}
    assert engines.get("vllm").error_in({"error": shaped}) == shaped
    assert engines.get("sglang").error_in({"object": "error", **shaped})["code"] == 400
    assert "object: error" in engines.get("sglang").error_in(shaped)


def test_only_vllm_takes_an_api_key_variable():
    assert engines.get("vllm").api_key_env("k", "serving.api_key_env") == {"VLLM_API_KEY": "k"}
    for name in ("sglang", "single-box"):
        with pytest.raises(ConfigError) as err:
            engines.get(name).api_key_env("k", "serving.api_key_file")
        assert err.value.field == "serving.api_key_file"


def test_the_start_guard_is_the_engines_own():
    from sparkctl.config.profile import load_profile

    single = load_profile("single-box").profile
    assert engines.get("single-box").min_free_gb(single) == pytest.approx(single.single_box.min_free_gib * 2**30 / 1e9)
    assert engines.get("single-box").listens_on_serving_host
    tp4 = load_profile("tp4").profile
    assert engines.get("vllm").min_free_gb(tp4) == pytest.approx(tp4.memory.unified_memory_gb * tp4.gpu_memory_utilization)
    assert not engines.get("vllm").listens_on_serving_host


def test_metric_names_of_no_engine_are_empty():
    from sparkctl.commands import engine_metrics

    assert engine_metrics.metric_names(None) == {} and engine_metrics.metric_names("single-box") == {}
    assert engine_metrics.metric_names("sglang")["running"] == "sglang:num_running_reqs"


def test_ray_is_vllms_alone():
    from sparkctl.config.profile import load_profile
    from sparkctl.ops.serve import head_ports

    ray = load_profile("tp4", sets=["distributed.launcher=ray"]).profile
    assert "ray port" in head_ports(ray, 4) and "rendezvous port" not in head_ports(ray, 4)
    assert "rendezvous port" in head_ports(load_profile("sglang-tp3").profile, 3)
    assert not engines.get("sglang").uses_ray(load_profile("sglang-tp3").profile)
