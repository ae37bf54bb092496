"""The stand-in for the single-box engine: ``python -m sparkctl.standin singlebox --engine v41``.

It behaves as the single-box engine's README describes its server (``server/app.py``), with the
settings of its ``.env`` in the environment (MODEL_DIR, HOST, PORT, MAX_SEQ, SPEC,
DEFAULT_THINKING, DEFAULT_EFFORT, EXPERT_FORMAT, PRUNE_KEEP, ARENA_GB, DSV41_PRUNE_*):

- the warm start fills the arena *before* the socket is bound (``SPARKCTL_STANDIN_LOAD_S``), so
  a health check sees "connection refused" until then, as on the box;
- ``SPARKCTL_STANDIN_HOLD_MB`` of memory is really held (touched) while it runs, so a launcher
  can watch the memory go and come back;
- ``GET /health`` carries ``engine_config`` (arena GB and slots, resident-expert %, max_seq, spec,
  trace, kernel); every completion carries ``x_engine_stats`` (the same plus that request's
  acceptance length, hit rate, NVMe GB, Engram rows, the attention/MoE split);
- thinking is off unless DEFAULT_THINKING=on; per request the first of
  ``chat_template_kwargs.thinking``, ``enable_thinking``, ``reasoning_effort`` that is present
  decides (``reasoning_effort``: none→off, low→off/50, medium→on/60, high→on/75, xhigh→on/90,
  max→on/100, an integer 1–100 → on at that effort); reasoning is sent as ``reasoning_content``;
- one request at a time: a second caller waits (no error).

Log lines go to stdout; SIGTERM ends it with exit 0; a missing checkpoint or a taken port exit 1.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping, Optional

from .model import ModelError, load_model
from .simulate import ApiError, Request, Scheduler, Timing, env_number, output_pieces, parse_request, plan_output

EFFORTS = {"none": (False, None), "low": (False, 50), "medium": (True, 60), "high": (True, 75),
           "xhigh": (True, 90), "max": (True, 100)}
MOE_LAYERS, EXPERTS_PER_LAYER = 40, 384
FP4_SLOT_BYTES = 3 * 2304 * 5120 * 4.25 / 8  # one routed expert at e2m1 + UE8M0/32
CB3_SLOT_BYTES = 14.48e6
# The README's v0.1.0 row: at a 25.6 % resident set the engine reports a hit rate of 0.830 and
# streams 0.92 GB per generated token: 0.92 GB / 18.8 MB / (1 - 0.830) ~ 288 expert reads a token.
EXPERT_READS_PER_TOKEN = 288


class StartupError(Exception):
    pass


def log(message: str, level: str = "INFO") -> None:
    sys.stdout.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {level} {message}\n")
    sys.stdout.flush()


def _flag(env: Mapping[str, str], name: str, default: str) -> bool:
    value = env.get(name, default).strip().lower()
    if value not in ("1", "0", "on", "off", "true", "false", "yes", "no"):
        raise StartupError(f"{name}={env.get(name)!r} is not on/off")
    return value in ("1", "on", "true", "yes")


def _number(env: Mapping[str, str], name: str, kind, default=None):
    return env_number(env, name, kind, default, StartupError)


@dataclass
class BoxSettings:
    model_dir: str
    host: str
    port: int
    served_model_name: str
    max_seq: int
    spec: bool
    default_thinking: bool
    default_effort: int
    expert_format: str
    prune_keep: Optional[float]
    arena_gb: Optional[float]
    prune_rank: str
    prune_source: str
    kernel: str
    load_s: float
    hold_mb: int
    timing: Timing

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "BoxSettings":
        if not env.get("MODEL_DIR"):
            raise StartupError("MODEL_DIR is not set (copy env.example to .env and set it)")
        expert_format = env.get("EXPERT_FORMAT", "cb3")
        if expert_format not in ("cb3", "fp4"):
            raise StartupError(f"EXPERT_FORMAT={expert_format!r} is not cb3 or fp4")
        effort = _number(env, "DEFAULT_EFFORT", int, 75)
        if not 1 <= effort <= 100:
            raise StartupError(f"DEFAULT_EFFORT={effort} is not 1-100")
        keep = _number(env, "PRUNE_KEEP", float)
        if keep is not None and not 0 < keep <= 1:
            raise StartupError(f"PRUNE_KEEP={keep} is not in (0, 1]")
        timing = Timing.from_env(env)
        return cls(
            model_dir=env["MODEL_DIR"], host=env.get("HOST", "127.0.0.1"), port=_number(env, "PORT", int, 8000),
            served_model_name=env.get("SERVED_MODEL_NAME", "deepseek-v4.1-flash"),
            max_seq=_number(env, "MAX_SEQ", int, 32768), spec=_flag(env, "SPEC", "1"),
            default_thinking=_flag(env, "DEFAULT_THINKING", "off"), default_effort=effort,
            expert_format=expert_format, prune_keep=keep, arena_gb=_number(env, "ARENA_GB", float),
            prune_rank=env.get("DSV41_PRUNE_RANK", "sum"), prune_source=env.get("DSV41_PRUNE_SOURCE", "frequency"),
            kernel=env.get("KERNEL", "triton-fp4"), load_s=_number(env, "SPARKCTL_STANDIN_LOAD_S", float, 0.0),
            hold_mb=_number(env, "SPARKCTL_STANDIN_HOLD_MB", int, 0), timing=timing,
        )


def arena_slots(s: BoxSettings) -> tuple[int, float]:
    """(slots, arena GB) as the engine sizes them: cb3 keeps ceil(keep x 384) a layer; fp4 fills ARENA_GB."""
    routed = MOE_LAYERS * EXPERTS_PER_LAYER
    if s.expert_format == "cb3":
        keep = s.prune_keep if s.prune_keep is not None else 0.39
        slots = min(routed, math.ceil(keep * EXPERTS_PER_LAYER - 1e-9) * MOE_LAYERS)
        return slots, s.arena_gb if s.arena_gb is not None else slots * CB3_SLOT_BYTES / 1e9
    arena = s.arena_gb if s.arena_gb is not None else 73.8
    return min(routed, int(arena * 1e9 // FP4_SLOT_BYTES)), arena


def thinking_for(body: dict, default_on: bool, default_effort: int) -> tuple[bool, Optional[int]]:
    """(thinking on, effort) for one request: the first switch present wins (400 on a bad value)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ApiError(400, "chat_template_kwargs must be an object", param="chat_template_kwargs")
    if kwargs and "thinking" in kwargs:
        on = kwargs["thinking"]
        if not isinstance(on, bool):
            raise ApiError(400, "chat_template_kwargs.thinking must be true or false", param="chat_template_kwargs")
        return on, default_effort if on else None
    if "enable_thinking" in body:
        on = body["enable_thinking"]
        if not isinstance(on, bool):
            raise ApiError(400, "enable_thinking must be true or false", param="enable_thinking")
        return on, default_effort if on else None
    if body.get("reasoning_effort") is not None:
        effort = body["reasoning_effort"]
        if isinstance(effort, str) and effort.strip().isdigit():
            effort = int(effort)
        if isinstance(effort, int) and not isinstance(effort, bool):
            if not 1 <= effort <= 100:
                raise ApiError(400, f"reasoning_effort {effort} is not 1-100", param="reasoning_effort")
            return True, effort
        if isinstance(effort, str) and effort in EFFORTS:
            return EFFORTS[effort]
        raise ApiError(400, f"reasoning_effort must be one of {', '.join(EFFORTS)} or an integer 1-100, got {effort!r}",
                       param="reasoning_effort")
    return default_on, default_effort if default_on else None


