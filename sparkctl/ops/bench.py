"""``sparkctl bench``: a streaming OpenAI client against the head's endpoint, the seeds' table, the SLO capacity.

Per concurrency level C, ``requests`` chat completions are sent by C closed-loop workers (each
sends its next request when the previous one ends), every one streaming (``stream: true``,
``stream_options.include_usage``) with ``max_tokens`` and, by default, ``ignore_eos`` so every
request produces exactly ``max_tokens`` tokens (seed 003's rule: a tok/s figure is only comparable
at a fixed output length; a request that comes back shorter is counted as ``short``). Each prompt
is ``prompt_tokens`` words that differ per request, so a prefix cache cannot serve one from another.

Per request, with t0 when the request is sent:

* **TTFT**: t0 to the first chunk carrying text (``content`` or ``reasoning_content``);
* **ITL**: (last text chunk - first text chunk) / (output tokens - 1): time per output token after
  the first, so a chunk carrying several speculative (DSpark) tokens is not one long gap;
* **latency**: t0 to the end of the stream (``data: [DONE]``);
* **TPS**: output tokens / latency, per stream (the seeds' "TPS": 000 §6.1 has TPS x latency ≈ the
  same ~130 tokens at every C, so it is per request, end to end, not the aggregate);
* **RPS**: 1 / latency, per stream, as the seeds' "Throughput (RPS)" column (0.23 = 1/4.39 s);
  the level's aggregate, completed requests / wall time, is reported beside it.

Output tokens are the server's ``usage.completion_tokens`` (else the number of text chunks).
Statistics: mean, p50, p90 (linear interpolation), min, max. The SLO capacity is the largest C such
that it and every smaller tested level meet ``slo.ttft_ms`` and ``slo.tokens_per_s`` on the mean
(seed 000 §8: "Max C = 2 at TTFT ≤ 1000 ms, TPS ≥ 20").
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

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
    concurrency: int
    requests: int
    results: list[RequestResult]
    wall_s: float
    expected_tokens: Optional[int] = None  # max_tokens when ignore_eos: every request should produce exactly this

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok]

    def stat(self, name: str) -> Optional[dict]:
        ok = self.completed
        scale = {"ttft_ms": 1000.0, "itl_ms": 1000.0}.get(name, 1.0)
        source = {"ttft_ms": "ttft_s", "itl_ms": "itl_s", "latency_s": "latency_s", "tps": "tps", "rps": "rps",
                  "output_tokens": "output_tokens", "prompt_tokens": "prompt_tokens"}[name]
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

    def to_json(self) -> dict:
        errors: dict[str, int] = {}
        for r in self.failed:
            errors[r.error or "error"] = errors.get(r.error or "error", 0) + 1
        return {
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
               ("ttft_ms", "itl_ms", "tps", "latency_s", "rps", "output_tokens", "prompt_tokens")},
            **self._engine_stats_json(),
        }

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
    for level in sorted(levels, key=lambda lv: lv.concurrency):
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


def _cell(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _aligned(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows)


TABLE_HEADER = ["Concurrency", "TTFT (ms)", "ITL (ms)", "TPS (tok/s)", "Latency (s)", "Throughput (RPS)"]


def format_table(levels: list[LevelResult], statistic: str = "mean") -> str:
    """The seeds' benchmark table (000 §6.1, 001 §7): one row per concurrency, ``statistic`` of each column."""
    rows = [TABLE_HEADER]
    for level in levels:
        def v(name):
            s = level.stat(name)
            return None if s is None else s[statistic]
        rows.append([str(level.concurrency), _cell(v("ttft_ms")), _cell(v("itl_ms")), _cell(v("tps")),
                     _cell(v("latency_s")), _cell(v("rps"))])
    return _aligned(rows)


