"""The stand-in engine held to the real engines' HTTP API: schemas, field names, tool calls, stop,
validation, routes, the API key, keep-alive, /metrics, and the openai SDK as a client.

One vLLM-flavoured and one SGLang-flavoured engine process per module (127.0.0.1, fast timing).
Every answer is validated against the engine's own response schemas (tests/data/engine_api), made
strict so that a field the engine does not declare (``reasoning_content`` from vLLM 0.33.0, say)
fails.
"""

from __future__ import annotations

import copy
import functools
import http.client
import json
import re
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import pytest

from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.standin import auth, tools
from sparkctl.standin.metrics import VLLM_SPEC_DECODE_COUNTERS
from test_standin_support import Proc, free_port, wait_http

pytestmark = pytest.mark.integration  # stand-in engines served as processes

DATA = Path(__file__).parent / "data" / "engine_api"
VERSIONS = {"vllm": "vllm-0.33.0", "sglang": "sglang-0.5.23"}
KEY = "sk-test-0123456789"
FAST = {"SPARKCTL_STANDIN_ITL_MS": "3", "SPARKCTL_STANDIN_TTFT_BASE_MS": "2",
        "SPARKCTL_STANDIN_REASONING_TOKENS": "4", "SPARKCTL_STANDIN_ANSWER_TOKENS": "12"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "required": ["city", "unit"],
                                                           "properties": {"city": {"type": "string"},
                                                                          "unit": {"enum": ["celsius", "fahrenheit"]},
                                                                          "days": {"type": "integer", "minimum": 1}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def _strict(node):
    """Forbid undeclared fields in every object schema that declares its properties."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if "properties" in node and node.get("type", "object") == "object":
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


SCHEMAS = {engine: {name: _strict(schema) for name, schema in
                    json.loads((DATA / f"{v}-response-schemas.json").read_text()).items()}
           for engine, v in VERSIONS.items()}


@functools.lru_cache(maxsize=None)
def _validator(engine: str, kind: str):
    """What ``jsonschema.validate`` builds on every call, built once: checking the schema itself
    against its meta-schema cost ~0.13 s of CPU a call, and a test checks hundreds of stream chunks."""
    schema = SCHEMAS[engine][kind]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check(engine: str, kind: str, doc) -> None:
    """``jsonschema.validate(doc, schema)``: the same errors, the best match raised."""
    error = jsonschema.exceptions.best_match(_validator(engine, kind).iter_errors(doc))
    if error is not None:
        raise error


# ---------------------------------------------------------------------------------------------- engines


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("standin-api") / "model"
    make_checkpoint(str(path), vocab_size=64)
    return str(path)


@pytest.fixture(scope="module")
def engines(model, tmp_path_factory):
    """{"vllm": base_url, "sglang": base_url}: both with an API key, a reasoning and a tool parser."""
    logs = tmp_path_factory.mktemp("standin-api-logs")
    vport, sport = free_port(), free_port()
    vllm = Proc([sys.executable, "-m", "sparkctl.standin", "vllm", "serve", model, "--served-model-name", "dsv41",
                 "--host", "127.0.0.1", "--port", str(vport), "--max-model-len", "4096",
                 "--reasoning-parser", "deepseek_v41", "--tool-call-parser", "deepseek_v41",
                 "--enable-auto-tool-choice",
                 "--speculative-config", '{"method": "dspark", "num_speculative_tokens": 5}'],
                logs / "vllm.log", env={**FAST, "VLLM_API_KEY": KEY})
    sglang = Proc([sys.executable, "-m", "sparkctl.standin", "sglang", "--model-path", model,
                   "--served-model-name", "dsv41", "--host", "127.0.0.1", "--port", str(sport),
                   "--context-length", "4096", "--reasoning-parser", "deepseek-v41", "--tool-call-parser", "deepseekv41",
                   "--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size", "5", "--api-key", KEY],
                  logs / "sglang.log", env=FAST)
    try:
        wait_http(f"http://127.0.0.1:{vport}/health", timeout=60, proc=vllm)
        wait_http(f"http://127.0.0.1:{sport}/health", timeout=60, proc=sglang)
        yield {"vllm": f"http://127.0.0.1:{vport}", "sglang": f"http://127.0.0.1:{sport}"}
    finally:
        vllm.stop()
        sglang.stop()


def client(url: str, key: str | None = KEY) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {key}"} if key else {})


def chat(**extra) -> dict:
    return {"model": "dsv41", "messages": [{"role": "user", "content": extra.pop("say", "Say something.")}], **extra}


def sse(response: httpx.Response) -> list:
    """The ``data:`` payloads of a stream; the last one must be [DONE]."""
    events = []
    for block in response.read().decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    assert events[-1] == "[DONE]"
    return events[:-1]


def stream(c: httpx.Client, path: str, body: dict) -> list:
    with c.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        return sse(response)


# ---------------------------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_answer_validates_against_the_engines_schemas(engines, engine):
    reasoning = "reasoning" if engine == "vllm" else "reasoning_content"
    other = "reasoning_content" if engine == "vllm" else "reasoning"
    with client(engines[engine]) as c:
        models = c.get("/v1/models").json()
        check(engine, "ModelList", models)
        assert models["data"][0]["id"] == "dsv41"

        plain_bodies = [
            chat(max_tokens=5),
            chat(chat_template_kwargs={"thinking": True}),
            chat(tools=[WEATHER, CLOCK], tool_choice="auto", say="What is the weather in Paris? Use a tool."),
            chat(tools=[WEATHER, CLOCK], tool_choice="required"),
            chat(tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "get_time"}}),
            chat(n=2, max_tokens=4, logprobs=True, top_logprobs=2),
            chat(response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER["function"]["parameters"]}}),
            chat(stop=[" the"], chat_template_kwargs={"thinking": True}),
        ]
        for body in plain_bodies:
            response = c.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            doc = response.json()
            check(engine, "ChatCompletionResponse", doc)
            for choice in doc["choices"]:
                assert other not in choice["message"]
        thinking = c.post("/v1/chat/completions", json=plain_bodies[1]).json()["choices"][0]["message"]
        assert thinking[reasoning] and thinking["content"]

        for body in (chat(max_tokens=5, stream_options={"include_usage": True}),
                     chat(chat_template_kwargs={"thinking": True}),
                     chat(tools=[WEATHER], tool_choice="required"),
                     chat(n=2, max_tokens=3, logprobs=True, top_logprobs=1),
                     chat(stop=" the", max_tokens=30)):
            chunks = stream(c, "/v1/chat/completions", body)
            for chunk in chunks:
                check(engine, "ChatCompletionStreamResponse", chunk)
                assert all(other not in ch["delta"] for ch in chunk["choices"])

        for body in ({"model": "dsv41", "prompt": "one two three", "max_tokens": 6},
                     {"prompt": "one two", "max_tokens": 3, "logprobs": 2, "n": 2},
                     {"prompt": "one two", "max_tokens": 30, "stop": [" the"]}):
            doc = c.post("/v1/completions", json=body).json()
            check(engine, "CompletionResponse", doc)
            for chunk in stream(c, "/v1/completions", dict(body, stream_options={"include_usage": True})):
                check(engine, "CompletionStreamResponse", chunk)

        wrong_model = [chat(model="gpt-4")] if engine == "vllm" else []  # SGLang serves any name
        for bad in (chat(temperature=-1), chat(stop=["a", "b", "c", "d", "e"]), *wrong_model,
                    chat(top_p=0), chat(temperature="hot"), {"prompt": "x", "logprobs": 21}):
            path = "/v1/completions" if "prompt" in bad else "/v1/chat/completions"
            response = c.post(path, json=bad)
            assert response.status_code in (400, 404), response.text
            check(engine, "ErrorResponse", response.json())
        response = c.post("/v1/chat/completions", content=b"{not json")
        assert response.status_code == 400
        check(engine, "ErrorResponse", response.json())


def test_the_schemas_are_strict_enough_to_catch_a_wrong_field():
    """The check above would fail on the old answer: vLLM 0.33.0 has no reasoning_content in a message."""
    old = {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "usage": {"prompt_tokens": 1},
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "a", "reasoning_content": "r"},
                        "finish_reason": "stop"}]}
    with pytest.raises(jsonschema.ValidationError):
        check("vllm", "ChatCompletionResponse", old)
    old["choices"][0]["message"]["reasoning"] = old["choices"][0]["message"].pop("reasoning_content")
    check("vllm", "ChatCompletionResponse", old)
    with pytest.raises(jsonschema.ValidationError):
        check("sglang", "ChatCompletionResponse", old)


# ---------------------------------------------------------------------------------------------- behaviour


def test_tool_calls_in_each_engines_format(engines):
    with client(engines["vllm"]) as c:
        auto = c.post("/v1/chat/completions", json=chat(tools=[WEATHER, CLOCK], say="weather in Paris? get_weather please")).json()
        choice = auto["choices"][0]
        call = choice["message"]["tool_calls"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
        arguments = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "get_weather" and arguments["unit"] == "celsius" and arguments["days"] == 1
        no_tool = c.post("/v1/chat/completions", json=chat(tools=[WEATHER], say="Tell me a story.")).json()
        assert no_tool["choices"][0]["message"]["tool_calls"] == [] and no_tool["choices"][0]["finish_reason"] == "stop"
        named = c.post("/v1/chat/completions", json=chat(tools=[WEATHER, CLOCK],
                                                         tool_choice={"type": "function", "function": {"name": "get_time"}})).json()
        assert named["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}
        assert named["choices"][0]["finish_reason"] == "stop"
        chunks = stream(c, "/v1/chat/completions", chat(tools=[WEATHER], tool_choice="required"))
        deltas = [d for ch in chunks for d in ch["choices"][0]["delta"].get("tool_calls", [])]
        assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""} and deltas[0]["id"].startswith("chatcmpl-tool-")
        assert json.loads("".join(d["function"]["arguments"] for d in deltas))["city"] == "Paris"
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    with client(engines["sglang"]) as c:
        call = c.post("/v1/chat/completions", json=chat(tools=[WEATHER], tool_choice="required")).json()
        assert call["choices"][0]["message"]["tool_calls"][0]["id"].startswith("call_")
        assert call["choices"][0]["message"]["tool_calls"][0]["index"] == 0


def test_stop_sequences_cut_the_answer(engines):
    with client(engines["vllm"]) as c:
        free = c.post("/v1/chat/completions", json=chat()).json()["choices"][0]["message"]["content"]
        word = free.split()[4]
        cut = c.post("/v1/chat/completions", json=chat(stop=[" " + word, "never-there"])).json()["choices"][0]
        assert cut["message"]["content"] == free[:free.index(" " + word)]
        assert cut["finish_reason"] == "stop" and cut["stop_reason"] == " " + word
        kept = c.post("/v1/chat/completions", json=chat(stop=" " + word, include_stop_str_in_output=True)).json()
        assert kept["choices"][0]["message"]["content"] == free[:free.index(" " + word) + len(word) + 1]
        streamed = stream(c, "/v1/chat/completions", chat(stop=[" " + word]))
        assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in streamed) == cut["message"]["content"]
    with client(engines["sglang"]) as c:
        free = c.post("/v1/completions", json={"prompt": "p q r", "max_tokens": 8}).json()["choices"][0]["text"]
        word = free.split()[3]
        cut = c.post("/v1/completions", json={"prompt": "p q r", "max_tokens": 8, "stop": [" " + word]}).json()
        assert cut["choices"][0]["matched_stop"] == " " + word and cut["choices"][0]["text"] == free[:free.index(" " + word)]


def test_n_logprobs_and_json_output(engines):
    with client(engines["vllm"]) as c:
        doc = c.post("/v1/chat/completions", json=chat(n=3, max_tokens=4, logprobs=True, top_logprobs=3)).json()
        assert [ch["index"] for ch in doc["choices"]] == [0, 1, 2]
        assert len({ch["message"]["content"] for ch in doc["choices"]}) == 3
        assert doc["usage"]["completion_tokens"] == 12
        entries = doc["choices"][0]["logprobs"]["content"]
        assert len(entries) == 4 and all(len(e["top_logprobs"]) == 3 and e["logprob"] < 0 for e in entries)
        assert "".join(e["token"] for e in entries) == doc["choices"][0]["message"]["content"]
        assert c.post("/v1/chat/completions", json=chat(max_tokens=2)).json()["choices"][0]["logprobs"] is None
        answer = c.post("/v1/chat/completions", json=chat(response_format={"type": "json_schema", "json_schema": {
            "name": "w", "schema": WEATHER["function"]["parameters"]}})).json()["choices"][0]["message"]["content"]
        assert set(json.loads(answer)) == {"city", "unit", "days"}
        assert isinstance(json.loads(c.post("/v1/chat/completions", json=chat(response_format={"type": "json_object"})).json()
                                     ["choices"][0]["message"]["content"]), dict)


@pytest.mark.parametrize("body, message", [
    (chat(temperature=-1), "temperature must be non-negative, got -1.0."),
    (chat(top_p=0), "top_p must be in (0, 1], got 0.0."),
    (chat(n=0), "n must be at least 1, got 0."),
    (chat(max_tokens=0), "max_tokens must be at least 1, got 0."),
    (chat(presence_penalty=3), "presence_penalty must be in [-2, 2], got 3.0."),
    (chat(top_logprobs=2), "when using `top_logprobs`, `logprobs` must be set to true."),
    (chat(stream_options={"include_usage": True}), "Stream options can only be defined when `stream=True`."),
    (chat(tool_choice="required"), "When using `tool_choice`, `tools` must be set."),
    (chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "Tool 'nope' has not been passed in `tools`."),
    (chat(temperature="hot"), "temperature"),
    (chat(stop=["a", "b", "c", "d", "e"]), "at most 4 items"),
])
def test_bad_parameters_are_refused_like_vllm(engines, body, message):
    with client(engines["vllm"]) as c:
        response = c.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert message in error["message"] and error["code"] == 400
    with client(engines["sglang"]) as c:  # SGLang's shape: no "error" wrapper
        doc = c.post("/v1/chat/completions", json=body).json()
        assert doc["object"] == "error" and doc["code"] == 400 and message in doc["message"]


def test_auto_tool_choice_needs_the_servers_flags(model, tmp_path):
    port = free_port()
    proc = Proc([sys.executable, "-m", "sparkctl.standin", "vllm", "serve", model, "--host", "127.0.0.1",
                 "--port", str(port)], tmp_path / "noauto.log", env=FAST)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60, proc=proc)
        with client(f"http://127.0.0.1:{port}", key=None) as c:
            auto = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
                                                        "tool_choice": "auto"})
            assert auto.status_code == 400 and "--enable-auto-tool-choice" in auto.json()["error"]["message"]
            named = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
                                                         "tool_choice": "required"})
            assert named.status_code == 200 and named.json()["choices"][0]["message"]["tool_calls"]
            assert c.get("/v1/models").status_code == 200  # no key configured: nothing guarded
    finally:
        proc.stop()


def test_api_key_guards_what_each_engine_guards(engines):
    vllm = engines["vllm"]
    for path in ("/health", "/ping", "/version", "/metrics", "/load"):
        assert httpx.get(vllm + path).status_code == 200, path
    assert httpx.post(vllm + "/tokenize", json={"prompt": "a b"}).status_code == 200  # not under /v1
    refused = httpx.get(vllm + "/v1/models")
    assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
    assert httpx.get(vllm + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(vllm + "/v1/models", headers={"Authorization": KEY}).status_code == 401
    assert httpx.get(vllm + "/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    assert httpx.post(vllm + "/v1/chat/completions", json=chat()).status_code == 401
    sglang = engines["sglang"]
    assert httpx.get(sglang + "/health").status_code == 200 and httpx.get(sglang + "/metrics").status_code == 200
    for path in ("/v1/models", "/get_model_info", "/version"):
        assert httpx.get(sglang + path).status_code == 401, path
    assert httpx.get(sglang + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_auth_rules_as_units():
    assert auth.allowed("vllm", [], "GET", "/v1/models", None)
    assert not auth.allowed("vllm", ["k"], "GET", "/v1/models", None)
    assert auth.allowed("vllm", ["k"], "OPTIONS", "/v1/models", None)
    assert auth.allowed("vllm", ["a", "k"], "GET", "/v1/models", "Bearer k")
    assert auth.allowed("vllm", ["k"], "GET", "/metrics", None)
    assert not auth.allowed("sglang", ["k"], "GET", "/version", "bearer k")  # SGLang compares the exact text
    assert auth.allowed("sglang", ["k"], "GET", "/health_generate", None)
    assert auth.server_keys("vllm", None, {"VLLM_API_KEY": "e"}) == ["e"]
    assert auth.server_keys("vllm", "flag", {"VLLM_API_KEY": "e"}) == ["flag"]
    assert auth.server_keys("sglang", None, {"VLLM_API_KEY": "e"}) == []


def test_routes_and_tokenizer(engines):
    vllm = engines["vllm"]
    assert httpx.get(vllm + "/version").json() == {"version": "0.33.0"}
    assert httpx.post(vllm + "/ping").status_code == 200
    tokens = httpx.post(vllm + "/tokenize", json={"prompt": "the brave new sparks"}).json()
    assert tokens["count"] == 4 and tokens["max_model_len"] == 4096
    assert httpx.post(vllm + "/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "the brave new sparks"}
    assert httpx.post(vllm + "/detokenize", json={"tokens": "x"}).status_code == 400
    assert httpx.get(vllm + "/tokenize").status_code == 405
    with client(engines["sglang"]) as c:
        assert c.post("/v1/tokenize", json={"prompt": "a b c"}).json()["count"] == 3
        assert c.get("/get_model_info").json()["is_generation"] is True


def test_keep_alive_survives_every_error(engines):
    """Each answer on one connection: a 404/405/401/400 must not leave its body unread for the next."""
    host, port = engines["vllm"].replace("http://", "").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    auth_header = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = json.dumps(chat(max_tokens=2))
    steps = [("POST", "/nope", body, {}, 404), ("PUT", "/v1/models", body, auth_header, 405),
             ("GET", "/v1/chat/completions", body, auth_header, 405), ("POST", "/v1/models", body, auth_header, 405),
             ("POST", "/v1/chat/completions", body, {}, 401), ("POST", "/v1/chat/completions", "{bad", auth_header, 400),
             ("POST", "/v1/chat/completions", json.dumps(chat(temperature=-1)), auth_header, 400),
             ("POST", "/v1/chat/completions", body, auth_header, 200), ("GET", "/health", None, {}, 200)]
    for method, path, payload, headers, status in steps:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        response.read()
        assert response.status == status, (method, path, response.status)
    sock = conn.sock
    conn.request("GET", "/ping")
    conn.getresponse().read()
    assert conn.sock is sock  # still the same connection
    conn.close()


# ---------------------------------------------------------------------------------------------- metrics


def _samples(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            out[name_labels] = float(value)
    return out


def _value(samples: dict, name: str) -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == name)


def _families(text: str) -> set:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_metrics_use_the_real_names_and_move(engines, engine):
    url = engines[engine]
    names = set((DATA / f"{VERSIONS[engine]}-metrics.txt").read_text().split())
    before = httpx.get(url + "/metrics").text
    # prometheus_client's TYPE line names a counter without _total; the name lists have it either way
    unknown = {f for f in _families(before) if f not in names and f + "_total" not in names} - set(VLLM_SPEC_DECODE_COUNTERS)
    assert not unknown, f"names {engine} does not export: {unknown}"
    prefix = "vllm:" if engine == "vllm" else "sglang:"
    prompt, generation = prefix + "prompt_tokens_total", prefix + "generation_tokens_total"
    running = "vllm:num_requests_running" if engine == "vllm" else "sglang:num_running_reqs"
    usage = "vllm:kv_cache_usage_perc" if engine == "vllm" else "sglang:token_usage"
    b = _samples(before)
    long_prompt = " ".join(f"w{i}" for i in range(200))
    with client(url) as c:
        body = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 400,  # >= 1.2 s of stream
                "stream": True, "ignore_eos": True}
        with c.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            next(lines)
            during = _samples(httpx.get(url + "/metrics").text)
            for _ in lines:
                pass
        c.post("/v1/chat/completions", json=dict(body, stream=False, max_tokens=5))  # same prompt: prefix cache hit
    after = _samples(httpx.get(url + "/metrics").text)
    assert _value(during, running) >= 1 and _value(during, usage) > 0
    assert _value(after, running) == 0 and _value(after, usage) == _value(b, usage)
    assert _value(after, prompt) - _value(b, prompt) >= 2 * 200
    assert _value(after, generation) - _value(b, generation) == 405
    if engine == "vllm":
        assert _value(after, "vllm:prefix_cache_hits_total") - _value(b, "vllm:prefix_cache_hits_total") >= 192
        assert _value(after, "vllm:request_success_total") - _value(b, "vllm:request_success_total") == 2
        assert _value(after, "vllm:time_to_first_token_seconds_count") - _value(b, "vllm:time_to_first_token_seconds_count") == 2
        drafts = _value(after, "vllm:spec_decode_num_drafts_total")
        accepted = _value(after, "vllm:spec_decode_num_accepted_tokens_total")
        per_pos = [v for k, v in after.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")]
        assert drafts > 0 and 1.5 < 1 + accepted / drafts < 5 and sum(per_pos) == accepted and len(per_pos) == 5
        # each sequence: 1 token from the prefill, then 1 + accepted per verify step
        delta = lambda name: _value(after, name) - _value(b, name)  # noqa: E731
        assert delta(generation) == 2 + delta("vllm:spec_decode_num_drafts_total") + \
            delta("vllm:spec_decode_num_accepted_tokens_total")
    else:
        assert _value(after, "sglang:cached_tokens_total") - _value(b, "sglang:cached_tokens_total") >= 192
        assert 1.5 < _value(after, "sglang:spec_accept_length") < 6
    # what `top` and `bench` compute from two scrapes, by the real names
    from sparkctl.commands.engine_metrics import parse_exposition, spec_accept_length

    length = spec_accept_length(engine, parse_exposition(before), parse_exposition(httpx.get(url + "/metrics").text))
    assert length is not None and 1.5 < length < 6


# ---------------------------------------------------------------------------------------------- openai SDK


def test_the_openai_sdk_gets_tool_calls_and_the_reasoning_field(engines):
    import openai

    sdk = openai.OpenAI(base_url=engines["vllm"] + "/v1", api_key=KEY, max_retries=0, timeout=60)
    answer = sdk.chat.completions.create(model="dsv41", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                         tools=[WEATHER], tool_choice="auto",
                                         extra_body={"chat_template_kwargs": {"thinking": True}})
    message = answer.choices[0].message
    assert message.tool_calls[0].function.name == "get_weather"
    assert json.loads(message.tool_calls[0].function.arguments)["city"] == "Paris"
    assert answer.choices[0].finish_reason == "tool_calls"
    assert getattr(message, "reasoning", None)  # vLLM 0.33.0's field, kept by the SDK as an extra
    streamed = sdk.chat.completions.create(model="dsv41", messages=[{"role": "user", "content": "hi"}],
                                           tools=[WEATHER], tool_choice="required", stream=True,
                                           stream_options={"include_usage": True})
    names, arguments, usage = [], "", None
    for chunk in streamed:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                names += [call.function.name] if call.function.name else []
                arguments += call.function.arguments or ""
    assert names == ["get_weather"] and json.loads(arguments)["unit"] == "celsius" and usage.completion_tokens > 0
    thinking = sdk.chat.completions.create(model="dsv41", messages=[{"role": "user", "content": "hi"}],
                                           extra_body={"chat_template_kwargs": {"thinking": True}})
    assert thinking.choices[0].message.reasoning and thinking.choices[0].message.content
    text = sdk.completions.create(model="dsv41", prompt="one two", max_tokens=3)
    assert len(text.choices[0].text.split()) == 3
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="dsv41", messages=[{"role": "user", "content": "hi"}], temperature=-1)
    assert "temperature must be non-negative" in str(refused.value)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=engines["vllm"] + "/v1", api_key="wrong", max_retries=0).models.list()
    sgl = openai.OpenAI(base_url=engines["sglang"] + "/v1", api_key=KEY, max_retries=0, timeout=60)
    sg = sgl.chat.completions.create(model="dsv41", messages=[{"role": "user", "content": "hi"}],
                                     extra_body={"chat_template_kwargs": {"thinking": True}})
    assert getattr(sg.choices[0].message, "reasoning_content", None)


def test_sample_values_fit_their_schema():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}, "minItems": 2},
                                               "b": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
                                               "c": {"const": 7}, "d": {"type": ["null", "integer"], "minimum": 3}}}
    value = tools.sample_value(schema, 0)
    jsonschema.validate(value, schema)
    assert value == {"a": [1.5, 1.5], "b": None, "c": 7, "d": 3}


def test_head_is_answered_as_the_engines_openapi_says(engines):
    """vLLM 0.33.0 and SGLang 0.5.23 declare /health (and every route) for GET only: HEAD is 405,
    as their servers answer an undeclared method (their OpenAPI documents, when on this machine)."""
    for engine, version in (("vllm", "0.33.0"), ("sglang", "0.5.23")):
        openapi = Path(f"/work/shared/engines/{engine}-{version}-openapi.json")
        if openapi.exists():
            assert list(json.loads(openapi.read_text())["paths"]["/health"]) == ["get"]
        answer = httpx.head(engines[engine] + "/health")
        assert answer.status_code == 405, (engine, answer.status_code)
        assert answer.headers["allow"] == "GET"
        assert httpx.get(engines[engine] + "/health").status_code == 200


def test_health_has_no_body_and_the_state_is_the_standins_own_route(engines):
    """vLLM 0.33.0 and SGLang 0.5.23 answer GET /health with a bare ``Response(status_code=200)``:
    no body, no Content-Type. What the tests read of the stand-in's inside is on its own path,
    open even to a client without the key (both engines here have one)."""
    from sparkctl.standin.server import STATE_PATH

    for engine in ("vllm", "sglang"):
        health = httpx.get(engines[engine] + "/health")
        assert (health.status_code, health.content) == (200, b""), engine
        assert "content-type" not in health.headers, (engine, dict(health.headers))
        state = httpx.get(engines[engine] + STATE_PATH)
        assert state.status_code == 200, (engine, state.text)
        doc = state.json()
        assert set(doc) == {"engine_config", "running", "waiting", "uptime_s"}
        assert doc["engine_config"]["engine"] == engine and doc["engine_config"]["max_model_len"] == 4096
        assert doc["engine_config"]["api_key_required"] is True
        assert httpx.post(engines[engine] + STATE_PATH).status_code in (401, 404)  # GET only: POST is no route