def _newest_trace(model_dir: str) -> Optional[str]:
    """The warm start's ranking: the newest results/trace-*/stats/coverage.json in the working directory."""
    found = sorted(glob.glob(os.path.join("results", "trace-*", "stats", "coverage.json")), key=os.path.getmtime)
    return os.path.abspath(found[-1]) if found else None


class Box:
    """The engine's state: settings, the one-at-a-time scheduler, the arena's figures."""

    def __init__(self, settings: BoxSettings, engram_layers: list[int]):
        self.s = settings
        self.slots, self.arena_gb = arena_slots(settings)
        self.routed = MOE_LAYERS * EXPERTS_PER_LAYER
        self.engram_layers = engram_layers
        self.trace = _newest_trace(settings.model_dir)
        self.scheduler = Scheduler(settings.timing, 1)  # single-sequence: a second caller waits
        self.started = time.time()
        self.requests = 0

    @property
    def resident(self) -> float:
        return self.slots / self.routed

    def hit_rate(self) -> float:
        # cb3 never reads an expert outside its keep-set; fp4 misses stream from NVMe. The coverage
        # curve through the README's one serving point (25.6 % resident -> 0.830) and (0, 0), (1, 1).
        if self.s.expert_format == "cb3":
            return 1.0
        r = self.resident
        return 0.830 * r / 0.256 if r <= 0.256 else 0.830 + (1 - 0.830) * (r - 0.256) / (1 - 0.256)

    def engine_config(self) -> dict:
        s = self.s
        return {
            "engine": "v41", "model_dir": s.model_dir, "served_model_name": s.served_model_name,
            "expert_format": s.expert_format, "arena_gb": round(self.arena_gb, 1), "arena_slots": self.slots,
            "resident_experts_pct": round(100 * self.resident, 1), "prune_keep": s.prune_keep,
            "prune_rank": s.prune_rank, "prune_source": s.prune_source, "max_seq": s.max_seq, "spec": s.spec,
            "default_thinking": "on" if s.default_thinking else "off", "default_effort": s.default_effort,
            "kernel": s.kernel, "trace": {"coverage": self.trace, "layers": MOE_LAYERS},
            "max_concurrent_requests": 1,
        }

    def stats(self, prompt_tokens: int, generated: int, thinking: bool, effort: Optional[int], seconds: float) -> dict:
        hit = self.hit_rate()
        nvme_gb = generated * EXPERT_READS_PER_TOKEN * (1 - hit) * FP4_SLOT_BYTES / 1e9
        decode_s = max(seconds, 1e-9)
        return {
            **self.engine_config(),
            "prompt_tokens": prompt_tokens, "completion_tokens": generated,
            "thinking": thinking, "effort": effort,
            "acceptance_length": 1.5 if self.s.spec and generated else 1.0,  # README: DSpark is worth 1.5x here
            "hit_rate": round(hit, 3), "nvme_gb": round(nvme_gb, 3),
            "engram_rows": (prompt_tokens + generated) * len(self.engram_layers),
            "attention_pct": 5.0, "moe_pct": 95.0,  # README: attention, Engram, kernel together under 8 %
            "seconds": round(seconds, 3), "tok_s": round(generated / decode_s, 2),
        }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    box: Box

    def log_message(self, format, *args):  # noqa: A002
        pass

    def _json(self, status: int, doc) -> None:
        data = (json.dumps(doc) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        log(f'"{self.command} {self.path}" {status}')

    def _event(self, doc) -> None:
        payload = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
        data = f"data: {payload}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):  # noqa: N802
        path = self.path.split("?", 1)[0]
        box = self.box
        if path == "/health":
            self._json(200, {"status": "ok", "engine_config": box.engine_config(),
                             "busy": box.scheduler.running > 0, "waiting": box.scheduler.waiting,
                             "uptime_s": round(time.time() - box.started, 3)})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": box.s.served_model_name, "object": "model",
                                                          "created": int(box.started), "owned_by": "dsv41-spark",
                                                          "max_model_len": box.s.max_seq}]})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        path = self.path.split("?", 1)[0]
        kinds = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
        if path not in kinds:
            self._json(404, {"detail": "Not Found"})
            return
        box = self.box
        try:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except ValueError:
                raise ApiError(400, "the request body is not valid JSON") from None
            request = parse_request(kinds[path], body, served_model_name=box.s.served_model_name,
                                    max_model_len=box.s.max_seq, default_chat_kwargs={})
            thinking, effort = thinking_for(body, box.s.default_thinking, box.s.default_effort) \
                if request.kind == "chat" else (False, None)
        except ApiError as err:
            self._json(err.status, err.body())
            return
        self._generate(dataclasses.replace(request, thinking=thinking), effort)

    def _generate(self, request: Request, effort: Optional[int]) -> None:
        box, s = self.box, self.box.s
        plan = plan_output(prompt_tokens=request.prompt_tokens, max_tokens=request.max_tokens, max_model_len=s.max_seq,
                           thinking=request.thinking, ignore_eos=request.ignore_eos, timing=s.timing)
        pieces = output_pieces(plan, seed=request.seed, reasoning_parser=True)
        chat = request.kind == "chat"
        usage = {"prompt_tokens": request.prompt_tokens, "completion_tokens": len(pieces),
                 "total_tokens": request.prompt_tokens + len(pieces)}
        base = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
                "model": s.served_model_name}
        if request.stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
        box.scheduler.admit()  # one at a time: the second caller blocks here
        begun = time.monotonic()
        try:
            self._decode(request, effort, pieces, plan.finish_reason, base, begun)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return
        finally:
            box.scheduler.release()
            box.requests += 1
        stats = box.stats(request.prompt_tokens, len(pieces), request.thinking, effort, time.monotonic() - begun)
        if request.stream:
            self._end_stream(request, pieces, plan.finish_reason, base, usage, stats)
        else:
            self._json(200, _whole_response(chat, pieces, plan.finish_reason, base, usage, stats))

    def _decode(self, request: Request, effort: Optional[int], pieces: list, finish_reason: str, base: dict,
                begun: float) -> None:
        """Prefill, then one scheduler step per piece, streaming each when asked (the last carries the stats)."""
        box, chat = self.box, request.kind == "chat"
        box.scheduler.prefill(request.prompt_tokens)
        for index, (kind, text) in enumerate(pieces):
            if index:
                box.scheduler.decode_step()
            if request.stream:
                last = index == len(pieces) - 1
                choice = ({"index": 0, "delta": {kind: text}, "finish_reason": finish_reason if last else None}
                          if chat else {"index": 0, "text": text, "finish_reason": finish_reason if last else None})
                doc = dict(base, choices=[choice])
                if last:
                    doc["x_engine_stats"] = box.stats(request.prompt_tokens, len(pieces), request.thinking, effort,
                                                      time.monotonic() - begun)
                self._event(doc)

    def _end_stream(self, request: Request, pieces: list, finish_reason: str, base: dict, usage: dict,
                    stats: dict) -> None:
        try:
            if not pieces:
                self._event(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish_reason}],
                                 x_engine_stats=stats))
            if request.include_usage:
                self._event(dict(base, choices=[], usage=usage, x_engine_stats=stats))
            self._event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            log(f'"{self.command} {self.path}" 200 (stream)')
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _whole_response(chat: bool, pieces: list, finish_reason: str, base: dict, usage: dict, stats: dict) -> dict:
    """The non-streamed answer: the pieces joined (reasoning apart from the content on chat)."""
    reasoning = "".join(t for k, t in pieces if k == "reasoning_content") or None
    content = "".join(t for k, t in pieces if k == "content")
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": content, "reasoning_content": reasoning},
                  "finish_reason": finish_reason}
        return dict(base, object="chat.completion", choices=[choice], usage=usage, x_engine_stats=stats)
    return dict(base, choices=[{"index": 0, "text": content, "finish_reason": finish_reason}], usage=usage,
                x_engine_stats=stats)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _hold_memory(mb: int) -> bytearray:
    """Really take ``mb`` MiB: write one byte per page so the kernel backs every page."""
    buf = bytearray(mb << 20)
    for offset in range(0, len(buf), 4096):
        buf[offset] = 1
    return buf


