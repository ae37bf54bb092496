"""The OpenAI-compatible HTTP API of the head rank (ThreadingHTTPServer, HTTP/1.1, chunked SSE).

Routes: ``GET /health`` (200 + ``engine_config``: what a benchmark needs to know about the server),
``GET /v1/models``, ``GET /metrics`` (Prometheus text, the engine's metric names), ``GET /version``,
``POST /v1/chat/completions`` and ``POST /v1/completions`` (non-streaming, or ``stream: true``:
``data: {chunk}`` events ending with ``data: [DONE]``; ``stream_options.include_usage`` adds a
last chunk with ``usage``). Errors have vLLM's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

from .simulate import ApiError, Request, Scheduler, output_pieces, parse_request, plan_output


class EngineState:
    """What the HTTP handlers share: settings, the scheduler, counters."""

    def __init__(self, settings, model_info, max_model_len: int, ranks_connected: Callable[[], int], log):
        self.settings = settings
        self.model_info = model_info
        self.max_model_len = max_model_len
        self.ranks_connected = ranks_connected
        self.log = log
        self.scheduler = Scheduler(settings.timing, settings.max_num_seqs)
        self.started = time.time()
        self.lock = threading.Lock()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished = {"stop": 0, "length": 0, "abort": 0}
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.e2e_sum = 0.0

    @property
    def owner(self) -> str:
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
            "thinking_default": bool(s.default_chat_template_kwargs.get("thinking", False)),
            "engram": {"disk": s.engram_disk, "layers": self.model_info.engram_layers,
                       "dir": s.knobs.engram_dir if s.engram_disk else None},
            "timing": {
                "ttft_base_ms": s.timing.ttft_base_ms, "ttft_per_token_ms": s.timing.ttft_per_token_ms,
                "ttft_concurrency": s.timing.ttft_concurrency, "itl_ms": s.timing.itl_ms,
                "itl_concurrency": s.timing.itl_concurrency,
            },
        }

    def record(self, prompt_tokens: int, generated: int, finish: str, ttft: Optional[float], e2e: float) -> None:
        with self.lock:
            self.prompt_tokens_total += prompt_tokens
            self.generation_tokens_total += generated
            self.finished[finish] = self.finished.get(finish, 0) + 1
            if ttft is not None:
                self.ttft_sum += ttft
                self.ttft_count += 1
            self.e2e_sum += e2e

    def metrics_text(self) -> str:
        label = '{model_name="%s"}' % self.settings.served_model_name
        if self.settings.engine == "sglang":
            names = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:prompt_tokens_total",
                     "sglang:generation_tokens_total", "sglang:time_to_first_token_seconds")
        else:
            names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                     "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds")
        with self.lock:
            lines = [
                f"# TYPE {names[0]} gauge", f"{names[0]}{label} {self.scheduler.running}",
                f"# TYPE {names[1]} gauge", f"{names[1]}{label} {self.scheduler.waiting}",
                f"# TYPE {names[2]} counter", f"{names[2]}{label} {self.prompt_tokens_total}",
                f"# TYPE {names[3]} counter", f"{names[3]}{label} {self.generation_tokens_total}",
                f"# TYPE {names[4]} summary", f"{names[4]}_sum{label} {self.ttft_sum:.6f}",
                f"{names[4]}_count{label} {self.ttft_count}",
            ]
            prefix = names[0].split(":")[0]
            lines.append(f"# TYPE {prefix}:request_success_total counter")
            for reason, count in sorted(self.finished.items()):
                lines.append(f'{prefix}:request_success_total{{model_name="{self.settings.served_model_name}",'
                             f'finished_reason="{reason}"}} {count}')
        return "\n".join(lines) + "\n"


class _ClientGone(Exception):
    pass


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

    def _send_json(self, status: int, doc, extra_headers: Optional[dict] = None) -> None:
        data = (json.dumps(doc) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra_headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self._access(status)

    def _send_text(self, status: int, text: str, content_type: str = "text/plain; charset=utf-8") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self._access(status)

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise _ClientGone() from None

    def _event(self, doc) -> None:
        payload = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
        self._chunk(f"data: {payload}\n\n".encode())

    def _read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None

    # -- routes ---------------------------------------------------------------------------------

    def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's naming
        path = self.path.split("?", 1)[0]
        st = self.state
        if path == "/health":
            self._send_json(200, {"status": "ok", "engine_config": st.engine_config(),
                                  "running": st.scheduler.running, "waiting": st.scheduler.waiting,
                                  "uptime_s": round(time.time() - st.started, 3)})
        elif path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{
                "id": st.settings.served_model_name, "object": "model", "created": int(st.started),
                "owned_by": st.owner, "root": st.settings.model_path, "parent": None,
                "max_model_len": st.max_model_len,
            }]})
        elif path == "/metrics":
            self._send_text(200, st.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/version":
            self._send_json(200, {"version": st.settings.engine_version})
        elif path == "/get_model_info" and st.settings.engine == "sglang":
            self._send_json(200, {"model_path": st.settings.model_path, "is_generation": True})
        elif path in ("/v1/chat/completions", "/v1/completions"):
            self._send_json(405, {"detail": "Method Not Allowed"})
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        path = self.path.split("?", 1)[0]
        kinds = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
        if path not in kinds:
            self._send_json(404 if path not in ("/health", "/v1/models", "/metrics") else 405,
                            {"detail": "Not Found" if path not in ("/health", "/v1/models", "/metrics") else "Method Not Allowed"})
            return
        st = self.state
        try:
            body = self._read_body()
            request = parse_request(kinds[path], body, served_model_name=st.settings.served_model_name,
                                    max_model_len=st.max_model_len,
                                    default_chat_kwargs=st.settings.default_chat_template_kwargs)
        except ApiError as err:
            self._send_json(err.status, err.body())
            return
        self._generate(request)

    # -- generation -----------------------------------------------------------------------------

    def _generate(self, request: Request) -> None:
        st = self.state
        s = st.settings
        plan = plan_output(prompt_tokens=request.prompt_tokens, max_tokens=request.max_tokens,
                           max_model_len=st.max_model_len, thinking=request.thinking,
                           ignore_eos=request.ignore_eos, timing=s.timing)
        pieces = output_pieces(plan, seed=request.seed, reasoning_parser=bool(s.reasoning_parser))
        chat = request.kind == "chat"
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        usage = {"prompt_tokens": request.prompt_tokens, "completion_tokens": len(pieces),
                 "total_tokens": request.prompt_tokens + len(pieces)}
        begun = time.monotonic()
        ttft = None
        if request.stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
        sched = st.scheduler
        sched.admit()
        sent = 0
        finish = plan.finish_reason
        try:
            sched.prefill(request.prompt_tokens)
            if request.stream:
                self._stream(request, pieces, rid, created, chat, plan.finish_reason, usage, begun)
                ttft = self._ttft
                sent = len(pieces)
            else:
                for index in range(len(pieces)):
                    if index == 0:
                        ttft = time.monotonic() - begun
                    else:
                        sched.decode_step()
                sent = len(pieces)
        except _ClientGone:
            finish = "abort"
            sent = self._sent
            self.close_connection = True
        finally:
            sched.release()
            st.record(request.prompt_tokens, sent, finish, ttft, time.monotonic() - begun)
        if request.stream:
            if finish != "abort":
                self._access(200)
            return
        reasoning = "".join(text for kind, text in pieces if kind == "reasoning_content") or None
        content = "".join(text for kind, text in pieces if kind == "content")
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": content, "reasoning_content": reasoning,
                                              "tool_calls": []},
                      "logprobs": None, "finish_reason": plan.finish_reason, "stop_reason": None}
            doc = {"id": rid, "object": "chat.completion", "created": created, "model": s.served_model_name,
                   "choices": [choice], "usage": usage}
        else:
            doc = {"id": rid, "object": "text_completion", "created": created, "model": s.served_model_name,
                   "choices": [{"index": 0, "text": content, "logprobs": None, "finish_reason": plan.finish_reason,
                                "stop_reason": None}], "usage": usage}
        try:
            self._send_json(200, doc)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _stream(self, request: Request, pieces, rid: str, created: int, chat: bool, finish: str, usage: dict,
                begun: float) -> None:
        s = self.state.settings
        self._sent = 0
        self._ttft = None
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": s.served_model_name}

        def chunk(choice: dict) -> dict:
            return dict(base, choices=[choice])

        if chat:
            self._event(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                               "finish_reason": None}))
        last = len(pieces) - 1
        for index, (kind, text) in enumerate(pieces):
            if index > 0:
                self.state.scheduler.decode_step()
            reason = finish if index == last else None
            if chat:
                choice = {"index": 0, "delta": {kind: text}, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
            self._event(chunk(choice))
            if index == 0:
                self._ttft = time.monotonic() - begun
            self._sent = index + 1
        if not pieces:
            empty = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish} if chat else \
                {"index": 0, "text": "", "logprobs": None, "finish_reason": finish, "stop_reason": None}
            self._event(chunk(empty))
        if request.include_usage:
            self._event(dict(base, choices=[], usage=usage))
        self._event("[DONE]")
        self._chunk(b"")  # the chunked body's end


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
