"""The stand-in engines answer, field for field, what vLLM 0.33.0 and SGLang 0.5.23 answer, and refuse
what they refuse: batches of completion prompts, the default completion budget, usage on every
stream chunk, logit_bias and token ids against the vocabulary, the model name. Each engine is served
from a thread of this process (``standin_inproc``); every answer is checked against the engine's
response schemas (the engines' exported surfaces, copied under tests/data/engine_api)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from sparkctl.standin import routes
from sparkctl.standin.simulate import Timing
from standin_inproc import DATA, VERSIONS, VOCAB_SIZE, check, served, stream

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
    ("vllm", {"suffix": "end"}, "suffix is not currently supported"),
    ("vllm", {"prompt_embeds": "AAAA"}, "You must set `--enable-prompt-embeds` to input `prompt_embeds`."),
    ("sglang", "", "Prompt cannot be empty"),
    ("sglang", ["", ""], "Prompt cannot be empty"),
    ("sglang", {"text": "x"}, "prompt"),
])
def test_bad_prompts_are_refused_as_the_engine_refuses_them(engines, engine, prompt, message):
    body = dict(prompt, prompt="x") if isinstance(prompt, dict) and engine == "vllm" else {"prompt": prompt}
    response = engines[engine].post("/v1/completions", json=dict(body, max_tokens=2))
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


# ------------------------------------------------------------------------------------- routes


def _declared(engine: str) -> dict:
    return json.loads((DATA / f"{VERSIONS[engine]}-routes.json").read_text())


@pytest.mark.parametrize("engine", ENGINES)
def test_the_route_table_is_the_engines_openapi(engine):
    """tests/data/engine_api/<engine>-routes.json is the OpenAPI's paths, read off the document."""
    shared = Path(f"/work/shared/engines/{VERSIONS[engine]}-openapi.json")
    if shared.is_file():
        paths = json.loads(shared.read_text())["paths"]
        assert _declared(engine) == {p: sorted(m.upper() for m in v) for p, v in paths.items()}
    assert {p: m.split() for p, m in routes.OPENAPI[engine].items()} == _declared(engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_declared_route_answers_and_an_undeclared_one_is_404(engines, engine):
    client = engines[engine]
    for template, methods in _declared(engine).items():
        path = template.replace("{model}", "nope").replace("{response_id}", "resp_nope")
        for method in methods:
            response = client.request(method, path, json={} if method in ("POST", "PUT") else None)
            if method == "HEAD":  # no body to read
                assert response.status_code == 501, path
            elif response.status_code == 404:  # an unknown name, said in the engine's words
                assert "{" in template and response.json() != {"detail": "Not Found"}, (method, path)
            elif response.status_code == 501:
                assert "not served by this stand-in" in _error(engine, response)["message"]
            else:
                assert response.status_code in (200, 400), (method, path, response.status_code, response.text)
    assert client.get("/v1/nope").json() == {"detail": "Not Found"}
    assert client.get("/v1/nope").status_code == 404
    not_sglang = ["/version", "/load"] if engine == "sglang" else ["/v1/models/dsv41", "/v1/loads"]
    for path in not_sglang:
        assert client.get(path).status_code == 404, path
    wrong = client.put("/v1/chat/completions", json={})
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"


def test_sglang_serves_one_models_card_by_name(sglang):
    card = sglang.get("/v1/models/dsv41")
    assert card.status_code == 200
    check("sglang", "ModelCard", card.json())
    assert card.json()["id"] == "dsv41" and card.json()["max_model_len"] == 4096
    unknown = sglang.get("/v1/models/org/other")
    assert unknown.status_code == 404
    assert unknown.json() == {"error": {"message": "The model 'org/other' does not exist",
                                        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}


def test_sglang_pings_with_get_only(sglang, vllm):
    assert sglang.get("/ping").status_code == 200 and sglang.post("/ping").status_code == 405
    assert vllm.post("/ping").status_code == 200
    assert sglang.get("/health_generate").status_code == 200


# ------------------------------------------------------------------------------------- /v1/responses


@pytest.mark.parametrize("engine", ENGINES)
def test_the_openai_sdk_reads_responses_plain_and_streamed(engines, engine):
    import openai

    client = engines[engine]
    sdk = openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="none", max_retries=0, timeout=30)
    answer = sdk.responses.create(model="dsv41", input="Say something.", max_output_tokens=5)
    assert answer.status == "incomplete" and len(answer.output_text.split()) == 5
    assert answer.usage.output_tokens == 5 and answer.usage.input_tokens > 0
    thinking = sdk.responses.create(model="dsv41", instructions="Be brief.",
                                    input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                                    extra_body={"chat_template_kwargs": {"thinking": True}})
    assert thinking.status == "completed" and [item.type for item in thinking.output] == ["reasoning", "message"]
    assert thinking.usage.output_tokens_details.reasoning_tokens == 4
    assert len(thinking.output_text.split()) == 12
    events = list(sdk.responses.create(model="dsv41", input="hi", stream=True,
                                       extra_body={"chat_template_kwargs": {"thinking": True}}))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text and len(text.split()) == 12
    assert kinds.count("response.reasoning_text.delta") == 4
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve("resp_unknown")
    refused = client.post("/v1/responses", json={"input": "hi", "tools": [{"type": "function", "name": "f"}]})
    assert refused.status_code == 501 and "tools" in _error(engine, refused)["message"]
    assert client.post("/v1/responses", json={"input": "hi", "temperature": -1}).status_code == 400


# ------------------------------------------------------------------------------------- the openai SDK


@pytest.mark.parametrize("engine", ENGINES)
def test_the_openai_sdk_gets_batches_and_running_usage(engines, engine):
    import openai

    sdk = openai.OpenAI(base_url=str(engines[engine].base_url) + "/v1", api_key="none", max_retries=0, timeout=30)
    batch = sdk.completions.create(model="dsv41", prompt=["one", "two three"], n=2, max_tokens=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3] and batch.usage.prompt_tokens == 3
    usages = [chunk.usage.completion_tokens for chunk in sdk.chat.completions.create(
        model="dsv41", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}) if chunk.choices]
    assert usages == [0, 1, 2, 3]



