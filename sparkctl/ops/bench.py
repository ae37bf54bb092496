"""``sparkctl bench``: a streaming OpenAI client against the head's endpoint, the source reports' table, the SLO capacity.

Per concurrency level C, ``requests`` chat completions are sent by C closed-loop workers (each
sends its next request when the previous one ends), every one streaming (``stream: true``,
``stream_options.include_usage``) with ``max_tokens`` and, by default, ``ignore_eos`` so every
request produces exactly ``max_tokens`` tokens (the single-box engine's README's rule: a tok/s figure is only comparable
at a fixed output length; a request that comes back shorter is counted as ``short``). Each prompt
is ``prompt_tokens`` words that differ per request, so a prefix cache cannot serve one from another.

Per request, with t0 when the request is sent:

* **TTFT**: t0 to the first chunk carrying text (``content`` or ``reasoning_content``);
* **ITL**: (last text chunk - first text chunk) / (output tokens - 1): time per output token after
  the first, so a chunk carrying several speculative (DSpark) tokens is not one long gap;
* **latency**: t0 to the end of the stream (``data: [DONE]``);
* **TPS**: output tokens / latency, per stream (the source reports' "TPS": the TP4 vLLM report §6.1 has TPS x latency ≈ the
  same ~130 tokens at every C, so it is per request, end to end, not the aggregate);
* **RPS**: 1 / latency, per stream, as the source reports' "Throughput (RPS)" column (0.23 = 1/4.39 s);
  the level's aggregate, completed requests / wall time, is reported beside it.

Output tokens are the server's ``usage.completion_tokens`` (else the number of text chunks).
Statistics: mean, p50, p90 (linear interpolation), min, max. The SLO capacity is the largest C such
that it and every smaller tested level meet ``slo.ttft_ms`` and ``slo.tokens_per_s`` on the mean
(the TP4 vLLM report §8: "Max C = 2 at TTFT ≤ 1000 ms, TPS ≥ 20").
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from typing import Callable, Optional

from sparkctl.commands import router as R
from sparkctl.commands.engine_metrics import delta, detect_engine, metric_names, parse_exposition, summary
from sparkctl.commands.serve import url_host
from sparkctl.config.apikey import auth_headers
from sparkctl.errors import ConfigError, OperationFailed
from sparkctl.httpclient import client as http_client, httpx, tls_context
from sparkctl.ops.health import probe_endpoint
from sparkctl.ops.replicas import split_replicas
from sparkctl.ops.sse import DONE, data_payloads
from sparkctl.reporter import Reporter

MAX_REQUESTS = 10000
MAX_CONCURRENCY = 1024
PROMPT_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
    "romeo sierra tango uniform victor whiskey xray yankee zulu red green blue black white brown orange purple "
    "river mountain forest desert ocean island valley canyon meadow glacier north south east west spring summer"
).split()
INSTRUCTION = "Continue this list of words with more words of the same kind:"


# ---------------------------------------------------------------------------------------------
# Statistics (pure)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def summarize(values: list[float]) -> Optional[dict]:
    if not values:
        return None
    return {"mean": sum(values) / len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "min": float(min(values)), "max": float(max(values)), "n": len(values)}


@dataclass
class RequestResult:
    ok: bool
    latency_s: float = 0.0
    ttft_s: Optional[float] = None
    first_token_s: Optional[float] = None  # since t0
    last_token_s: Optional[float] = None
    output_tokens: int = 0
    prompt_tokens: Optional[int] = None
    text_chunks: int = 0
    error: Optional[str] = None
    # the single-box engine's per-request counters (hit rate, NVMe GB, ...): the README's bench rules
    # say a tok/s without them is an anecdote, so they stay with the request's figures
    engine_stats: Optional[dict] = None
    index: Optional[int] = None  # the request's number in the run (its prompt's)
    sent_s: Optional[float] = None  # t0, seconds since its level started

    @property
    def chunk_itl_s(self) -> Optional[float]:
        """Mean gap between text chunks: what a reader sees. Differs from ``itl_s`` when a chunk carries
        several tokens (speculative decoding's accepted drafts)."""
        if self.text_chunks < 2 or self.first_token_s is None or self.last_token_s is None:
            return None
        return (self.last_token_s - self.first_token_s) / (self.text_chunks - 1)

    def to_record(self) -> dict:
        """One request as kept in a result file: its timings (seconds) and token counts."""
        def r(v):
            return None if v is None else round(v, 6)
        return {"index": self.index, "ok": self.ok, "error": self.error, "sent_s": r(self.sent_s),
                "ttft_s": r(self.ttft_s), "last_token_s": r(self.last_token_s), "latency_s": r(self.latency_s),
                "itl_s": r(self.itl_s), "chunk_itl_s": r(self.chunk_itl_s), "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "text_chunks": self.text_chunks,
                **({"x_engine_stats": self.engine_stats} if self.engine_stats else {})}

    @property
    def itl_s(self) -> Optional[float]:
        if self.output_tokens < 2 or self.first_token_s is None or self.last_token_s is None:
            return None
        return (self.last_token_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def tps(self) -> Optional[float]:
        return self.output_tokens / self.latency_s if self.latency_s > 0 and self.output_tokens else None

    @property
    def rps(self) -> Optional[float]:
        return 1.0 / self.latency_s if self.latency_s > 0 else None


@dataclass
class LevelResult:
    concurrency: int  # closed loop: the workers; open loop and long prompts: the most requests in flight
    requests: int
    results: list[RequestResult]
    wall_s: float
    expected_tokens: Optional[int] = None  # max_tokens when ignore_eos: every request should produce exactly this
    kind: str = "concurrency"  # or "rate" (open loop, Poisson arrivals) or "long_prompt"
    rate: Optional[float] = None  # requests/s asked (kind "rate")
    prompt_tokens_asked: Optional[int] = None
    engine: Optional[dict] = None  # the engine's /metrics over the level (sparkctl.ops.bench.engine_delta)

    @property
    def label(self) -> str:
        if self.kind == "rate":
            return f"rate={self.rate:g}/s"
        if self.kind == "long_prompt":
            return f"prompt={self.prompt_tokens_asked}"
        return f"C={self.concurrency}"

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    def stat(self, name: str) -> Optional[dict]:
        ok = self.completed
        scale = {"ttft_ms": 1000.0, "itl_ms": 1000.0, "chunk_itl_ms": 1000.0}.get(name, 1.0)
        source = {"ttft_ms": "ttft_s", "itl_ms": "itl_s", "chunk_itl_ms": "chunk_itl_s", "latency_s": "latency_s",
                  "tps": "tps", "rps": "rps", "output_tokens": "output_tokens", "prompt_tokens": "prompt_tokens"}[name]
        values = [getattr(r, source) for r in ok]
        return summarize([v * scale for v in values if v is not None])

    def mean(self, name: str) -> Optional[float]:
        s = self.stat(name)
        return None if s is None else s["mean"]

    @property
    def short(self) -> int:
        if self.expected_tokens is None:
            return 0
        return sum(1 for r in self.completed if r.output_tokens != self.expected_tokens)

    def to_json(self, with_requests: bool = False) -> dict:
        errors: dict[str, int] = {}
        for r in self.failed:
            errors[r.error or "error"] = errors.get(r.error or "error", 0) + 1
        doc = {
            "kind": self.kind,
            "label": self.label,
            "rate": self.rate,
            "prompt_tokens_asked": self.prompt_tokens_asked,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "completed": len(self.completed),
            "failed": len(self.failed),
            "errors": [{"error": e, "count": n} for e, n in sorted(errors.items(), key=lambda kv: -kv[1])[:5]],
            "short_outputs": self.short,
            "wall_s": round(self.wall_s, 3),
            "throughput_rps": round(len(self.completed) / self.wall_s, 4) if self.wall_s > 0 else None,
            "output_tokens_per_s": round(sum(r.output_tokens for r in self.completed) / self.wall_s, 2) if self.wall_s > 0 else None,
            **{name: _rounded(self.stat(name)) for name in
               ("ttft_ms", "itl_ms", "chunk_itl_ms", "tps", "latency_s", "rps", "output_tokens", "prompt_tokens")},
            "engine": self.engine,
            **self._engine_stats_json(),
        }
        if with_requests:
            doc["requests_detail"] = [r.to_record() for r in self.results]
        return doc

    def _engine_stats_json(self) -> dict:
        stats = [r.engine_stats for r in self.completed if r.engine_stats]
        if not stats:
            return {}
        rates = [s["hit_rate"] for s in stats if isinstance(s.get("hit_rate"), (int, float))]
        nvme = [s["nvme_gb"] for s in stats if isinstance(s.get("nvme_gb"), (int, float))]
        return {"x_engine_stats": stats,
                "engine_stats": {"hit_rate_mean": round(sum(rates) / len(rates), 4) if rates else None,
                                 "nvme_gb_total": round(sum(nvme), 3) if nvme else None}}


def _rounded(stat: Optional[dict]) -> Optional[dict]:
    if stat is None:
        return None
    return {k: (v if k == "n" else round(v, 4)) for k, v in stat.items()}


@dataclass
class SloVerdict:
    ttft_ms: float
    tokens_per_s: float
    max_concurrency: int  # 0: not even the lowest level meets it
    levels: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "tokens_per_s": self.tokens_per_s, "statistic": "mean",
                "max_concurrency": self.max_concurrency, "levels": self.levels}


def slo_capacity(levels: list[LevelResult], ttft_ms: float, tokens_per_s: float) -> SloVerdict:
    """Largest C such that it and every smaller tested C meet both targets on the mean."""
    verdict = SloVerdict(ttft_ms, tokens_per_s, 0)
    still = True
    for level in sorted(closed_loop(levels), key=lambda lv: lv.concurrency):
        ttft, tps = level.mean("ttft_ms"), level.mean("tps")
        ttft_ok = ttft is not None and ttft <= ttft_ms
        tps_ok = tps is not None and tps >= tokens_per_s
        ok = ttft_ok and tps_ok and not level.failed
        verdict.levels.append({"concurrency": level.concurrency, "ttft_ms": None if ttft is None else round(ttft, 2),
                               "tps": None if tps is None else round(tps, 2), "ttft_ok": ttft_ok, "tps_ok": tps_ok,
                               "failed_requests": len(level.failed), "ok": ok})
        still = still and ok
        if still:
            verdict.max_concurrency = level.concurrency
    return verdict


def closed_loop(levels: list[LevelResult]) -> list[LevelResult]:
    """The concurrency levels: the source reports' table and the SLO capacity are about these only."""
    return [lv for lv in levels if lv.kind == "concurrency"]


def _cell(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _aligned(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows)


TABLE_HEADER = ["Concurrency", "TTFT (ms)", "ITL (ms)", "TPS (tok/s)", "Latency (s)", "Throughput (RPS)"]


def format_table(levels: list[LevelResult], statistic: str = "mean") -> str:
    """The source reports' benchmark table (the TP4 vLLM report §6.1, the TP8 vLLM report §7): one row per concurrency, ``statistic`` of each column."""
    rows = [TABLE_HEADER]
    for level in closed_loop(levels):
        def v(name):
            s = level.stat(name)
            return None if s is None else s[statistic]
        rows.append([str(level.concurrency), _cell(v("ttft_ms")), _cell(v("itl_ms")), _cell(v("tps")),
                     _cell(v("latency_s")), _cell(v("rps"))])
    return _aligned(rows)


def format_percentiles(levels: list[LevelResult]) -> str:
    rows = [["Concurrency", "TTFT p50/p90 (ms)", "ITL p50/p90 (ms)", "TPS p50/p90", "Latency p50/p90 (s)",
             "Requests", "Aggregate RPS"]]
    for level in closed_loop(levels):
        def pair(name):
            s = level.stat(name)
            return "-" if s is None else f"{s['p50']:.2f}/{s['p90']:.2f}"
        completed = len(level.completed)
        extra = f"{completed}/{level.requests}" + (f" ({len(level.failed)} failed)" if level.failed else "")
        if level.short:
            extra += f" ({level.short} short)"
        rows.append([str(level.concurrency), pair("ttft_ms"), pair("itl_ms"), pair("tps"), pair("latency_s"), extra,
                     _cell(completed / level.wall_s if level.wall_s > 0 else None)])
    return _aligned(rows)


def format_rate_table(levels: list[LevelResult]) -> str:
    """Open-loop levels: the asked rate, what the server completed per second, and the request timings."""
    rows = [["Rate (req/s)", "Completed RPS", "Max in flight", "TTFT p50/p90 (ms)", "ITL (ms)", "TPS (tok/s)",
             "Latency p90 (s)", "Requests"]]
    for level in levels:
        if level.kind != "rate":
            continue
        ttft, lat = level.stat("ttft_ms"), level.stat("latency_s")
        completed = len(level.completed)
        rows.append([f"{level.rate:g}", _cell(completed / level.wall_s if level.wall_s > 0 else None),
                     str(level.concurrency), "-" if ttft is None else f"{ttft['p50']:.2f}/{ttft['p90']:.2f}",
                     _cell(level.mean("itl_ms")), _cell(level.mean("tps")), "-" if lat is None else f"{lat['p90']:.2f}",
                     f"{completed}/{level.requests}" + (f" ({len(level.failed)} failed)" if level.failed else "")])
    return _aligned(rows) if len(rows) > 1 else ""


def format_long_table(levels: list[LevelResult]) -> str:
    """Long-prompt levels: TTFT is the prefill of the whole prompt."""
    rows = [["Prompt tokens", "TTFT mean (ms)", "TTFT max (ms)", "Prefill (tok/s)", "ITL (ms)", "Requests"]]
    for level in levels:
        if level.kind != "long_prompt":
            continue
        ttft, prompt = level.stat("ttft_ms"), level.mean("prompt_tokens") or level.prompt_tokens_asked
        prefill = prompt / (ttft["mean"] / 1000.0) if ttft and ttft["mean"] > 0 and prompt else None
        rows.append([str(level.prompt_tokens_asked), _cell(ttft and ttft["mean"]), _cell(ttft and ttft["max"]),
                     _cell(prefill, 0), _cell(level.mean("itl_ms")),
                     f"{len(level.completed)}/{level.requests}" + (f" ({len(level.failed)} failed)" if level.failed else "")])
    return _aligned(rows) if len(rows) > 1 else ""


def _engine_parts(e: Optional[dict]) -> list[str]:
    e = e or {}
    parts = []
    if e.get("spec_accept_length") is not None:
        parts.append(f"mean accepted length {e['spec_accept_length']:.2f}")
    if e.get("prefix_cache_hit_rate") is not None:
        parts.append(f"prefix-cache hit rate {100 * e['prefix_cache_hit_rate']:.1f} %")
    if e.get("preemptions"):
        parts.append(f"{e['preemptions']:.0f} preemptions")
    return parts


def format_engine(levels: list[LevelResult], run: Optional[dict] = None) -> str:
    """What the engine's own counters said over each level and the run (speculative decoding, prefix cache)."""
    lines = [f"  {level.label}: " + ", ".join(_engine_parts(level.engine)) for level in levels
             if _engine_parts(level.engine)]
    if _engine_parts(run):
        lines.append("  the whole run: " + ", ".join(_engine_parts(run)))
    return ("the engine's metrics:\n" + "\n".join(lines)) if lines else ""


def format_slo(verdict: SloVerdict) -> str:
    lines = [f"SLO (TTFT <= {verdict.ttft_ms:g} ms, TPS >= {verdict.tokens_per_s:g} tok/s, on the mean): "
             + (f"Max C = {verdict.max_concurrency}" if verdict.max_concurrency else "not met even at the lowest concurrency")]
    for lv in verdict.levels:
        mark = lambda ok: "ok" if ok else "MISS"  # noqa: E731
        failed = f", {lv['failed_requests']} failed requests" if lv["failed_requests"] else ""
        lines.append(f"  C={lv['concurrency']}: TTFT {_cell(lv['ttft_ms'])} ms {mark(lv['ttft_ok'])}, "
                     f"TPS {_cell(lv['tps'])} {mark(lv['tps_ok'])}{failed}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Requests


def prompt_text(prompt_tokens: int, index: int) -> str:
    """About ``prompt_tokens`` tokens of words, different for every request index."""
    count = max(1, prompt_tokens - len(INSTRUCTION.split()) - 8)  # the chat template and instruction take the rest
    n = len(PROMPT_WORDS)
    step = 1 + (index % (n - 1))  # a different walk through the words per request
    words = [PROMPT_WORDS[(index * 7 + i * step) % n] for i in range(count)]
    return f"{INSTRUCTION} request {index}: " + " ".join(words)


def chat_body(model: Optional[str], prompt: str, max_tokens: int, *, ignore_eos: bool, thinking: Optional[bool]) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}
    if model:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True
    if thinking is not None:
        body["chat_template_kwargs"] = {"thinking": thinking}
    return body


def stream_one(client, url: str, body: dict, clock: Callable[[], float] = time.perf_counter) -> RequestResult:
    """One streaming chat completion, timed. Never raises for a server or network failure."""
    t0 = clock()
    first = last = None
    chunks = 0
    usage = None
    engine_stats = None
    try:
        with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = response.read().decode("utf-8", "replace")
                try:
                    message = json.loads(text)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = " ".join(text.split())[:200]
                return RequestResult(False, clock() - t0, error=f"HTTP {response.status_code}: {message}")
            done = False
            for payload in data_payloads(response.iter_lines()):
                if payload == DONE:
                    done = True
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    continue
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if isinstance(chunk.get("x_engine_stats"), dict):
                    engine_stats = chunk["x_engine_stats"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or choice.get("text")
                    if text:
                        now = clock() - t0
                        first = now if first is None else first
                        last = now
                        chunks += 1
            end = clock() - t0
    except httpx.TimeoutException:
        return RequestResult(False, clock() - t0, error="timed out")
    except httpx.HTTPError as err:
        return RequestResult(False, clock() - t0, error=f"{type(err).__name__}: {' '.join(str(err).split())[:150]}")
    if not done:
        return RequestResult(False, end, error="stream ended without [DONE]")
    if first is None:
        return RequestResult(False, end, error="no text in the response")
    tokens = int(usage.get("completion_tokens") or chunks) if usage else chunks
    prompt_tokens = usage.get("prompt_tokens") if usage else None
    return RequestResult(True, end, first, first, last, tokens, prompt_tokens, chunks, engine_stats=engine_stats)


def run_level(base_url: str, *, model: Optional[str], concurrency: int, requests: int, max_tokens: int,
              prompt_tokens: int, ignore_eos: bool = True, thinking: Optional[bool] = None,
              request_timeout_s: float = 600.0, first_index: int = 0, headers: Optional[dict] = None) -> LevelResult:
    """``requests`` streaming requests by ``concurrency`` closed-loop workers."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    results: list[Optional[RequestResult]] = [None] * requests
    next_index = [0]
    lock = threading.Lock()
    timeout = httpx.Timeout(request_timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    with http_client(timeout=timeout, limits=limits, headers=headers or {}) as client:
        def worker():
            while True:
                with lock:
                    index = next_index[0]
                    if index >= requests:
                        return
                    next_index[0] += 1
                body = chat_body(model, prompt_text(prompt_tokens, first_index + index), max_tokens,
                                 ignore_eos=ignore_eos, thinking=thinking)
                sent = time.perf_counter() - started
                result = stream_one(client, url, body)
                result.index, result.sent_s = first_index + index, sent
                results[index] = result

        threads = [threading.Thread(target=worker, name=f"bench-{i}", daemon=True) for i in range(concurrency)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    return LevelResult(concurrency, requests, [r for r in results if r is not None], wall,
                       max_tokens if ignore_eos else None, prompt_tokens_asked=prompt_tokens)


MAX_IN_FLIGHT = 512  # open loop: arrivals beyond this wait for a free slot (and count as late)


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """``count`` send times (seconds from the start) of a Poisson process of ``rate`` per second: the gaps
    are exponential with mean 1 / rate. Seeded, so two runs send on the same schedule."""
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(count):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def run_rate_level(base_url: str, *, model: Optional[str], rate: float, requests: int, max_tokens: int,
                   prompt_tokens: int, ignore_eos: bool = True, thinking: Optional[bool] = None,
                   request_timeout_s: float = 600.0, first_index: int = 0, seed: int = 0,
                   headers: Optional[dict] = None) -> LevelResult:
    """Open loop: requests are sent at Poisson arrival times whatever the server's pace (a closed loop
    slows its senders down with the server and hides queueing)."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    schedule = poisson_arrivals(rate, requests, seed)
    results: list[Optional[RequestResult]] = [None] * requests
    slots = threading.Semaphore(MAX_IN_FLIGHT)
    in_flight = [0, 0]  # now, most
    lock = threading.Lock()
    timeout = httpx.Timeout(request_timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=64)

    with http_client(timeout=timeout, limits=limits, headers=headers or {}) as client:
        def one(index: int) -> None:
            try:
                body = chat_body(model, prompt_text(prompt_tokens, first_index + index), max_tokens,
                                 ignore_eos=ignore_eos, thinking=thinking)
                with lock:
                    in_flight[0] += 1
                    in_flight[1] = max(in_flight[1], in_flight[0])
                sent = time.perf_counter() - started
                result = stream_one(client, url, body)
                result.index, result.sent_s = first_index + index, sent
                results[index] = result
                with lock:
                    in_flight[0] -= 1
            finally:
                slots.release()

        threads = []
        started = time.perf_counter()
        for index, at in enumerate(schedule):
            delay = at - (time.perf_counter() - started)
            if delay > 0:
                time.sleep(delay)
            slots.acquire()
            thread = threading.Thread(target=one, args=(index,), name=f"bench-open-{index}", daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    return LevelResult(in_flight[1], requests, [r for r in results if r is not None], wall,
                       max_tokens if ignore_eos else None, kind="rate", rate=rate, prompt_tokens_asked=prompt_tokens)


def scrape_metrics(base_url: str, headers: Optional[dict] = None, timeout_s: float = 10.0):
    """The engine's /metrics as samples (sparkctl.commands.engine_metrics), or None when it has none."""
    try:
        response = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers or {}, timeout=timeout_s, verify=tls_context())
        if response.status_code != 200:
            return None
        return parse_exposition(response.text)
    except (httpx.HTTPError, ValueError):
        return None


def engine_delta(before, after, seconds: float) -> Optional[dict]:
    """What the engine's counters say about an interval: mean accepted length of speculative decoding
    (DSpark), prefix-cache hit rate, tokens/s, preemptions."""
    if before is None or after is None:
        return None
    engine = detect_engine(after)
    if engine is None:
        return None
    s = summary(engine, after, before, seconds)
    preempted = delta(before, after, metric_names(engine)["preemptions"])
    return {"engine": engine, "spec_accept_length": s["spec_accept_length"],
            "prefix_cache_hit_rate": s["prefix_cache_hit_rate"], "prompt_tokens_per_s": s["prompt_tokens_per_s"],
            "generation_tokens_per_s": s["generation_tokens_per_s"], "preemptions": preempted}


# ---------------------------------------------------------------------------------------------
# The whole benchmark


@dataclass
class BenchSettings:
    concurrency: list[int]
    requests: Optional[int]  # per level; None: 2 x C (at least 4)
    max_tokens: int = 128
    prompt_tokens: int = 256
    warmup: int = 1
    ignore_eos: bool = True
    thinking: Optional[bool] = None
    request_timeout_s: float = 600.0
    rates: list[float] = field(default_factory=list)  # open-loop levels, requests/s
    rate_requests: int = 20  # per open-loop level
    long_prompts: list[int] = field(default_factory=list)  # prompt tokens of the long-prompt levels
    long_requests: int = 2  # per long-prompt level, one at a time
    seed: int = 0

    def requests_for(self, concurrency: int) -> int:
        wanted = self.requests if self.requests is not None else max(4, 2 * concurrency)
        return max(wanted, concurrency)

    def to_json(self) -> dict:
        return {"concurrency": self.concurrency, "requests": self.requests, "max_tokens": self.max_tokens,
                "prompt_tokens": self.prompt_tokens, "warmup": self.warmup, "ignore_eos": self.ignore_eos,
                "thinking": self.thinking, "request_timeout_s": self.request_timeout_s, "rates": self.rates,
                "rate_requests": self.rate_requests, "long_prompts": self.long_prompts,
                "long_requests": self.long_requests, "seed": self.seed}


def parse_concurrency(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_CONCURRENCY:
            raise ConfigError(f"{part!r} is not a concurrency between 1 and {MAX_CONCURRENCY}", field="--concurrency")
        values.append(int(part))
    if len(set(values)) != len(values):
        raise ConfigError("a concurrency is listed twice", field="--concurrency")
    return sorted(values)


MAX_RATE = 1000.0


def parse_rates(text: str) -> list[float]:
    values = []
    for part in text.split(","):
        try:
            rate = float(part.strip())
        except ValueError:
            rate = -1.0
        if not 0 < rate <= MAX_RATE:
            raise ConfigError(f"{part.strip()!r} is not a request rate above 0 and at most {MAX_RATE:g} per second",
                              field="--rate")
        values.append(rate)
    if len(set(values)) != len(values):
        raise ConfigError("a rate is listed twice", field="--rate")
    return sorted(values)


MAX_LONG_PROMPT = 4 * 1024 * 1024


def parse_prompt_lengths(text: str) -> list[int]:
    """``32k,128k,512k`` (k = 1024 tokens, m = 1024k) or plain numbers."""
    values = []
    for part in text.split(","):
        word = part.strip().lower()
        scale = {"k": 1024, "m": 1024 * 1024}.get(word[-1:], 1)
        digits = word[:-1] if scale > 1 else word
        if not digits.isdigit() or not 1 <= int(digits) * scale <= MAX_LONG_PROMPT:
            raise ConfigError(f"{part.strip()!r} is not a prompt length (tokens, e.g. 32k) of at most 4m",
                              field="--long-prompts")
        values.append(int(digits) * scale)
    if len(set(values)) != len(values):
        raise ConfigError("a prompt length is listed twice", field="--long-prompts")
    return sorted(values)


@dataclass
class BenchReport:
    endpoint: str
    model: Optional[str]
    settings: BenchSettings
    levels: list[LevelResult]
    slo: SloVerdict
    server: Optional[dict] = None
    profile: Optional[str] = None
    when: str = ""
    warmup_errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # levels not run, and why
    engine: Optional[dict] = None  # the engine's /metrics over the whole run (engine_delta)
    deployment: Optional[dict] = None  # profile, image tag and image ID from the deployment record
    version: str = ""

    @property
    def ok(self) -> bool:
        return all(not level.failed for level in self.levels)

    def to_json(self, with_requests: bool = False) -> dict:
        return {"ok": self.ok, "profile": self.profile, "endpoint": self.endpoint, "model": self.model, "when": self.when,
                "sparkctl_version": self.version, "settings": self.settings.to_json(), "server": self.server,
                "deployment": self.deployment,
                "levels": [level.to_json(with_requests) for level in self.levels], "slo": self.slo.to_json(),
                "engine": self.engine, "skipped": self.skipped, "warmup_errors": self.warmup_errors,
                "table": format_table(self.levels)}

    def human(self) -> str:
        parts = [f"benchmark of {self.endpoint} ({self.model or 'default model'}): {self.settings.prompt_tokens} prompt "
                 f"tokens, {self.settings.max_tokens} output tokens"
                 + (" (ignore_eos)" if self.settings.ignore_eos else "") + ", streaming"]
        if closed_loop(self.levels):
            parts += ["", format_table(self.levels), "", format_percentiles(self.levels), "", format_slo(self.slo)]
        for extra in (format_rate_table(self.levels), format_long_table(self.levels),
                      format_engine(self.levels, self.engine)):
            if extra:
                parts += ["", extra]
        engine = [(level.label, level._engine_stats_json().get("engine_stats")) for level in self.levels]
        if any(stats for _, stats in engine):
            config = (self.server or {}).get("engine_config") or {}
            parts += ["", "engine (x_engine_stats): "
                      + ", ".join(f"{k} {config[k]}" for k in ("expert_format", "arena_gb", "arena_slots",
                                                              "resident_experts_pct", "max_seq", "spec") if k in config)]
            parts += [f"  {label}: hit rate {s['hit_rate_mean']}, NVMe {s['nvme_gb_total']} GB" for label, s in engine if s]
        for note in self.skipped:
            parts.append(f"skipped: {note}")
        return "\n".join(parts)


def _version() -> str:
    try:
        return version("sparkctl")
    except PackageNotFoundError:
        return "unknown"


def run_bench(endpoint: str, model: Optional[str], settings: BenchSettings, *, slo_ttft_ms: float, slo_tps: float,
              reporter: Optional[Reporter] = None, profile: Optional[str] = None,
              api_key: Optional[str] = None, deployment: Optional[dict] = None) -> BenchReport:
    """Every level measured, each told to ``reporter`` as a step (None: recorded only, a quiet run):
    started with its size, done ``ok`` or ``failed`` (a request failed) with its figures, or ``skipped``."""
    reporter = reporter if reporter is not None else Reporter()
    headers = auth_headers(api_key)
    server = _served(endpoint, model, api_key)
    model = model or (server["models"][0] if server["models"] else None)
    report = BenchReport(endpoint, model, settings, [], SloVerdict(slo_ttft_ms, slo_tps, 0), server, profile,
                         datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), deployment=deployment,
                         version=_version())
    common = dict(model=model, ignore_eos=settings.ignore_eos, thinking=settings.thinking,
                  request_timeout_s=settings.request_timeout_s, headers=headers)
    if settings.warmup:
        reporter.note(f"warm-up: {settings.warmup} request(s)")
        warm = run_level(endpoint, concurrency=1, requests=settings.warmup, max_tokens=min(16, settings.max_tokens),
                         prompt_tokens=settings.prompt_tokens, first_index=10**6, **common)
        report.warmup_errors = [r.error for r in warm.failed]
    meter = _Meter(endpoint, headers, report, reporter)
    _run_levels(endpoint, settings, server["max_model_len"], common, meter)
    report.engine = engine_delta(meter.first_scrape, meter.previous, time.perf_counter() - meter.started)
    report.slo = slo_capacity(report.levels, slo_ttft_ms, slo_tps)
    return report


def _served(endpoint: str, model: Optional[str], api_key: Optional[str]) -> dict:
    """What the endpoint serves (models, context, engine config); refused when it does not answer."""
    probe = probe_endpoint(endpoint, model, timeout_s=10, api_key=api_key)
    if not probe.ok:
        hint = "" if "401" in probe.detail else "; start it with `sparkctl serve`"  # a key refused: it does serve
        raise OperationFailed(f"{endpoint} is not serving {model or 'a model'} to this client ({probe.stage}: {probe.detail}){hint}")
    engine_config = (probe.health or {}).get("engine_config")
    context = probe.max_model_len or (engine_config or {}).get("max_model_len")  # the served context, in tokens
    return {"models": probe.models, "max_model_len": context, "engine_config": engine_config}


class _Meter:
    """Each level's engine metrics, from a scrape of /metrics before and after it; the report's levels,
    each told to the reporter as a step of the run."""

    def __init__(self, endpoint: str, headers: dict, report: BenchReport, reporter: Reporter):
        self.endpoint, self.headers, self.report, self.reporter = endpoint, headers, report, reporter
        self.started = time.perf_counter()
        self.first_scrape = self.previous = scrape_metrics(endpoint, headers)

    def start(self, label: str, what: str) -> None:
        self.reporter.started(label, reason=what)

    def measured(self, level: LevelResult) -> None:
        after = scrape_metrics(self.endpoint, self.headers)
        level.engine = engine_delta(self.previous, after, level.wall_s)
        self.previous = after
        self.report.levels.append(level)
        ttft, tps = level.mean("ttft_ms"), level.mean("tps")
        # the level's time goes in ``seconds`` only: the terminal line draws it after the reason
        self.reporter.done(level.label, "failed" if level.failed else "ok",
                           f"TTFT {_cell(ttft)} ms, TPS {_cell(tps)} tok/s, {len(level.completed)}/{level.requests} ok",
                           seconds=level.wall_s)

    def skipped(self, label: str, why: str) -> None:
        self.report.skipped.append(f"{label}: {why}")
        self.reporter.done(label, "skipped", why)


def _run_levels(endpoint: str, settings: BenchSettings, context: Optional[int], common: dict, meter: _Meter) -> None:
    """The concurrency levels, then the Poisson rates, then the long prompts (those beyond the context skipped)."""
    index = 0
    for concurrency in settings.concurrency:
        n = settings.requests_for(concurrency)
        meter.start(f"C={concurrency}", f"{n} requests")
        meter.measured(run_level(endpoint, concurrency=concurrency, requests=n, max_tokens=settings.max_tokens,
                                 prompt_tokens=settings.prompt_tokens, first_index=index, **common))
        index += n
    for rate in settings.rates:
        meter.start(f"rate={rate:g}/s", f"{settings.rate_requests} requests, Poisson arrivals")
        meter.measured(run_rate_level(endpoint, rate=rate, requests=settings.rate_requests, max_tokens=settings.max_tokens,
                                      prompt_tokens=settings.prompt_tokens, first_index=index, seed=settings.seed, **common))
        index += settings.rate_requests
    for length in settings.long_prompts:
        if context is not None and length + settings.max_tokens > context:
            meter.skipped(f"prompt={length}", f"{length} + {settings.max_tokens} output tokens exceed the "
                                              f"served context ({context} tokens)")
            continue
        meter.start(f"prompt={length}", f"{settings.long_requests} request(s), one at a time")
        level = run_level(endpoint, concurrency=1, requests=settings.long_requests, max_tokens=settings.max_tokens,
                          prompt_tokens=length, first_index=index, **common)
        level.kind = "long_prompt"
        meter.measured(level)
        index += settings.long_requests


def find_target(inventory, profile, *, pool) -> tuple[str, Optional[str], Optional[dict]]:
    """The deployed endpoint and model of ``profile`` and what was deployed (profile, image tag, the head's
    running image ID): the head's deployment record, else the profile's port on the inventory's head."""
    if getattr(profile, "replicas", 1) > 1:  # the router on the first replica's head: what applications use
        return replicated_target(inventory, profile)
    # Here, not at the top: status brings the SSH library, which `bench --endpoint URL` never needs.
    from sparkctl.ops.status import find_deployment, gather_states

    states = gather_states(inventory, inventory.hosts, profile.name, pool=pool, images=False)
    deployment = find_deployment(states, profile.serving.port, profile.serving.served_model_name)
    if deployment is not None and deployment.endpoint:
        head = next((s for s in states if s.name == deployment.head), None)
        record = deployment.record or {}
        about = {"profile": record.get("profile", profile.name), "image": record.get("image"),
                 "image_id": head.container.image_id if head and head.container else None,
                 "hosts": deployment.hosts, "deployed_at": record.get("when"), "deployed_by": record.get("who")}
        return deployment.endpoint, deployment.served_model_name or profile.serving.served_model_name, about
    head = inventory.head
    return f"http://{url_host(head.address)}:{profile.serving.port}", profile.serving.served_model_name, None


def replicated_target(inventory, profile) -> tuple[str, Optional[str], Optional[dict]]:
    """``find_target`` of a profile with ``replicas: N``: the router's endpoint, every replica's hosts."""
    replicas, _ = split_replicas(profile, inventory.hosts)
    head = next(h for h in inventory.hosts if h.name == replicas[0].head)
    about = {"profile": profile.name, "image": profile.image.tag, "image_id": None, "router": True,
             "hosts": [name for r in replicas for name in r.hosts], "replicas": [list(r.hosts) for r in replicas]}
    return R.endpoint(head.address, profile.router.port), profile.serving.served_model_name, about
