"""``sparkctl smoke``: what an application needs from the endpoint, each a named check with its time.

Checks (``quick``: the first three, what ``serve`` runs before it calls the endpoint healthy):

* ``models``: ``GET /v1/models`` lists the served model;
* ``chat``: a plain chat completion has text, a finish reason and usage;
* ``chat_stream``: the same streamed with ``stream_options.include_usage``: chunks, a usage chunk,
  ``data: [DONE]``;
* ``tool_call`` / ``tool_call_stream``: with a ``get_weather`` tool and ``tool_choice: auto`` the
  answer is parsed into ``tool_calls`` (the server's ``--tool-call-parser`` and
  ``--enable-auto-tool-choice`` at work), streamed as deltas that add up to JSON arguments;
* ``thinking_on`` / ``thinking_off``: ``chat_template_kwargs.thinking`` switches the reasoning on
  and off, and it arrives in the engine's field (vLLM 0.33.0: ``reasoning``; SGLang:
  ``reasoning_content``; the other field means a server of another version or a wrong parser);
* ``completions``: ``/v1/completions`` answers text;
* ``bad_request``: ``temperature: -1`` is refused with 400 in the engine's error shape;
* ``auth`` (with an API key): ``/v1/models`` without the key is refused with 401.

For the single-box engine (``engine="single-box"``) the thinking checks are its own contract:
``thinking_default_off`` (no switch, no reasoning) and one check per switch that turns it on —
``thinking_kwargs`` (``chat_template_kwargs.thinking``), ``thinking_enable`` (``enable_thinking``),
``thinking_effort`` (``reasoning_effort: high``) — each answering in ``reasoning_content``.

A check never raises: every failure is its ``detail``. Each request is bounded by ``timeout_s``; the
checks run at the same time (independent requests), so a smoke takes about as long as its slowest.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from sparkctl import engines
from sparkctl.config.apikey import auth_headers
from sparkctl.httpclient import client as http_client, httpx, tls_context
from sparkctl.ops.sse import DONE, data_payloads
from sparkctl.ops.steps import OK, StepFailed  # the report as a step's end (outcome)

# The single-box engine's README ("Open WebUI"): thinking is off by default and any of three switches
# turns it on for one request (first match wins); each is checked on its own (engines/singlebox.py).
THINKING_SWITCHES = {
    "thinking_kwargs": {"chat_template_kwargs": {"thinking": True}},
    "thinking_enable": {"enable_thinking": True},
    "thinking_effort": {"reasoning_effort": "high"},
}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
TOOL_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
QUICK = ("models", "chat", "chat_stream")


class SmokeFailure(Exception):
    pass


@dataclass
class Check:
    name: str
    ok: bool
    seconds: float
    detail: str

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "seconds": round(self.seconds, 3), "detail": self.detail}


@dataclass
class SmokeReport:
    endpoint: str
    checks: List[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> List[Check]:
        return [c for c in self.checks if not c.ok]

    def outcome(self, model: str) -> tuple[str, str]:
        """As a step's end (``up``'s smoke of ``model``): ok, or StepFailed naming each failed check."""
        if not self.ok:
            raise StepFailed(f"{self.endpoint}: smoke failed: " + "; ".join(f"{c.name}: {c.detail}" for c in self.failed))
        return OK, f"{self.endpoint} serves {model}: {len(self.checks)} smoke checks passed"

    def to_json(self) -> dict:
        return {"ok": self.ok, "endpoint": self.endpoint, "checks": [c.to_json() for c in self.checks]}

    def human(self) -> str:
        width = max((len(c.name) for c in self.checks), default=0)
        lines = [f"{'PASS' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.seconds:7.2f} s  {c.detail}" for c in self.checks]
        if self.ok:
            lines.append(f"smoke: {len(self.checks)} checks passed against {self.endpoint}")
        else:
            lines.append("smoke: FAILED: " + ", ".join(c.name for c in self.failed))
        return "\n".join(lines)


class _Smoke:
    """The checks, sharing one HTTP client (the key in its headers) and what the endpoint is."""

    def __init__(self, client, model: str, engine: str, api_key: Optional[str], endpoint: str, timeout_s: float):
        self.client, self.model, self.engine, self.api_key = client, model, engine, api_key
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self.plugin = engines.get(engine)
        self.reasoning = self.plugin.reasoning_field
        self.other_reasoning = "reasoning_content" if self.reasoning == "reasoning" else "reasoning"

    # -- helpers ----------------------------------------------------------------------------------

    def post(self, path: str, body: dict) -> dict:
        response = self.client.post(path, json=body)
        if response.status_code != 200:
            raise SmokeFailure(f"POST {path} answered {response.status_code}: {_error_text(response)}")
        try:
            return response.json()
        except ValueError:
            raise SmokeFailure(f"POST {path} did not answer JSON") from None

    def stream(self, path: str, body: dict) -> list:
        """Every chunk of a streamed answer; fails without the final ``data: [DONE]``."""
        chunks, done = [], False
        with self.client.stream("POST", path, json={**body, "stream": True}) as response:
            if response.status_code != 200:
                response.read()
                raise SmokeFailure(f"POST {path} (stream) answered {response.status_code}: {_error_text(response)}")
            for payload in data_payloads(response.iter_lines()):
                if payload == DONE:
                    done = True
                    break
                try:
                    chunks.append(json.loads(payload))
                except ValueError:
                    raise SmokeFailure(f"a stream event is not JSON: {payload[:80]!r}") from None
        if not done:
            raise SmokeFailure("the stream ended without data: [DONE]")
        return chunks

    def chat_body(self, content: str, **extra) -> dict:
        return {"model": self.model, "messages": [{"role": "user", "content": content}], **extra}

    @staticmethod
    def first_choice(doc: dict) -> dict:
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise SmokeFailure("no choices in the answer")
        return choices[0]

    # -- checks -----------------------------------------------------------------------------------

    def check_models(self) -> str:
        response = self.client.get("/v1/models")
        if response.status_code != 200:
            raise SmokeFailure(f"GET /v1/models answered {response.status_code}: {_error_text(response)}")
        ids = [m.get("id") for m in response.json().get("data") or [] if isinstance(m, dict)]
        if self.model not in ids:
            raise SmokeFailure(f"/v1/models lists {ids or 'nothing'}, not {self.model!r}")
        return f"lists {self.model}"

    def check_chat(self) -> str:
        doc = self.post("/v1/chat/completions", self.chat_body("Say hello in five words.", max_tokens=32,
                                                               chat_template_kwargs={"thinking": False}))
        choice = self.first_choice(doc)
        content = (choice.get("message") or {}).get("content")
        if not isinstance(content, str) or not content.strip():
            raise SmokeFailure(f"no text in message.content (finish_reason {choice.get('finish_reason')!r})")
        tokens = (doc.get("usage") or {}).get("completion_tokens")
        if not isinstance(tokens, int) or tokens < 1:
            raise SmokeFailure("no usage.completion_tokens")
        return f"{tokens} tokens, finish_reason {choice.get('finish_reason')}"

    def check_chat_stream(self) -> str:
        chunks = self.stream("/v1/chat/completions", self.chat_body(
            "Count from 1 to 5.", max_tokens=32, stream_options={"include_usage": True},
            chat_template_kwargs={"thinking": False}))
        text = "".join(((c.get("delta") or {}).get("content") or "") for chunk in chunks for c in chunk.get("choices") or [])
        usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
        if not text.strip():
            raise SmokeFailure(f"{len(chunks)} chunks but no content")
        if not usage or not usage[-1].get("completion_tokens"):
            raise SmokeFailure("no usage chunk although stream_options.include_usage was sent")
        return f"{len(chunks)} chunks, usage {usage[-1]['completion_tokens']} tokens"

    def _tool_body(self) -> dict:
        return self.chat_body(TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=256)

    @staticmethod
    def _check_call(name, arguments: str, finish) -> str:
        if name != "get_weather":
            raise SmokeFailure(f"tool_calls names {name!r}, not 'get_weather'")
        try:
            parsed = json.loads(arguments or "")
        except ValueError:
            raise SmokeFailure(f"tool call arguments are not JSON: {arguments[:80]!r}") from None
        if not isinstance(parsed, dict) or "city" not in parsed:
            raise SmokeFailure(f"tool call arguments lack 'city': {arguments[:80]}")
        return f"get_weather({arguments}), finish_reason {finish}"

    def check_tool_call(self) -> str:
        choice = self.first_choice(self.post("/v1/chat/completions", self._tool_body()))
        calls = (choice.get("message") or {}).get("tool_calls") or []
        if not calls:
            raise SmokeFailure("no tool_calls in the message (is --tool-call-parser with --enable-auto-tool-choice "
                               f"set?); content: {str((choice.get('message') or {}).get('content'))[:80]!r}")
        function = calls[0].get("function") or {}
        return self._check_call(function.get("name"), function.get("arguments"), choice.get("finish_reason"))

    def check_tool_call_stream(self) -> str:
        chunks = self.stream("/v1/chat/completions", self._tool_body())
        names, arguments, finish = [], "", None
        for chunk in chunks:
            for choice in chunk.get("choices") or []:
                finish = choice.get("finish_reason") or finish
                for call in (choice.get("delta") or {}).get("tool_calls") or []:
                    function = call.get("function") or {}
                    if call.get("index", 0) != 0:
                        continue
                    if function.get("name"):
                        names.append(function["name"])
                    arguments += function.get("arguments") or ""
        if not names:
            raise SmokeFailure("no tool_calls deltas in the stream")
        return self._check_call(names[0], arguments, finish)

    def _thinking(self, on: bool) -> dict:
        doc = self.post("/v1/chat/completions", self.chat_body(
            "What is 17 times 3?", max_tokens=512 if on else 64, chat_template_kwargs={"thinking": on}))
        return (self.first_choice(doc).get("message") or {})

    def check_thinking_on(self) -> str:
        message = self._thinking(True)
        reasoning = message.get(self.reasoning)
        if not (isinstance(reasoning, str) and reasoning.strip()):
            if message.get(self.other_reasoning):
                raise SmokeFailure(f"the reasoning arrived in {self.other_reasoning!r}; {self.engine} sends "
                                   f"{self.reasoning!r} (another engine version?)")
            raise SmokeFailure(f"no reasoning in message.{self.reasoning} (is --reasoning-parser set?)")
        return f"{len(reasoning.split())} words of reasoning in {self.reasoning}"

    def check_thinking_off(self) -> str:
        message = self._thinking(False)
        if message.get(self.reasoning) or message.get(self.other_reasoning):
            raise SmokeFailure("reasoning arrived although chat_template_kwargs.thinking was false")
        if not str(message.get("content") or "").strip():
            raise SmokeFailure("no content")
        return "answer without reasoning"

    def _switched(self, switch: dict) -> str:
        doc = self.post("/v1/chat/completions", self.chat_body("What is 17 times 3?", max_tokens=512, **switch))
        message = self.first_choice(doc).get("message") or {}
        reasoning = message.get(self.reasoning)
        if not (isinstance(reasoning, str) and reasoning.strip()):
            raise SmokeFailure(f"{json.dumps(switch)} did not turn thinking on: no reasoning in message.{self.reasoning}")
        if "</think>" in reasoning or "</think>" in str(message.get("content") or ""):
            raise SmokeFailure("the </think> marker leaked into the answer")
        return f"{json.dumps(switch)}: {len(reasoning.split())} words of reasoning"

    def check_thinking_kwargs(self) -> str:
        return self._switched(THINKING_SWITCHES["thinking_kwargs"])

    def check_thinking_enable(self) -> str:
        return self._switched(THINKING_SWITCHES["thinking_enable"])

    def check_thinking_effort(self) -> str:
        return self._switched(THINKING_SWITCHES["thinking_effort"])

    def check_thinking_default_off(self) -> str:
        doc = self.post("/v1/chat/completions", self.chat_body("What is 17 times 3?", max_tokens=64))
        message = self.first_choice(doc).get("message") or {}
        if message.get(self.reasoning) or message.get(self.other_reasoning):
            raise SmokeFailure("reasoning arrived without any switch (DEFAULT_THINKING=on?)")
        return "no switch, no reasoning"

    def check_completions(self) -> str:
        doc = self.post("/v1/completions", {"model": self.model, "prompt": "The capital of France is", "max_tokens": 16})
        text = self.first_choice(doc).get("text")
        if not isinstance(text, str) or not text.strip():
            raise SmokeFailure("no text in choices[0].text")
        return f"{(doc.get('usage') or {}).get('completion_tokens', '?')} tokens"

    def check_bad_request(self) -> str:
        response = self.client.post("/v1/chat/completions", json=self.chat_body("hi", temperature=-1, max_tokens=4))
        if response.status_code != 400:
            raise SmokeFailure(f"temperature -1 answered {response.status_code}, not 400")
        try:
            doc = response.json()
        except ValueError:
            raise SmokeFailure("the 400 answer is not JSON") from None
        if getattr(self, "behind_router", False) and isinstance(doc.get("error"), dict):
            # sglang_router validates a request itself and answers in OpenAI's shape, whatever the engine
            error = doc["error"]
            if not error.get("message") or error.get("code") != 400 or not error.get("type"):
                raise SmokeFailure(f"the 400 answer is not the router's error shape: {json.dumps(doc)[:120]}")
            return f"400 {error['type']} (the router): {error['message'][:60]}"
        error = self.plugin.error_in(doc)
        if isinstance(error, str):
            raise SmokeFailure(f"the 400 answer {error}: {json.dumps(doc)[:120]}")
        if not isinstance(error, dict) or not error.get("message") or error.get("code") != 400 or not error.get("type"):
            raise SmokeFailure(f"the 400 answer is not {self.engine}'s error shape: {json.dumps(doc)[:120]}")
        return f"400 {error['type']}: {error['message'][:60]}"

    def check_auth(self) -> str:
        response = httpx.get(self.endpoint + "/v1/models", timeout=self.timeout_s, verify=tls_context())
        if response.status_code != 401:
            raise SmokeFailure(f"/v1/models without the API key answered {response.status_code}, not 401")
        return "/v1/models without the key: 401"


def _error_text(response) -> str:
    if response.status_code == 401:
        return "Unauthorized (the endpoint wants an API key: serving.api_key_env, or a refused key)"
    try:
        doc = response.json()
        error = doc.get("error", doc) if isinstance(doc, dict) else doc
        message = error.get("message") if isinstance(error, dict) else error
        return " ".join(str(message or doc).split())[:160]
    except ValueError:
        return " ".join(response.text.split())[:160]


def check_names(quick: bool, api_key: Optional[str], engine: str = "vllm") -> List[str]:
    if quick:
        return list(QUICK)
    return [*QUICK, *engines.get(engine).smoke_checks] + (["auth"] if api_key else [])


def run_smoke(endpoint: str, *, model: str, api_key: Optional[str] = None, engine: str = "vllm", quick: bool = False,
              timeout_s: float = 60.0, on_check: Optional[Callable[[Check], None]] = None, full: bool = False,
              context: Optional[int] = None, behind_router: bool = False) -> SmokeReport:
    """Run every check (at once: they are independent requests, so a smoke costs about its slowest
    check) and report them in their documented order; one failing never stops the others. ``full``
    adds the sources' validation (``smoke_full``) after them, one check at a time (they load the
    engine); ``context`` (the served context) decides whether the 1M retrieval runs. ``behind_router``:
    the endpoint is the replicas' router, which refuses an invalid request itself, in its own shape."""
    from sparkctl.ops import smoke_full  # here, not at the top: smoke_full builds on this module's checks

    endpoint = endpoint.rstrip("/")
    names = check_names(quick, api_key, engine)
    extra = smoke_full.full_names(context) if full else []
    connections = max(len(names), smoke_full.WAVE if full else 0)
    with http_client(base_url=endpoint, timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
                      headers=auth_headers(api_key),
                      limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections)) as client:
        smoke = type("FullSmoke", (smoke_full.FullChecks, _Smoke), {})(client, model, engine, api_key, endpoint, timeout_s)
        smoke.behind_router = behind_router

        def run(name: str) -> Check:
            started = time.monotonic()
            try:
                detail, ok = getattr(smoke, "check_" + name)(), True
            except SmokeFailure as err:
                detail, ok = str(err), False
            except httpx.TimeoutException:
                detail, ok = f"no answer within {timeout_s:g} s", False
            except httpx.HTTPError as err:
                detail, ok = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}", False
            except (ValueError, KeyError, TypeError, AttributeError) as err:  # an answer of the wrong shape
                detail, ok = f"unexpected answer: {type(err).__name__}: {err}", False
            check = Check(name, ok, time.monotonic() - started, detail)
            if on_check is not None:
                on_check(check)
            return check

        with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="smoke") as pool:
            checks = list(pool.map(run, names))
        checks += [run(name) for name in extra]
    return SmokeReport(endpoint, checks)