def test_tokenize_gives_only_ids_the_engine_takes_back():
    """A model of 64 tokens: /tokenize never names id 64 or more, and its ids go back in as a prompt."""
    with served("vllm", vocab_size=64) as client:
        ids = client.post("/tokenize", json={"prompt": " ".join(f"w{i}" for i in range(200))}).json()["tokens"]
        assert len(ids) == 200 and max(ids) == 63
        assert client.post("/v1/completions", json={"prompt": ids, "max_tokens": 2}).status_code == 200
        refused = client.post("/v1/completions", json={"prompt": [64], "max_tokens": 2})
        assert refused.status_code == 400 and _error("vllm", refused)["message"] == "Token id 64 is out of vocabulary"


@pytest.mark.parametrize("engine", ENGINES)
def test_echo_puts_each_prompt_before_its_answer(engines, engine):
    client = engines[engine]
    body = {"prompt": ["first one", "second"], "max_tokens": 2, "echo": True}
    doc = client.post("/v1/completions", json=body).json()
    check(engine, "CompletionResponse", doc)
    plain = client.post("/v1/completions", json=dict(body, echo=False)).json()
    assert [c["text"] for c in doc["choices"]] == ["first one" + plain["choices"][0]["text"],
                                                   "second" + plain["choices"][1]["text"]]
    assert doc["usage"] == plain["usage"]
    chunks = stream(client, "/v1/completions", body)
    streamed = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["text"]
    assert [streamed[0], streamed[1]] == [c["text"] for c in doc["choices"]]
    ids = client.post("/v1/completions", json={"prompt": [[1, 2]], "max_tokens": 1, "echo": True}).json()
    assert ids["choices"][0]["text"].startswith("the model")  # ids 1 and 2 read back as their words


# ------------------------------------------------------------------------------------- /v1/messages


def _typed_events(response) -> list:
    """``event: TYPE`` / ``data: {...}`` pairs, each event's type the same in both."""
    events = []
    for block in response.read().decode().split("\n\n"):
        if block.strip():
            head, data = block.split("\n", 1)
            event = json.loads(data[len("data: "):])
            assert head == "event: " + event["type"]
            events.append(event)
    return events