def format_percentiles(levels: list[LevelResult]) -> str:
    rows = [["Concurrency", "TTFT p50/p90 (ms)", "ITL p50/p90 (ms)", "TPS p50/p90", "Latency p50/p90 (s)",
             "Requests", "Aggregate RPS"]]
    for level in levels:
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
    import httpx

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
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
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
              request_timeout_s: float = 600.0, first_index: int = 0) -> LevelResult:
    """``requests`` streaming requests by ``concurrency`` closed-loop workers."""
    import httpx

    url = base_url.rstrip("/") + "/v1/chat/completions"
    results: list[Optional[RequestResult]] = [None] * requests
    next_index = [0]
    lock = threading.Lock()
    timeout = httpx.Timeout(request_timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    with httpx.Client(timeout=timeout, limits=limits) as client:
        def worker():
            while True:
                with lock:
                    index = next_index[0]
                    if index >= requests:
                        return
                    next_index[0] += 1
                body = chat_body(model, prompt_text(prompt_tokens, first_index + index), max_tokens,
                                 ignore_eos=ignore_eos, thinking=thinking)
                results[index] = stream_one(client, url, body)

        threads = [threading.Thread(target=worker, name=f"bench-{i}", daemon=True) for i in range(concurrency)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    return LevelResult(concurrency, requests, [r for r in results if r is not None], wall,
                       max_tokens if ignore_eos else None)


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

    def requests_for(self, concurrency: int) -> int:
        wanted = self.requests if self.requests is not None else max(4, 2 * concurrency)
        return max(wanted, concurrency)

    def to_json(self) -> dict:
        return {"concurrency": self.concurrency, "requests": self.requests, "max_tokens": self.max_tokens,
                "prompt_tokens": self.prompt_tokens, "warmup": self.warmup, "ignore_eos": self.ignore_eos,
                "thinking": self.thinking, "request_timeout_s": self.request_timeout_s}


def parse_concurrency(text: str) -> list[int]:
    from sparkctl.errors import ConfigError

    values = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_CONCURRENCY:
            raise ConfigError(f"{part!r} is not a concurrency between 1 and {MAX_CONCURRENCY}", field="--concurrency")
        values.append(int(part))
    if len(set(values)) != len(values):
        raise ConfigError("a concurrency is listed twice", field="--concurrency")
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

    @property
    def ok(self) -> bool:
        return all(not level.failed for level in self.levels)

    def to_json(self) -> dict:
        return {"ok": self.ok, "profile": self.profile, "endpoint": self.endpoint, "model": self.model, "when": self.when,
                "settings": self.settings.to_json(), "server": self.server,
                "levels": [level.to_json() for level in self.levels], "slo": self.slo.to_json(),
                "warmup_errors": self.warmup_errors,
                "table": format_table(self.levels)}

    def human(self) -> str:
        parts = [f"benchmark of {self.endpoint} ({self.model or 'default model'}): {self.settings.prompt_tokens} prompt "
                 f"tokens, {self.settings.max_tokens} output tokens"
                 + (" (ignore_eos)" if self.settings.ignore_eos else "") + ", streaming",
                 "", format_table(self.levels), "", format_percentiles(self.levels), "", format_slo(self.slo)]
        engine = [(level.concurrency, level._engine_stats_json().get("engine_stats")) for level in self.levels]
        if any(stats for _, stats in engine):
            config = (self.server or {}).get("engine_config") or {}
            parts += ["", "engine (x_engine_stats): "
                      + ", ".join(f"{k} {config[k]}" for k in ("expert_format", "arena_gb", "arena_slots",
                                                              "resident_experts_pct", "max_seq", "spec") if k in config)]
            parts += [f"  C={c}: hit rate {s['hit_rate_mean']}, NVMe {s['nvme_gb_total']} GB" for c, s in engine if s]
        return "\n".join(parts)


def run_bench(endpoint: str, model: Optional[str], settings: BenchSettings, *, slo_ttft_ms: float, slo_tps: float,
              say: Callable[[str], None] = lambda _: None, profile: Optional[str] = None) -> BenchReport:
    from datetime import datetime, timezone

    from sparkctl.ops.health import probe_endpoint

    probe = probe_endpoint(endpoint, model, timeout_s=10)
    if not probe.ok:
        from sparkctl.errors import OperationFailed

        raise OperationFailed(f"{endpoint} is not serving {model or 'a model'} ({probe.stage}: {probe.detail}); "
                              "start it with `sparkctl serve`")
    model = model or (probe.models[0] if probe.models else None)
    server = {"models": probe.models, "max_model_len": probe.max_model_len,
              "engine_config": (probe.health or {}).get("engine_config")}
    report = BenchReport(endpoint, model, settings, [], SloVerdict(slo_ttft_ms, slo_tps, 0), server, profile,
                         datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    if settings.warmup:
        say(f"warm-up: {settings.warmup} request(s)")
        warm = run_level(endpoint, model=model, concurrency=1, requests=settings.warmup, max_tokens=min(16, settings.max_tokens),
                         prompt_tokens=settings.prompt_tokens, ignore_eos=settings.ignore_eos, thinking=settings.thinking,
                         request_timeout_s=settings.request_timeout_s, first_index=10**6)
        report.warmup_errors = [r.error for r in warm.failed]
    index = 0
    for concurrency in settings.concurrency:
        n = settings.requests_for(concurrency)
        say(f"C={concurrency}: {n} requests")
        level = run_level(endpoint, model=model, concurrency=concurrency, requests=n, max_tokens=settings.max_tokens,
                          prompt_tokens=settings.prompt_tokens, ignore_eos=settings.ignore_eos, thinking=settings.thinking,
                          request_timeout_s=settings.request_timeout_s, first_index=index)
        index += n
        report.levels.append(level)
        ttft, tps = level.mean("ttft_ms"), level.mean("tps")
        say(f"C={concurrency}: TTFT {_cell(ttft)} ms, TPS {_cell(tps)} tok/s, {len(level.completed)}/{n} ok "
            f"in {level.wall_s:.1f} s")
    report.slo = slo_capacity(report.levels, slo_ttft_ms, slo_tps)
    return report


def find_endpoint(inventory, profile, *, pool) -> tuple[str, Optional[str]]:
    """The deployed endpoint and model of ``profile``: the head's deployment record, else the profile's port
    on the inventory's head."""
    from sparkctl.commands.serve import url_host
    from sparkctl.ops.status import find_deployment, gather_states

    states = gather_states(inventory, inventory.hosts, profile.name, pool=pool)
    deployment = find_deployment(states, profile.serving.port, profile.serving.served_model_name)
    if deployment is not None and deployment.endpoint:
        return deployment.endpoint, deployment.served_model_name or profile.serving.served_model_name
    head = inventory.head
    return f"http://{url_host(head.address)}:{profile.serving.port}", profile.serving.served_model_name
