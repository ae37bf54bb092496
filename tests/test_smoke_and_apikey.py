"""``sparkctl smoke`` against stand-in engines, and the API key from the profile to the engine's env file.

The stand-ins run as processes on 127.0.0.1 (vLLM-flavoured with a key, SGLang-flavoured, and a
vLLM one started without --enable-auto-tool-choice, whose tool-call check must fail).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time

import pytest

from sparkctl.config.apikey import api_key_for, auth_headers
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.ops.health import probe_endpoint
from sparkctl.ops.smoke import run_smoke
from test_render_helpers import render
from test_standin_support import Proc, free_port, run_cli, wait_http

pytestmark = pytest.mark.integration  # stand-in engines served as processes

KEY = "sk-smoke-42"
FAST = {"SPARKCTL_STANDIN_ITL_MS": "1", "SPARKCTL_STANDIN_TTFT_BASE_MS": "2"}
FULL = ["models", "chat", "chat_stream", "tool_call", "tool_call_stream", "thinking_on", "thinking_off",
        "completions", "bad_request"]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from sparkctl.engram.checkpoint_maker import make_checkpoint

    root = tmp_path_factory.mktemp("smoke")
    model = str(root / "model")
    make_checkpoint(model, vocab_size=64)
    ports = {name: free_port() for name in ("vllm", "sglang", "plain")}
    vllm_common = [sys.executable, "-m", "sparkctl.standin", "vllm", "serve", model, "--served-model-name", "dsv41",
                   "--host", "127.0.0.1", "--max-model-len", "4096", "--reasoning-parser", "deepseek_v41"]
    procs = {
        "vllm": Proc(vllm_common + ["--port", str(ports["vllm"]), "--tool-call-parser", "deepseek_v41",
                                    "--enable-auto-tool-choice"], root / "vllm.log", env={**FAST, "VLLM_API_KEY": KEY}),
        "plain": Proc(vllm_common + ["--port", str(ports["plain"])], root / "plain.log", env=FAST),
        "sglang": Proc([sys.executable, "-m", "sparkctl.standin", "sglang", "--model-path", model, "--served-model-name",
                        "dsv41", "--host", "127.0.0.1", "--port", str(ports["sglang"]), "--reasoning-parser",
                        "deepseek-v41", "--tool-call-parser", "deepseekv41"], root / "sglang.log", env=FAST),
    }
    try:
        for name, proc in procs.items():
            wait_http(f"http://127.0.0.1:{ports[name]}/health", timeout=60, proc=proc)
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    finally:
        for proc in procs.values():
            proc.stop()


# ---------------------------------------------------------------------------------------------- smoke


def test_smoke_passes_every_check_with_the_key(engines):
    report = run_smoke(engines["vllm"], model="dsv41", api_key=KEY, engine="vllm")
    assert [c.name for c in report.checks] == FULL + ["auth"]
    assert report.ok, report.human()
    doc = report.to_json()
    assert set(doc) == {"ok", "endpoint", "checks"} and doc["endpoint"] == engines["vllm"]
    assert all(set(c) == {"name", "ok", "seconds", "detail"} and c["seconds"] >= 0 for c in doc["checks"])
    assert "get_weather" in doc["checks"][3]["detail"] and "in reasoning" in doc["checks"][5]["detail"]
    assert KEY not in json.dumps(doc)


def test_smoke_names_what_fails(engines):
    no_key = run_smoke(engines["vllm"], model="dsv41", engine="vllm", quick=True)
    assert not no_key.ok and [c.name for c in no_key.checks] == ["models", "chat", "chat_stream"]
    assert "401" in no_key.checks[0].detail and "API key" in no_key.checks[0].detail
    wrong_engine = run_smoke(engines["sglang"], model="dsv41", engine="vllm")
    failed = {c.name: c.detail for c in wrong_engine.failed}
    assert set(failed) == {"thinking_on", "bad_request"}  # SGLang's field and error shape, not vLLM's
    assert "reasoning_content" in failed["thinking_on"]
    assert run_smoke(engines["sglang"], model="dsv41", engine="sglang").ok
    no_parser = run_smoke(engines["plain"], model="dsv41", engine="vllm")
    assert {c.name for c in no_parser.failed} == {"tool_call", "tool_call_stream"}
    assert "--enable-auto-tool-choice" in no_parser.failed[0].detail


def test_smoke_of_a_dead_endpoint_is_bounded_and_has_no_traceback():
    started = time.monotonic()
    report = run_smoke(f"http://127.0.0.1:{free_port()}", model="m", quick=True, timeout_s=2)
    assert not report.ok and time.monotonic() - started < 15 * 2  # a few of its 2 s timeouts, never a hang
    assert all("Connect" in c.detail or "refused" in c.detail for c in report.checks)


def test_smoke_cli_exit_codes_and_json(engines):
    ok = run_cli("--json", "smoke", "--endpoint", engines["vllm"], "--model", "dsv41", "--api-key-env", "SMOKE_KEY",
                 env={"SMOKE_KEY": KEY})
    assert ok.code == 0, ok
    doc = json.loads(ok.stdout)
    assert doc["ok"] is True and len(doc["checks"]) == 10 and KEY not in ok.stdout + ok.stderr
    bad = run_cli("smoke", "--endpoint", engines["plain"], "--model", "dsv41")
    assert bad.code == 1 and "FAILED: tool_call, tool_call_stream" in bad.stdout
    assert "Traceback" not in bad.stderr
    usage = run_cli("smoke", "--endpoint", engines["plain"], "--model", "dsv41", "--api-key-env", "NOT_SET_ANYWHERE")
    assert usage.code == 2 and "NOT_SET_ANYWHERE" in usage.stderr
    assert run_cli("smoke").code == 2


# ---------------------------------------------------------------------------------------------- the key


def test_health_probe_sends_the_key(engines):
    assert probe_endpoint(engines["vllm"], "dsv41", api_key=KEY).ok
    refused = probe_endpoint(engines["vllm"], "dsv41")
    assert not refused.ok and "401" in refused.detail and "api_key_env" in refused.detail
    assert auth_headers(None) == {} and auth_headers("k") == {"Authorization": "Bearer k"}


def test_api_key_for_reads_the_named_variable_or_file(tmp_path):
    assert api_key_for(load_profile("sandbox")) is None
    profile = load_profile("sandbox", sets=["serving.api_key_env=SPARK_TEST_KEY"])
    assert api_key_for(profile, {"SPARK_TEST_KEY": "abc"}) == "abc"
    with pytest.raises(ConfigError, match="serving.api_key_env: environment variable SPARK_TEST_KEY is not set"):
        api_key_for(profile, {})
    with pytest.raises(ConfigError) as unsafe:
        api_key_for(profile, {"SPARK_TEST_KEY": "has space secret"})
    assert "secret" not in str(unsafe.value)  # never shows the key
    key_file = tmp_path / "key"
    key_file.write_text("from-file\nignored\n")
    key_file.chmod(0o644)
    by_file = load_profile("sandbox", sets=[f"serving.api_key_file={key_file}"])
    with pytest.raises(ConfigError, match="chmod 600"):
        api_key_for(by_file)
    key_file.chmod(0o600)
    assert api_key_for(by_file) == "from-file"
    with pytest.raises(ConfigError, match="cannot read"):
        api_key_for(load_profile("sandbox", sets=[f"serving.api_key_file={tmp_path / 'none'}"]))
    with pytest.raises(ConfigError, match="not both"):
        load_profile("sandbox", sets=["serving.api_key_env=A", f"serving.api_key_file={key_file}"])


def test_the_key_reaches_only_the_env_file(tmp_path):
    out = tmp_path / "out"
    result = render("--profile", "tp4", "--set", "serving.api_key_env=SPARK_RENDER_KEY", "--out", str(out),
                    env={"SPARK_RENDER_KEY": "render-key-77"})
    assert result.code == 0, result
    holders = []
    for path in sorted(out.rglob("*")):
        if path.is_file() and "render-key-77" in path.read_text():
            holders.append(path.name)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert "VLLM_API_KEY=render-key-77" in path.read_text().splitlines()
    assert holders and set(holders) == {"engine.env"}
    assert "render-key-77" not in result.stdout + result.stderr
    for shown in (render("--profile", "tp4", "--set", "serving.api_key_env=SPARK_RENDER_KEY", *extra,
                         env={"SPARK_RENDER_KEY": "render-key-77"}) for extra in ([], ["--json"])):
        assert shown.code == 0 and "render-key-77" not in shown.stdout + shown.stderr
        assert "VLLM_API_KEY" in shown.stdout  # named, value masked
    missing = render("--profile", "tp4", "--set", "serving.api_key_env=SPARK_UNSET_KEY")
    assert missing.code == 2 and "SPARK_UNSET_KEY" in missing.stderr and "Traceback" not in missing.stderr


def test_sglang_and_argv_keys_are_refused():
    sglang = render("--profile", "sglang-tp4-1m", "--set", "serving.api_key_env=SPARK_SG_KEY", env={"SPARK_SG_KEY": "k1"})
    assert sglang.code == 2 and "serving.api_key_env" in sglang.stderr and "--api-key" in sglang.stderr
    argv = render("--profile", "tp4", "--set", "engine_args.api-key=sk-live-123")
    assert argv.code == 2 and "--api-key is set by sparkctl" in argv.stderr and "sk-live-123" not in argv.stderr