@pytest.mark.parametrize("engine", ENGINES)
def test_the_messages_api_answers_in_anthropics_shape(engines, engine):
    client = engines[engine]
    body = {"model": "dsv41", "max_tokens": 64, "system": "Be brief.", "thinking": {"type": "enabled"},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    doc = client.post("/v1/messages", json=body).json()
    assert doc["type"] == "message" and doc["role"] == "assistant" and doc["stop_reason"] == "end_turn"
    assert [b["type"] for b in doc["content"]] == ["thinking", "text"] and len(doc["content"][1]["text"].split()) == 12
    assert doc["usage"]["output_tokens"] == 16 and doc["usage"]["input_tokens"] > 0
    short = client.post("/v1/messages", json=dict(body, max_tokens=2, thinking=None)).json()
    assert short["stop_reason"] == "max_tokens" and [b["type"] for b in short["content"]] == ["text"]
    with client.stream("POST", "/v1/messages", json=dict(body, stream=True)) as response:
        assert response.status_code == 200
        events = _typed_events(response)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"] == ["thinking", "text"]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == doc["content"][1]["text"] and kinds.count("content_block_stop") == 2
    assert events[-2]["delta"]["stop_reason"] == "end_turn" and events[-2]["usage"]["output_tokens"] == 16
    counted = client.post("/v1/messages/count_tokens", json={"model": "dsv41", "messages": body["messages"],
                                                              "system": body["system"]})
    assert counted.json() == {"input_tokens": doc["usage"]["input_tokens"]}
    bare = client.post("/v1/messages/count_tokens", json={"model": "dsv41", "messages": body["messages"]}).json()
    assert bare["input_tokens"] < doc["usage"]["input_tokens"]  # the system message counts


@pytest.mark.parametrize("engine", ENGINES)
def test_the_messages_api_refuses_in_anthropics_shape(engines, engine):
    client = engines[engine]
    missing = client.post("/v1/messages", json={"model": "dsv41", "messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 400
    assert missing.json()["type"] == "error" and missing.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.json()["error"]["message"]
    tools = client.post("/v1/messages", json={"model": "dsv41", "max_tokens": 5, "tools": [{"name": "f"}],
                                              "messages": [{"role": "user", "content": "x"}]})
    assert tools.status_code == 501 and tools.json()["error"]["type"] == "api_error"
    wrong = client.post("/v1/messages", json={"model": "other", "max_tokens": 5,
                                              "messages": [{"role": "user", "content": "x"}]})
    if engine == "vllm":
        assert wrong.status_code == 404 and wrong.json()["error"]["type"] == "not_found_error"
    else:
        assert wrong.status_code == 200 and wrong.json()["model"] == "other"


def test_completion_logprobs_offsets_as_each_engine_gives_them(vllm, sglang):
    body = {"prompt": "a b", "max_tokens": 3, "logprobs": 1}
    offsets = vllm.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(set(offsets)) == 3
    assert sglang.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["text_offset"] == [-1, -1, -1]
    streamed = stream(sglang, "/v1/completions", body)
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in streamed] == [[-1]] * 3


def test_a_body_that_is_not_json_is_a_validation_error_for_vllm(vllm):
    response = vllm.post("/v1/chat/completions", content=b"{not json")
    assert response.status_code == 400 and _error("vllm", response)["type"] == "Bad Request"


def test_tokenize_counts_messages_as_a_chat_request_counts_them(vllm, sglang):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    usage = vllm.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()["usage"]
    assert vllm.post("/tokenize", json={"messages": messages}).json()["count"] == usage["prompt_tokens"]
    assert sglang.post("/v1/tokenize", json={"messages": messages}).json()["count"] == usage["prompt_tokens"]
    bare = vllm.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()["count"]
    assert bare == usage["prompt_tokens"] - 2


@pytest.mark.parametrize("seed, ok", [(2 ** 63 - 1, True), (-2 ** 63, True), (2 ** 63, False), (-2 ** 63 - 1, False)])
def test_a_seed_must_be_a_64_bit_integer(vllm, seed, ok):
    response = vllm.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "seed": seed})
    assert (response.status_code == 200) is ok, response.text
    if not ok:
        assert _error("vllm", response)["type"] == "Bad Request"


@pytest.mark.parametrize("engine, words, budget, message", [
    ("vllm", 4097, 1, "This model's maximum context length is 4096 tokens. However, your request has 4097 input tokens."),
    ("vllm", 4000, 97, "'max_tokens' or 'max_completion_tokens' is too large: 97."),
    ("sglang", 4096, 1, "The input (4096 tokens) is longer than the model's context length (4096 tokens)."),
    ("sglang", 4000, 96, "Requested token count exceeds the model's maximum context length of 4096 tokens. You "
                         "requested a total of 4096 tokens: 4000 tokens from the input messages and 96 tokens"),
])
def test_a_prompt_past_the_context_is_refused_in_the_engines_words(engines, engine, words, budget, message):
    response = engines[engine].post("/v1/completions", json={"prompt": " ".join(["w"] * words), "max_tokens": budget})
    assert response.status_code == 400 and message in _error(engine, response)["message"]
    fits = {"vllm": (4000, 96), "sglang": (4000, 95)}[engine]
    assert engines[engine].post("/v1/completions", json={"prompt": " ".join(["w"] * fits[0]),
                                                         "max_tokens": fits[1]}).status_code == 200


def test_an_unexpected_failure_is_answered_500_in_the_engines_shape(vllm, monkeypatch):
    from sparkctl.standin import server

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(server.A, "plan_choices", broken)
    response = vllm.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 500
    assert _error("vllm", response) == {"message": "RuntimeError: planted", "type": "InternalServerError",
                                        "param": None, "code": 500}
    # The keep-alive connection serves the next request: a server that closed it after the 500 without
    # saying "Connection: close" fails a client's next request on it (http.client: RemoteDisconnected).
    connection = http.client.HTTPConnection(vllm.base_url.host, vllm.base_url.port, timeout=30)
    body = json.dumps({"messages": [{"role": "user", "content": "x"}]})
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    first = connection.getresponse()
    assert first.status == 500 and first.getheader("Connection", "").lower() != "close"
    first.read()
    monkeypatch.undo()
    connection.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1}),
                       {"Content-Type": "application/json"})
    assert connection.getresponse().status == 200
    connection.close()
