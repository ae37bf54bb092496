"""The head rank's HTTP server (ThreadingHTTPServer, HTTP/1.1 keep-alive, chunked SSE): routing only.

Routes, as the engine stood in for serves them (its OpenAPI, ``routes.py``): ``/health`` (200 with
no body and no Content-Type, as both engines' ``Response(status_code=200)``), ``/ping``, ``/metrics`` (``metrics.py``),
``/v1/models``, ``POST /v1/chat/completions`` and ``/v1/completions`` (plain or ``stream: true``:
``data: {chunk}`` events ending ``data: [DONE]``), ``/v1/responses`` (``responses_api.py``) and
``/v1/messages`` (``messages_api.py``); vLLM's ``/version``, ``/load``, ``/tokenize``,
``/detokenize``; SGLang's ``/v1/tokenize``, ``/v1/detokenize``, ``/v1/models/{model}``,
``/model_info``, ``/server_info`` and their deprecated ``/get_`` names, which the SGLang router
asks each worker. A route the engine declares but the stand-in does not serve is 501 in the
engine's error shape; an undeclared method 405; any other path 404.

Every request's body is read before it is answered, 401/404/405 included, so a client's next
request on the same keep-alive connection is never read from the middle of the previous body.
Requests are checked in ``sampling.py`` and ``prompts.py`` (400 in the engine's error shape), the
API key as the engine's middleware does (``auth.py``); answers are built in ``openai_api.py``.

One route is the stand-in's own, under a path no real engine has: ``GET /_standin/state`` (JSON:
``engine_config`` -- tp, nnodes, ranks connected, max_model_len, parsers, Engram, timing -- and the
scheduler's ``running``, ``waiting``, ``uptime_s``), open with or without an API key. It is for the
tests that look inside the stand-in; sparkctl itself never asks it, since a real engine would answer 404.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional, Sequence

from . import auth, routes
from . import messages_api as M
from . import responses_api as R
from . import openai_api as A
from .metrics import Metrics
from .sampling import ApiRequest, parse_api_request
from .simulate import _TOKEN, ApiError, Scheduler
from .vocab import MAX_IDS, Vocab

MAX_BODY_BYTES = 64 * 1024 * 1024
STATE_PATH = "/_standin/state"  # the stand-in's own route (tests only): no real engine has it


class EngineState:
    """What the HTTP handlers share: settings, the scheduler, the metrics, the API keys."""

    def __init__(self, settings, model_info, max_model_len: int, ranks_connected: Callable[[], int], log,
                 api_keys: Sequence[str] = (), auto_tool_choice: bool = False, spec_tokens: int = 0):
        self.settings = settings
        self.model_info = model_info
        self.max_model_len = max_model_len
        self.ranks_connected = ranks_connected
        self.log = log
        self.api_keys = list(api_keys)
        self.auto_tool_choice = auto_tool_choice
        self.scheduler = Scheduler(settings.timing, settings.max_num_seqs)
        self.metrics = Metrics(settings.engine, settings.served_model_name, max_model_len, settings.max_num_seqs,
                               spec_tokens)
        self.vocab = Vocab(getattr(model_info, "vocab_size", None) or MAX_IDS)
        self.started = time.time()
        self.row_store = None  # the SGLang line's Engram rows on NVMe (engram_nvme.RowStore), when served from them

    @property
    def engine(self) -> str:
        return self.settings.engine

    def engine_config(self) -> dict:
        s = self.settings
        return {
            "engine": s.engine,
            "engine_version": s.engine_version,
            "served_model_name": s.served_model_name,
            "model_path": s.model_path,
            "architectures": self.model_info.architectures,
            "tp": s.tp,
            "nnodes": s.nnodes,
            "ranks_connected": self.ranks_connected(),
            "max_model_len": self.max_model_len,
            "max_num_seqs": s.max_num_seqs,
            "reasoning_parser": s.reasoning_parser,
            "tool_call_parser": s.tool_call_parser,
            "auto_tool_choice": self.auto_tool_choice,
            "api_key_required": bool(self.api_keys),
            "speculative_tokens": self.metrics.spec_tokens,
            "thinking_default": bool(s.default_chat_template_kwargs.get("thinking", False)),
            "engram": self.row_store.describe() if self.row_store is not None else
                      {"disk": s.engram_disk, "layers": self.model_info.engram_layers,
                       "dir": s.knobs.engram_dir if s.engram_disk else None},
            "timing": {
                "ttft_base_ms": s.timing.ttft_base_ms, "ttft_per_token_ms": s.timing.ttft_per_token_ms,
                "ttft_concurrency": s.timing.ttft_concurrency, "itl_ms": s.timing.itl_ms,
                "itl_concurrency": s.timing.itl_concurrency,
            },
        }

    def model_info_doc(self) -> dict:
        """SGLang's ``/model_info``: the model the server runs."""
        return {"model_path": self.settings.model_path, "tokenizer_path": self.settings.model_path,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": "deepseek_v41", "architectures": self.model_info.architectures}

    def server_info_doc(self) -> dict:
        """SGLang's ``/server_info``: its server arguments by their names (the router reads
        ``served_model_name``, ``model_path``, ``tp_size``, ``dp_size``), then the stand-in's own."""
        s = self.settings
        return {**self.engine_config(), "served_model_name": s.served_model_name, "model_path": s.model_path,
                "tp_size": s.tp, "dp_size": 1, "nnodes": s.nnodes, "max_running_requests": s.max_num_seqs,
                "version": s.engine_version}

    def model_card(self) -> dict:
        root = self.settings.served_model_name if self.engine == "sglang" else self.settings.model_path  # as each names it
        card = {"id": self.settings.served_model_name, "object": "model", "created": int(self.started),
                "owned_by": self.engine, "root": root, "parent": None,
                "max_model_len": self.max_model_len}
        if self.engine == "vllm":
            card["permission"] = [{"id": "modelperm-" + uuid.uuid4().hex, "object": "model_permission",
                                   "created": int(self.started), "allow_create_engine": False,
                                   "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                                   "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                                   "group": None, "is_blocking": False}]
        return card


@dataclass
class _Tally:
    """One request's progress, from which its metrics are observed when it ends (finished or not)."""

    begun: float
    admitted: float = 0.0
    held: int = 0  # KV cache tokens it holds
    sent: int = 0
    first: Optional[float] = None
    last: Optional[float] = None
    finished: bool = False


class _ClientGone(Exception):
    pass


class _BodyError(Exception):
    pass


def _prompt_words(kind: str, body: dict) -> List[str]:
    """The prompt as tokens, for the prefix cache."""
    if kind == "chat":
        parts = []
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"<{message.get('role')}> {content or ''}" if isinstance(message, dict) else "")
        return _TOKEN.findall(" ".join(parts))
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return [str(t) for t in prompt]
    return _TOKEN.findall(str(prompt or ""))


