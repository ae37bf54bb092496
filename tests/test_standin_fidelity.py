"""The stand-in engines answer, field for field, what vLLM 0.33.0 and SGLang 0.5.23 answer, and refuse
what they refuse: batches of completion prompts, the default completion budget, usage on every
stream chunk, logit_bias and token ids against the vocabulary, the model name. Each engine is served
from a thread of this process (``standin_inproc``); every answer is checked against the engine's
response schemas (/work/shared/engines, copied under tests/data/engine_api)."""

from __future__ import annotations

import pytest

from sparkctl.standin.simulate import Timing
from standin_inproc import VOCAB_SIZE, check, served, stream

ENGINES = ["vllm", "sglang"]


@pytest.fixture(scope="module")
def vllm():
    with served("vllm") as client:
        yield client


@pytest.fixture(scope="module")
def sglang():
    with served("sglang") as client:
        yield client


@pytest.fixture
def engines(vllm, sglang):
    return {"vllm": vllm, "sglang": sglang}


def _error(engine: str, response) -> dict:
    """The error's fields, whichever shape the engine writes (checked against its schema)."""
    doc = response.json()
    check(engine, "ErrorResponse", doc)
    return doc["error"] if engine == "vllm" else doc


# ------------------------------------------------------------------------------------- batches of prompts


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("prompt, counts", [
    (["one two", "three four five"], [2, 3]),
    ([[11, 12], [13, 14, 15]], [2, 3]),
    (["alone"], [1]),
])
def test_a_list_of_prompts_is_answered_one_choice_per_prompt_and_n(engines, engine, prompt, counts):
    doc = engines[engine].post("/v1/completions", json={"model": "dsv41", "prompt": prompt, "n": 2,
                                                         "max_tokens": 3})
    assert doc.status_code == 200, doc.text
    doc = doc.json()
    check(engine, "CompletionResponse", doc)
    assert [c["index"] for c in doc["choices"]] == list(range(2 * len(counts)))
    assert all(len(c["text"].split()) == 3 and c["finish_reason"] == "length" for c in doc["choices"])
    assert doc["usage"]["prompt_tokens"] == sum(counts)  # each prompt once, whatever n
    assert doc["usage"]["completion_tokens"] == 3 * 2 * len(counts)
    chunks = stream(engines[engine], "/v1/completions", {"prompt": prompt, "n": 2, "max_tokens": 3,
                                                         "stream_options": {"include_usage": True}})
    for chunk in chunks:
        check(engine, "CompletionStreamResponse", chunk)
    texts: dict = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert sorted(texts) == list(range(2 * len(counts))) and all(len(t.split()) == 3 for t in texts.values())
    assert chunks[-1]["usage"]["prompt_tokens"] == sum(counts)


def test_a_token_id_prompt_is_one_prompt(vllm):
    doc = vllm.post("/v1/completions", json={"prompt": [5, 6, 7, 8], "max_tokens": 2}).json()
    assert len(doc["choices"]) == 1 and doc["usage"]["prompt_tokens"] == 4


@pytest.mark.parametrize("engine, prompt, message", [
    ("vllm", [], "The decoder prompt cannot be empty"),
    ("vllm", [[1, 2], []], "The decoder prompt cannot be empty"),
    ("vllm", [1, VOCAB_SIZE], f"Token id {VOCAB_SIZE} is out of vocabulary"),
    ("vllm", ["a", 1], "prompt"),
    ("vllm", [-1, 2], "prompt"),
    ("sglang", "", "Prompt cannot be empty"),
    ("sglang", ["", ""], "Prompt cannot be empty"),
    ("sglang", {"text": "x"}, "prompt"),
])
def test_bad_prompts_are_refused_as_the_engine_refuses_them(engines, engine, prompt, message):
    response = engines[engine].post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400, response.text
    assert message in _error(engine, response)["message"]