def main(argv: list[str], env: Mapping[str, str] = os.environ) -> int:
    signal.signal(signal.SIGTERM, lambda *_: (log("received SIGTERM; shutting down"), os._exit(0)))  # first of all
    if argv[:2] not in (["--engine", "v41"], []) or len(argv) > 2:
        sys.stderr.write("usage: python -m sparkctl.standin singlebox [--engine v41]\n")
        return 2
    try:
        settings = BoxSettings.from_env(env)
        model = load_model(settings.model_dir)
    except (StartupError, ModelError) as err:
        log(str(err), "ERROR")
        return 1
    box = Box(settings, model.engram_layers)
    log(f"stand-in single-box engine v41: {settings.model_dir}, MAX_SEQ={settings.max_seq}, SPEC={int(settings.spec)}, "
        f"{settings.expert_format} arena {box.arena_gb:.1f} GB = {box.slots} slots = {100 * box.resident:.1f} % "
        f"of {box.routed} routed experts")
    log(f"warm start: filling the arena from NVMe (ranked by {box.trace or 'no trace: router order'})")
    held = _hold_memory(settings.hold_mb) if settings.hold_mb else None
    time.sleep(settings.load_s)  # the socket is bound only after the arena is full
    try:
        server = _Server((settings.host, settings.port), type("BoxHandler", (Handler,), {"box": box}))
    except OSError as err:
        log(f"cannot bind {settings.host}:{settings.port}: {err.strerror or err}", "ERROR")
        return 1
    log(f"ready: http://{settings.host}:{settings.port} (holding {len(held or b'') >> 20} MiB)")
    server.serve_forever()
    return 0