def _templated_chat(messages: list, generation_prompt: bool) -> str:
    """Messages as the chat template renders them, so that /tokenize counts what a chat request's
    usage counts (``simulate.chat_prompt_tokens``): each message's three marker tokens and its text,
    then the assistant's two-token prefix."""
    parts = []
    for message in messages:
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"<{message.get('role')}> {content or ''}")
    return " ".join(parts + (["<assistant"] if generation_prompt else []))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    state: EngineState  # set on the subclass made by make_server

    # -- plumbing ------------------------------------------------------------------------------

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass  # one access line per request is written by _access instead

    def _access(self, status: int) -> None:
        self.state.log("INFO", f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path} '
                               f'{self.request_version}" {status}')

    def _send_bytes(self, status: int, data: bytes, content_type: Optional[str],
                    extra_headers: Optional[dict] = None) -> None:
        self.send_response(status)
        if content_type is not None:  # None: a bare Response(status_code=200), which sends no Content-Type
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra_headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self._access(status)

    def _send_json(self, status: int, doc, extra_headers: Optional[dict] = None) -> None:
        self._send_bytes(status, json.dumps(doc).encode(), "application/json", extra_headers)

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise _ClientGone() from None

    def _event(self, doc) -> None:
        payload = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
        self._chunk(f"data: {payload}\n\n".encode())

    def _read_raw_body(self) -> bytes:
        """The whole request body (Content-Length or chunked), read even when the answer is an error."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            data = b""
            while True:
                size_line = self.rfile.readline(1024)
                try:
                    size = int(size_line.split(b";")[0].strip() or b"0", 16)
                except ValueError:
                    raise _BodyError("bad chunk size") from None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return data
                if len(data) + size > MAX_BODY_BYTES:
                    raise _BodyError("body too large")
                data += self.rfile.read(size)
                self.rfile.readline(8)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _BodyError("bad Content-Length") from None
        if length > MAX_BODY_BYTES or length < 0:
            raise _BodyError("body too large")
        return self.rfile.read(length) if length else b""

    def _json_body(self, raw: bytes):
        try:
            return json.loads(raw or b"null")
        except ValueError:
            # a body that is not JSON fails the app's request validation, which vLLM's handler types "Bad Request"
            raise ApiError(400, "the request body is not valid JSON", kind="Bad Request") from None

    def _error(self, err: ApiError) -> None:
        self._send_json(err.status, A.error_body(err, self.state.engine))

    # -- dispatch -------------------------------------------------------------------------------

    def _routes(self):
        """The routes served, as {path: handler} for GET and POST: each one the engine declares
        (``routes.OPENAPI``); SGLang has no /version, /load or POST /ping."""
        st = self.state
        tokenize = ("/v1/tokenize", "/v1/detokenize") if st.engine == "sglang" else ("/tokenize", "/detokenize")
        get = {"/health": self._health, "/ping": self._ping, "/metrics": self._metrics, "/v1/models": self._models}
        post = {
            "/v1/chat/completions": lambda body: self._complete("chat", body),
            "/v1/completions": lambda body: self._complete("completion", body),
            "/v1/responses": self._responses,
            "/v1/messages": self._messages, "/v1/messages/count_tokens": self._count_tokens,
            tokenize[0]: self._tokenize, tokenize[1]: self._detokenize,
        }
        if st.engine == "vllm":
            get.update({"/version": self._version, "/load": self._load})
            post["/ping"] = lambda body: self._ping()
        if st.engine == "sglang":  # SGLang 0.5.23 serves both names (the get_ ones deprecated); the router asks them
            for path in ("/model_info", "/get_model_info"):
                get[path] = lambda: self._send_json(200, st.model_info_doc())
            for path in ("/server_info", "/get_server_info"):
                get[path] = lambda: self._send_json(200, st.server_info_doc())
            get["/health_generate"] = self._ping  # 200, no body, as /health_generate answers
        return get, post

    def _templated(self, method: str, template: str):
        """The handler of a declared route with ``{}`` segments, if the stand-in serves it."""
        served = {("GET", "/v1/responses/{response_id}"): self._no_stored_response,
                  ("POST", "/v1/responses/{response_id}/cancel"): self._no_stored_response}
        if self.state.engine == "sglang":
            served[("GET", "/v1/models/{model}")] = self._model
        return served.get((method, template))

    def send_response(self, code, message=None) -> None:
        self._answered = True  # this request's status line is out: an error can no longer be sent
        super().send_response(code, message)

    def _dispatch(self) -> None:
        self._answered = False
        try:
            raw = self._read_raw_body()
        except _BodyError as err:
            self.close_connection = True
            self._send_json(413 if "large" in str(err) else 400, {"detail": str(err)}, {"Connection": "close"})
            return
        path = self.path.split("?", 1)[0]
        st = self.state
        if path == STATE_PATH and self.command == "GET":  # the stand-in's own route, before any engine rule
            self._state()
            return
        if not auth.allowed(st.engine, st.api_keys, self.command, path, self.headers.get("Authorization")):
            self._send_json(401, auth.UNAUTHORIZED)
            return
        get, post = self._routes()
        # vLLM 0.33.0 and SGLang 0.5.23 declare their routes GET/POST only (their OpenAPI has no HEAD
        # but SGLang's "/"), and their servers answer HEAD with 405 like any undeclared method.
        method = "GET" if self.command == "HEAD" and st.engine not in ("vllm", "sglang") else self.command
        table = {"GET": get, "POST": post}.get(method)
        if table is not None and path in table:
            if method == "GET":
                table[path]()
                return
            try:
                body = self._json_body(raw)
            except ApiError as err:
                self._error(err)
                return
            self._guarded(table[path], body)
            return
        self._undeclared_or_unserved(method, path)

    def _guarded(self, handler, body) -> None:
        """A handler's unexpected failure answered 500 in the engine's shape (as the engines' apps do),
        never a connection closed without an answer; once a stream has begun, the stream just ends."""
        try:
            handler(body)
        except (_ClientGone, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # noqa: BLE001 - the client must get an answer whatever failed
            self.state.log("ERROR", f"{self.command} {self.path}: {type(err).__name__}: {err}")
            if self._answered:  # a stream had begun: it can only end, with the connection
                self.close_connection = True
            else:  # the body was read: a whole 500 keeps the connection, as the engines' servers do (a
                # close without "Connection: close" would fail the client's next request on it)
                self._error(ApiError(500, f"{type(err).__name__}: {err}", kind="InternalServerError"))

    def _undeclared_or_unserved(self, method: str, path: str) -> None:
        """A templated route, or what the engine answers a path it has not (404), a method the route is
        not declared for (405), a declared route the stand-in does not serve (501, the engine's shape)."""
        found = routes.match(self.state.engine, path)
        if found is None:
            self._send_json(404, {"detail": "Not Found"})
            return
        template, params = found
        handler = self._templated(method, template)
        if handler is not None:
            handler(**params)
            return
        methods = routes.declared(self.state.engine)[template]
        if method not in methods:
            self._send_json(405, {"detail": "Method Not Allowed"}, {"Allow": ", ".join(methods)})
            return
        self._error(ApiError(501, f"{method} {template} is not served by this stand-in engine "
                                  f"(the real {self.state.engine} serves it)", kind="NotImplementedError"))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch  # noqa: N815

    # -- small routes ---------------------------------------------------------------------------

    def _health(self) -> None:
        """200 with no body: vLLM 0.33.0 and SGLang 0.5.23 both return a bare ``Response(status_code=200)``."""
        self._send_bytes(200, b"", None)

    def _state(self) -> None:
        """``STATE_PATH``: what the tests read of the stand-in's inside; never part of an engine's answer."""
        st = self.state
        self._send_json(200, {"engine_config": st.engine_config(),
                              "running": st.scheduler.running, "waiting": st.scheduler.waiting,
                              "uptime_s": round(time.time() - st.started, 3)})

    def _ping(self) -> None:
        self._send_bytes(200, b"", "application/json")

    def _version(self) -> None:
        self._send_json(200, {"version": self.state.settings.engine_version})

    def _load(self) -> None:
        sched = self.state.scheduler
        self._send_json(200, {"server_load": sched.running + sched.waiting})

    def _metrics(self) -> None:
        sched = self.state.scheduler
        self._send_bytes(200, self.state.metrics.text(sched.running, sched.waiting).encode(),
                         "text/plain; version=0.0.4; charset=utf-8")

    def _models(self) -> None:
        self._send_json(200, {"object": "list", "data": [self.state.model_card()]})

    def _model(self, model: str) -> None:
        """SGLang's ``/v1/models/{model}``: the served model's card, else its own 404 body."""
        if model != self.state.settings.served_model_name:
            self._send_json(404, {"error": {"message": f"The model '{model}' does not exist",
                                            "type": "invalid_request_error", "param": "model",
                                            "code": "model_not_found"}})
            return
        self._send_json(200, self.state.model_card())

    def _no_stored_response(self, response_id: str) -> None:
        """Responses are not stored (vLLM stores none unless VLLM_ENABLE_RESPONSES_API_STORE): each id is unknown."""
        self._error(ApiError(404, f"Response with id '{response_id}' not found.", kind="invalid_request_error",
                             param="response_id"))

    def _tokenize(self, body) -> None:
        st = self.state
        if not isinstance(body, dict):
            return self._error(ApiError(400, "the request body must be a JSON object"))
        if isinstance(body.get("prompt"), str):
            text = body["prompt"]
        elif isinstance(body.get("messages"), list):
            text = _templated_chat(body["messages"], bool(body.get("add_generation_prompt", True)))
        else:
            return self._error(ApiError(400, "tokenize needs a prompt (string) or messages", param="prompt"))
        ids = st.vocab.encode(text)
        self._send_json(200, {"count": len(ids), "max_model_len": st.max_model_len, "tokens": ids, "token_strs": None})

    def _detokenize(self, body) -> None:
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            return self._error(ApiError(400, "tokens must be a list of token ids", param="tokens"))
        self._send_json(200, {"prompt": self.state.vocab.decode(tokens)})

    # -- generation -----------------------------------------------------------------------------

    def _parse(self, kind: str, body, refuse: Optional[Callable[[ApiError], None]] = None) -> Optional[ApiRequest]:
        """The request checked, and its Engram rows looked up; None once the refusal is sent (by ``refuse``)."""
        refuse = refuse or self._error
        st = self.state
        s = st.settings
        try:
            request = parse_api_request(kind, body, served_model_name=s.served_model_name,
                                        max_model_len=st.max_model_len, default_chat_kwargs=s.default_chat_template_kwargs,
                                        engine=st.engine, auto_tool_choice=st.auto_tool_choice,
                                        tool_call_parser=s.tool_call_parser,
                                        vocab_size=getattr(st.model_info, "vocab_size", None))
        except ApiError as err:
            refuse(err)
            return None
        if st.row_store is not None:  # every forward pass looks its Engram rows up on NVMe
            from .engram_nvme import EngramError

            try:
                st.row_store.lookup(request.prompt_tokens, request.prompt_tokens)
            except (OSError, EngramError) as err:
                st.log("ERROR", f"Engram row store: {err}")
                refuse(ApiError(500, f"Engram row lookup failed: {err}", kind="InternalServerError"))
                return None
        return request

    def _plans(self, request: ApiRequest) -> List[A.ChoicePlan]:
        st = self.state
        return A.plan_choices(request, engine=st.engine, max_model_len=st.max_model_len, timing=st.settings.timing,
                              reasoning_parser=bool(st.settings.reasoning_parser))

    def _complete(self, kind: str, body) -> None:
        request = self._parse(kind, body)
        if request is None:
            return
        plans = self._plans(request)
        if kind == "completion" and request.body.get("echo"):  # each choice starts with its prompt's text
            for plan in plans:
                given = request.prompts[plan.index // request.n].given
                plan.echo = given if isinstance(given, str) else self.state.vocab.decode(list(given or []))
        self._generate(kind, request, plans)

    def _responses(self, body) -> None:
        """``POST /v1/responses``: a chat request underneath, answered as a response object or its events."""
        self._typed_answer(body, R, self._error)

    def _messages(self, body) -> None:
        """``POST /v1/messages`` (Anthropic's Messages API): a chat request underneath, errors in its shape."""
        self._typed_answer(body, M, self._anthropic_error)

    def _count_tokens(self, body) -> None:
        try:
            chat = M.chat_body(body, counting=True)
        except ApiError as err:
            return self._anthropic_error(err)
        request = self._parse("chat", chat, self._anthropic_error)
        if request is not None:
            self._send_json(200, {"input_tokens": request.prompt_tokens})

    def _anthropic_error(self, err: ApiError) -> None:
        self._send_json(err.status, M.error_body(err))

    def _typed_answer(self, body, api, refuse) -> None:
        """A chat request written as another API's answer (``api``: its ``chat_body`` and ``Answer``):
        one document, or its typed events (``event: TYPE`` / ``data: {...}``); ``refuse`` writes errors."""
        try:
            chat = api.chat_body(body)
        except ApiError as err:
            return refuse(err)
        request = self._parse("chat", chat, refuse)
        if request is None:
            return
        plans = self._plans(request)[:1]
        answer = api.Answer(body, request.model or self.state.settings.served_model_name, request.prompt_tokens,
                            request.base.max_tokens)
        stream = request.base.stream
        on_token = None
        if stream:
            self._start_event_stream()
            self._typed_events(answer.opening())
            on_token = lambda plan, step: self._typed_events(answer.token(*plan.events[step]))  # noqa: E731

        def end_stream() -> None:
            self._typed_events(answer.closing(plans[0].finish_reason, plans[0].stop_reason))
            self._chunk(b"")

        if not self._run_decode("chat", request, plans, on_token, end_stream=end_stream if stream else None):
            return
        for kind, text in plans[0].events:
            answer.add(kind, str(text))
        self._send_json(200, answer.final(plans[0].finish_reason, plans[0].stop_reason))

    def _run_decode(self, kind: str, request: ApiRequest, plans: List[A.ChoicePlan], on_token=None, on_start=None,
                    end_stream: Optional[Callable[[], None]] = None) -> bool:
        """Admit the request and decode its plans; a streamed answer (``end_stream`` given) is ended here.
        True when a plain answer is still to be sent; False when the stream is over or the client left."""
        tally = self._admit(kind, request)
        try:
            self._decode(plans, tally, on_token, on_start)
            if end_stream is not None:
                end_stream()
            tally.finished = True
        except _ClientGone:
            self.close_connection = True
        finally:
            self._request_done(request, plans, tally)
        if end_stream is not None:
            if tally.finished:
                self._access(200)
            return False
        return tally.finished

    def _typed_events(self, events: List[dict]) -> None:
        for event in events:
            payload = json.dumps(event, separators=(",", ":"))
            self._chunk(f"event: {event['type']}\ndata: {payload}\n\n".encode())

    def _generate(self, kind: str, request: ApiRequest, plans: List[A.ChoicePlan]) -> None:
        st = self.state
        base_req = request.base
        chat = kind == "chat"
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        use = A.usage(base_req.prompt_tokens, plans, request.n)
        header = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                  "model": request.model or st.settings.served_model_name}
        stream = base_req.stream
        if stream:
            self._start_event_stream()
        continuous = request.continuous_usage
        on_token = (lambda plan, step: self._emit(chat, header, plan, step, continuous)) if stream else None
        on_start = (lambda: self._role_chunks(header, plans, continuous)) if stream and chat else None
        end_stream = (lambda: self._end_event_stream(chat, header, plans, use if base_req.include_usage else None,
                                                     continuous)) if stream else None
        if not self._run_decode(kind, request, plans, on_token, on_start, end_stream):
            return
        if chat:
            doc = A.chat_response(st.engine, rid, created, header["model"], plans, use, request.logprobs is not None)
        else:
            doc = A.completion_response(st.engine, rid, created, header["model"], plans, use,
                                        request.logprobs is not None)
        try:
            self._send_json(200, doc)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _start_event_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _admit(self, kind: str, request: ApiRequest) -> "_Tally":
        """Wait for a slot in the scheduler; the request's prompt now holds KV cache."""
        sched, metrics = self.state.scheduler, self.state.metrics
        tally = _Tally(begun=time.monotonic())
        sched.admit()
        tally.admitted = time.monotonic()
        metrics.observe("queue", tally.admitted - tally.begun)
        metrics.prompt_seen(_prompt_words(kind, request.body))
        metrics.kv(request.prompt_tokens)
        tally.held = request.prompt_tokens
        return tally

    def _decode(self, plans: List[A.ChoicePlan], tally: "_Tally", on_token: Optional[Callable] = None,
                on_start: Optional[Callable[[], None]] = None) -> None:
        """Prefill (then ``on_start()``), then one scheduler step per token (all choices at once), with
        ``on_token(plan, step)`` for each token when the answer is streamed."""
        st = self.state
        sched, metrics = st.scheduler, st.metrics
        sched.prefill(tally.held)  # the prompt (all it holds so far)
        metrics.observe("prefill", time.monotonic() - tally.admitted)
        if on_start is not None:
            on_start()
        for step in range(max((p.tokens for p in plans), default=0)):
            if step > 0:
                sched.decode_step()
            now = time.monotonic()
            if tally.first is None:
                tally.first = now
                metrics.observe("ttft", now - tally.begun)
            else:
                metrics.observe("itl", now - tally.last)
            tally.last = now
            emitted = 0
            for plan in plans:
                if step >= plan.tokens:
                    continue
                emitted += 1
                if on_token is not None:
                    on_token(plan, step)
            metrics.tokens_generated(emitted)
            metrics.kv(emitted)
            tally.held += emitted
            tally.sent += emitted

    def _role_chunks(self, header: dict, plans: List[A.ChoicePlan], continuous: bool) -> None:
        """A chat stream's first chunk of each choice: the role (with usage 0 when ``continuous``)."""
        for plan in plans:
            chunk = A.chat_chunk(self.state.engine, header, plan.index, {"role": "assistant", "content": ""})
            self._event(dict(chunk, usage=A.running_usage(plan, 0)) if continuous else chunk)

    def _end_event_stream(self, chat: bool, header: dict, plans: List[A.ChoicePlan], use: Optional[dict],
                          continuous: bool = False) -> None:
        """The ends of choices that had no token, the usage chunk when asked, [DONE], the body's end."""
        for plan in plans:
            if plan.tokens == 0:
                self._emit(chat, header, plan, -1, continuous)
        if use is not None:
            self._event(dict(header, choices=[], usage=use))
        self._event("[DONE]")
        self._chunk(b"")  # the chunked body's end

    def _request_done(self, request: ApiRequest, plans: List[A.ChoicePlan], tally: "_Tally") -> None:
        """Free the slot and the KV cache, and observe the request's metrics (finished or aborted)."""
        base_req, metrics = request.base, self.state.metrics
        self.state.scheduler.release()
        metrics.kv(-tally.held)
        end = time.monotonic()
        decode_s = end - tally.first if tally.first is not None else 0.0
        metrics.observe("decode", decode_s)
        metrics.observe("inference", end - tally.admitted)
        if tally.sent > 1:
            metrics.observe("tpot", decode_s / (tally.sent - 1))
        for plan in plans:
            metrics.speculated(plan.tokens if tally.finished else 0, base_req.seed + plan.index)
        reason = plans[0].finish_reason if tally.finished and plans else "abort"
        metrics.request_done(prompt_tokens=request.prompt_tokens, generated=tally.sent,
                             finish={"tool_calls": "stop"}.get(reason, reason), n=request.n,
                             max_tokens=base_req.max_tokens, e2e_s=end - tally.begun,
                             throughput=(tally.sent / decode_s) if decode_s > 0 else 0.0)

    def _emit(self, chat: bool, header: dict, plan: A.ChoicePlan, step: int, continuous: bool = False) -> None:
        """One streamed chunk: token ``step`` of ``plan`` (-1: a choice with no token, just its end), with
        the choice's usage so far when ``continuous``."""
        if continuous:
            header = dict(header, usage=A.running_usage(plan, step + 1))
        engine = self.state.engine
        last = step == plan.tokens - 1 or step < 0
        finish = plan.finish_reason if last else None
        event = plan.events[step] if step >= 0 else None
        entry = None
        if event is not None and event[0] != "tool" and plan.logprobs:
            text_index = sum(1 for k, _ in plan.events[:step] if k != "tool")
            entry = plan.logprobs[text_index]
        if chat:
            delta = A.event_delta(engine, event) if event is not None else {}
            self._event(A.chat_chunk(engine, header, plan.index, delta, finish=finish, plan=plan,
                                     logprobs={"content": [entry]} if entry else None))
        else:
            text = str(event[1]) if event is not None else ""
            if step <= 0:
                text = plan.echo + text
            self._event(A.completion_chunk(engine, header, plan.index, text, finish=finish, plan=plan,
                                           logprobs=A.completion_logprobs([entry], engine) if entry else None))


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def make_server(state: EngineState, host: str, port: int) -> Server:
    handler = type("StandinHandler", (Handler,), {"state": state})
    bind = "" if host in ("0.0.0.0", "") else host
    server_class = Server
    if ":" in bind:
        import socket

        server_class = type("Server6", (Server,), {"address_family": socket.AF_INET6})
    return server_class((bind, port), handler)