def test_every_prompt_of_a_batch_must_fit_the_context(vllm):
    long = " ".join(["w"] * 4090)
    response = vllm.post("/v1/completions", json={"prompt": ["short", long], "max_tokens": 10})
    assert response.status_code == 400
    assert "your request has 4090 input tokens" in _error("vllm", response)["message"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_completion_without_max_tokens_gets_16(engine):
    """CompletionRequest.max_tokens defaults to 16 in both engines' OpenAPI; chat has no default."""
    with served(engine, timing=Timing(ttft_base_ms=0.5, itl_ms=0.1, answer_tokens=40)) as client:
        choice = client.post("/v1/completions", json={"prompt": "go on"}).json()["choices"][0]
        assert len(choice["text"].split()) == 16 and choice["finish_reason"] == "length"
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "go"}]}).json()
        assert chat["usage"]["completion_tokens"] == 40 and chat["choices"][0]["finish_reason"] == "stop"


# ------------------------------------------------------------------------------------- usage on every chunk


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": ["a b", "c"], "n": 2, "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 4}),
])
def test_continuous_usage_stats_puts_each_choices_usage_on_every_chunk(vllm, path, body):
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = stream(vllm, path, dict(body, stream_options=options))
    kind = "ChatCompletionStreamResponse" if "chat" in path else "CompletionStreamResponse"
    sent: dict = {}
    for chunk in chunks[:-1]:
        check("vllm", kind, chunk)
        (choice,) = chunk["choices"]
        usage = chunk["usage"]
        has_token = bool(choice.get("text") or (choice.get("delta") or {}).get("content")
                         or (choice.get("delta") or {}).get("reasoning"))
        sent[choice["index"]] = sent.get(choice["index"], 0) + (1 if has_token else 0)
        assert usage["completion_tokens"] == sent[choice["index"]], chunk
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert set(sent.values()) == {4}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4 * len(sent)
    # vLLM reads continuous_usage_stats only with include_usage (its should_include_usage)
    plain = stream(vllm, path, dict(body, stream_options={"continuous_usage_stats": True}))
    assert all(chunk.get("usage") is None for chunk in plain)


def test_sglang_reads_continuous_usage_stats_alone(sglang):
    chunks = stream(sglang, "/v1/completions", {"prompt": "a b c", "max_tokens": 3,
                                                "stream_options": {"continuous_usage_stats": True}})
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 3]
    assert all(c["usage"]["prompt_tokens"] == 3 for c in chunks)
    for chunk in chunks:
        check("sglang", "CompletionStreamResponse", chunk)


# ------------------------------------------------------------------------------------- vocabulary


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}),
])
def test_logit_bias_outside_the_vocabulary_is_refused_like_vllm(vllm, sglang, path, body):
    inside = vllm.post(path, json=dict(body, logit_bias={"5": 10, str(VOCAB_SIZE - 1): -100}))
    assert inside.status_code == 200, inside.text
    refused = vllm.post(path, json=dict(body, logit_bias={"5": 1, str(VOCAB_SIZE): 1, "-3": 2}))
    assert refused.status_code == 400
    error = _error("vllm", refused)
    assert error["message"] == (f"token_id(s) [{VOCAB_SIZE}, -3] in logit_bias contain out-of-vocab token ids. "
                                f"Vocabulary size: {VOCAB_SIZE}")
    assert error["param"] == "logit_bias" and error["code"] == 400
    not_an_id = vllm.post(path, json=dict(body, logit_bias={"abc": 1}))
    assert not_an_id.status_code == 400 and "invalid literal for int()" in _error("vllm", not_an_id)["message"]
    not_a_number = vllm.post(path, json=dict(body, logit_bias={"5": "high"}))
    assert not_a_number.status_code == 400 and "logit_bias" in _error("vllm", not_a_number)["message"]
    # SGLang 0.5.23 passes the bias to its sampler unchecked
    assert sglang.post(path, json=dict(body, logit_bias={str(VOCAB_SIZE): 1})).status_code == 200


# ------------------------------------------------------------------------------------- the model name


def test_a_wrong_model_is_404_from_vllm_and_echoed_by_sglang(vllm, sglang):
    body = {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    refused = vllm.post("/v1/chat/completions", json=body)
    assert refused.status_code == 404
    assert _error("vllm", refused)["message"] == "The model `gpt-4` does not exist."
    answer = sglang.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200 and answer.json()["model"] == "gpt-4"
    bare = sglang.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()
    assert bare["model"] == "default"  # SGLang's CompletionRequest.model default
    assert vllm.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()["model"] == "dsv41"
