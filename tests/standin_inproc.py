"""Shared code for the quick stand-in API tests (no tests here): a stand-in engine's HTTP server in this
process (a thread on 127.0.0.1, an ephemeral port, fast timing), and the engines' response schemas
made strict, so that a field the engine does not declare fails the check."""

from __future__ import annotations

import functools
import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import jsonschema

from sparkctl.standin.model import ModelInfo
from sparkctl.standin.server import EngineState, make_server
from sparkctl.standin.settings import EngineSettings
from sparkctl.standin.simulate import Timing

DATA = Path(__file__).parent / "data" / "engine_api"
VERSIONS = {"vllm": "vllm-0.33.0", "sglang": "sglang-0.5.23"}
PARSERS = {"vllm": ("deepseek_v41", "deepseek_v41"), "sglang": ("deepseek-v41", "deepseekv41")}
VOCAB_SIZE = 129280  # DeepSeek's


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


@functools.lru_cache(maxsize=None)
def _validator(engine: str, kind: str):
    """Built once per schema: checking a schema against its meta-schema costs ~0.1 s of CPU."""
    schemas = json.loads((DATA / f"{VERSIONS[engine]}-response-schemas.json").read_text())
    schema = _strict(schemas[kind])
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check(engine: str, kind: str, doc) -> None:
    """``jsonschema.validate(doc, schema)``: the same errors, the best match raised."""
    error = jsonschema.exceptions.best_match(_validator(engine, kind).iter_errors(doc))
    if error is not None:
        raise error


def settings(engine: str, **overrides) -> EngineSettings:
    reasoning, tools = PARSERS[engine]
    values = dict(engine=engine, engine_version=VERSIONS[engine].split("-")[1], model_path="/models/dsv41",
                  served_model_name="dsv41", host="127.0.0.1", port=0, tp=1, nnodes=1, node_rank=0,
                  master_addr="127.0.0.1", master_port=0, headless=False, max_model_len=4096, max_num_seqs=16,
                  reasoning_parser=reasoning, tool_call_parser=tools, default_chat_template_kwargs={},
                  engram_disk=False,
                  timing=Timing(ttft_base_ms=0.5, ttft_per_token_ms=0.0, itl_ms=0.2, answer_tokens=12,
                                reasoning_tokens=4))
    values.update(overrides)
    return EngineSettings(**values)


@contextmanager
def served(engine: str, *, api_keys=(), vocab_size: int = VOCAB_SIZE, **overrides) -> Iterator[httpx.Client]:
    """An httpx client on a stand-in engine served from a thread of this process."""
    s = settings(engine, **overrides)
    info = ModelInfo(path=s.model_path, architectures=["DeepseekV41ForCausalLM"], model_type="deepseek_v41",
                     max_position_embeddings=s.max_model_len, vocab_size=vocab_size)
    state = EngineState(s, info, s.max_model_len, ranks_connected=lambda: 1, log=lambda level, message: None,
                        api_keys=api_keys, auto_tool_choice=True)
    server = make_server(state, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}", timeout=30) as client:
            yield client
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def sse(response: httpx.Response) -> list:
    """The ``data:`` payloads of a stream, parsed; the last one must be [DONE] (left out)."""
    events = []
    for block in response.read().decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    assert events[-1] == "[DONE]"
    return events[:-1]


def stream(client: httpx.Client, path: str, body: dict) -> list:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        return sse(response)
