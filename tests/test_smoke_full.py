"""``smoke --full`` against the stand-in SGLang: the sources' validation checks pass on an engine that
serves the context, the long ones fail with the engine's refusal on one that does not, and the
stand-in's answers to them have the real engine's response shapes."""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from sparkctl.ops import smoke_full
from sparkctl.ops.smoke import run_smoke
from test_standin_api import check as schema_check
from test_standin_support import Proc, free_port, sparkctl, wait_http

pytestmark = pytest.mark.integration  # a stand-in engine served as a process

FAST = {"SPARKCTL_STANDIN_TTFT_BASE_MS": "1", "SPARKCTL_STANDIN_TTFT_PER_TOKEN_MS": "0.0005", "SPARKCTL_STANDIN_ITL_MS": "1"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    from sparkctl.engram.checkpoint_maker import make_checkpoint

    path = tmp_path_factory.mktemp("smoke-full") / "model"
    make_checkpoint(str(path), vocab_size=64)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 1_048_576
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def sglang(model: str, tmp_path, context: int):
    port = free_port()
    proc = Proc([sys.executable, "-m", "sparkctl.standin", "sglang", "--model-path", model, "--served-model-name", "dsv41",
                 "--host", "127.0.0.1", "--port", str(port), "--reasoning-parser", "deepseek-v41",
                 "--tool-call-parser", "deepseekv41", "--context-length", str(context), "--enable-multimodal"],
                tmp_path / f"sglang-{context}.log", env=FAST)
    wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
    return f"http://127.0.0.1:{port}", proc


def test_an_engine_serving_1m_passes_every_check_of_the_sources(model, tmp_path):
    endpoint, proc = sglang(model, tmp_path, 1_048_576)
    try:
        report = run_smoke(endpoint, model="dsv41", engine="sglang", full=True, context=1_048_576, timeout_s=120)
    finally:
        proc.stop()
    names = [c.name for c in report.checks]
    assert names[-10:] == smoke_full.full_names(1_048_576) and names[-1] == "retrieval_1m"
    assert report.ok, report.human()
    detail = {c.name: c.detail for c in report.checks}
    assert "8/8 answered" in detail["concurrency_wave_2"]
    assert "found" in detail["retrieval_1m"] and int(detail["retrieval_1m"].split()[0]) > 1_000_000
    assert all(c.seconds > 0 for c in report.checks)


def test_a_short_context_fails_the_long_retrievals_with_the_engines_refusal(model, tmp_path):
    endpoint, proc = sglang(model, tmp_path, 65_536)
    try:
        report = run_smoke(endpoint, model="dsv41", engine="sglang", full=True, context=65_536, timeout_s=60)
    finally:
        proc.stop()
    status = {c.name: c.ok for c in report.checks}
    assert "retrieval_1m" not in status  # only where the profile serves 1M
    assert status["retrieval_32k"] and not status["retrieval_128k"] and not status["retrieval_300k"]
    failed = {c.name: c.detail for c in report.failed}
    assert set(failed) == {"retrieval_128k", "retrieval_300k"}
    assert "answered 400" in failed["retrieval_128k"] and "the model's context length (65536 tokens)" in failed["retrieval_128k"]  # SGLang's words
    assert not report.ok and "smoke: FAILED: retrieval_128k, retrieval_300k" in report.human()


def test_the_standin_answers_these_in_the_engines_response_shapes(model, tmp_path):
    endpoint, proc = sglang(model, tmp_path, 65_536)
    try:
        with httpx.Client(base_url=endpoint, timeout=60) as client:
            images = [{"type": "image_url", "image_url": {"url": smoke_full.png((9, 9, 9))}}] * 4
            vision = client.post("/v1/chat/completions", json={"model": "dsv41", "max_tokens": 16, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What is shown?"}, *images]}]}).json()
            schema_check("sglang", "ChatCompletionResponse", vision)
            text, question, code, others = smoke_full.haystack(2000, seed=5)
            found = client.post("/v1/chat/completions", json={"model": "dsv41", "max_tokens": 16, "messages": [
                {"role": "user", "content": f"{text}\n\n{question}"}]}).json()
            schema_check("sglang", "ChatCompletionResponse", found)
            assert found["choices"][0]["message"]["content"].strip() == code
            # With the asked record taken out of the prompt there is nothing to find: no code comes back.
            missing = text.replace(f"the vault code is {code}.", "the vault is closed.")
            answer = client.post("/v1/chat/completions", json={"model": "dsv41", "max_tokens": 16, "messages": [
                {"role": "user", "content": f"{missing}\n\n{question}"}]}).json()["choices"][0]["message"]["content"]
            assert code not in answer and not any(o in answer for o in others)
            too_long = client.post("/v1/chat/completions", json={"model": "dsv41", "max_tokens": 16, "messages": [
                {"role": "user", "content": smoke_full.haystack(70_000, seed=1)[0]}]})
            assert too_long.status_code == 400
            schema_check("sglang", "ErrorResponse", too_long.json())
            tool = {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(smoke_full.CITY_WEATHER)}
            after = client.post("/v1/chat/completions", json={"model": "dsv41", "max_tokens": 64, "messages": [
                {"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, tool],
                "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}).json()
            schema_check("sglang", "ChatCompletionResponse", after)
            message = after["choices"][0]["message"]
            assert not message.get("tool_calls") and "temperature_c" in message["content"]
    finally:
        proc.stop()


def test_haystack_sizes_are_the_sources_and_count_as_asked():
    from sparkctl.standin.simulate import count_tokens

    for name, tokens in smoke_full.RETRIEVAL.items():
        if tokens > 200_000:
            continue
        text, question, code, others = smoke_full.haystack(tokens, seed=tokens % 9973)
        assert tokens - 60 <= count_tokens(text) <= tokens
        assert text.count("the vault code is") == 3 and code not in others
    assert smoke_full.RETRIEVAL == {"retrieval_32k": 32_768, "retrieval_128k": 131_072, "retrieval_300k": 299_000,
                                    "retrieval_1m": 1_000_000}


def test_png_is_a_real_png():
    import base64
    import zlib

    raw = base64.b64decode(smoke_full.png((1, 2, 3), size=4).split(",", 1)[1])
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    idat_len = int.from_bytes(raw[33:37], "big")
    assert zlib.decompress(raw[41:41 + idat_len]) == (b"\0" + bytes((1, 2, 3)) * 4) * 4


def test_quick_and_full_together_are_refused():
    result = sparkctl("smoke", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--quick", "--full")
    assert result.code == 2 and "--full" in result.stderr
