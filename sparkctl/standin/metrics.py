"""``/metrics``: Prometheus text under the real engines' metric names, with values that move.

The names are those vLLM 0.33.0 and SGLang 0.5.23 export (the engines' metric name lists), in
the exposition form of ``prometheus_client``: a counter ``vllm:prompt_tokens`` appears as
``vllm:prompt_tokens_total``, a histogram as ``_bucket``/``_sum``/``_count``. What moves:

* requests running / waiting (the scheduler), finished requests by reason, prompt and generation
  token counters, TTFT / inter-token / queue / prefill / decode / end-to-end histograms;
* KV cache usage: the tokens of the running requests (prompt + generated so far) over a capacity
  of ``max_model_len x min(max_num_seqs, 8)`` tokens, a GB10's KV pool being a few contexts deep;
* prefix cache: prompts are cut into 16-token blocks with chained hashes, a block seen before
  (bounded LRU) is a hit, as in vLLM's automatic prefix caching;
* speculative decoding (when the server was started with it): after the prefill's token every
  verify step drafts ``k`` tokens and accepts a deterministic, prompt-dependent run of them (about
  60 % per position), emitting 1 + that run, so for each finished sequence generated tokens =
  1 + steps + accepted, and ``1 + accepted / drafts`` is a mean accepted length near 2.5 for k=5.
  (The simulated clock still spends one decode step per token.)
  vLLM exports ``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens`` and
  ``_num_accepted_tokens_per_pos`` (SpecDecodingProm); SGLang its ``sglang:spec_accept_length``
  and ``sglang:spec_accept_rate`` gauges and ``sglang:spec_verify_calls_total``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

BLOCK_TOKENS = 16
PREFIX_BLOCKS_KEPT = 200_000
TIME_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000,
                 500000, 1000000)
# The three totals vLLM's spec-decode logger divides (mean acceptance length = 1 + accepted / drafts).
VLLM_SPEC_DECODE_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                             "vllm:spec_decode_num_accepted_tokens")


class Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> List[str]:
        out = [f"# TYPE {name} histogram"]
        for bound, count in zip(self.buckets, self.counts):
            out.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(count)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        return out


def block_hashes(tokens: Sequence[str]) -> List[bytes]:
    """Chained hashes of the full 16-token blocks of a prompt (a block's hash depends on all before it)."""
    hashes, parent = [], b""
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        parent = hashlib.blake2b(parent + "\x00".join(tokens[start:start + BLOCK_TOKENS]).encode(), digest_size=16).digest()
        hashes.append(parent)
    return hashes


def accepted_run(seed: int, step: int, k: int) -> int:
    """How many of ``k`` drafted tokens one verify step accepts (deterministic, ~60 % per position)."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    accepted = 0
    for position in range(k):
        if digest[position % 8] >= 102:  # 154/256 ~ 0.6
            accepted += 1
        else:
            break
    return accepted


class Metrics:
    def __init__(self, engine: str, model_name: str, max_model_len: int, max_num_seqs: int,
                 spec_tokens: int = 0):
        self.engine = engine
        self.model_name = model_name
        self.spec_tokens = spec_tokens
        self.kv_capacity = max(1, max_model_len * max(1, min(max_num_seqs, 8)))
        self._lock = threading.Lock()
        self._prefix: "OrderedDict[bytes, None]" = OrderedDict()
        self.kv_tokens = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.finished: Dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.requests_total = 0
        self.preemptions = 0
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_pos = [0] * spec_tokens
        self.h = {name: Histogram(TIME_BUCKETS) for name in
                  ("ttft", "itl", "queue", "prefill", "decode", "e2e", "inference", "tpot")}
        self.h_prompt = Histogram(TOKEN_BUCKETS)
        self.h_generation = Histogram(TOKEN_BUCKETS)
        self.h_max_tokens = Histogram(TOKEN_BUCKETS)
        self.h_n = Histogram((1, 2, 5, 10, 20))
        self._last_gen_time: Optional[float] = None
        self.gen_throughput = 0.0

    # -- events -----------------------------------------------------------------------------------

    def prompt_seen(self, tokens: Sequence[str]) -> int:
        """Prefix cache lookup and insert; returns the prompt tokens found cached."""
        hashes = block_hashes(tokens)
        with self._lock:
            hit = 0
            for digest in hashes:
                if digest not in self._prefix:
                    break
                hit += 1
                self._prefix.move_to_end(digest)
            for digest in hashes[hit:]:
                self._prefix[digest] = None
            while len(self._prefix) > PREFIX_BLOCKS_KEPT:
                self._prefix.popitem(last=False)
            self.prefix_queries += len(tokens)
            self.prefix_hits += hit * BLOCK_TOKENS
            self.cached_tokens += hit * BLOCK_TOKENS
            return hit * BLOCK_TOKENS

    def kv(self, delta: int) -> None:
        with self._lock:
            self.kv_tokens = max(0, self.kv_tokens + delta)

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self.h[name].observe(seconds)

    def tokens_generated(self, count: int) -> None:
        with self._lock:
            self.generation_tokens += count

    def speculated(self, tokens: int, seed: int) -> None:
        """The verify steps behind one finished sequence of ``tokens`` tokens: the first token comes from
        the prefill, then every step drafts k and emits 1 + the accepted run, so generated tokens =
        1 + steps + accepted, exactly, as the engines' counters relate."""
        if not self.spec_tokens or tokens < 2:
            return
        with self._lock:
            left, step = tokens - 1, 0
            while left > 0:
                accepted = min(accepted_run(seed, step, self.spec_tokens), left - 1)
                self.drafts += 1
                self.draft_tokens += self.spec_tokens
                self.accepted_tokens += accepted
                for position in range(accepted):
                    self.accepted_per_pos[position] += 1
                left -= 1 + accepted
                step += 1

    def request_done(self, *, prompt_tokens: int, generated: int, finish: str, n: int,
                     max_tokens: Optional[int], e2e_s: float, throughput: float) -> None:
        with self._lock:
            self.requests_total += 1
            self.prompt_tokens += prompt_tokens
            self.finished[finish] = self.finished.get(finish, 0) + 1
            self.h_prompt.observe(prompt_tokens)
            self.h_generation.observe(generated)
            self.h_n.observe(n)
            if max_tokens is not None:
                self.h_max_tokens.observe(max_tokens)
            self.h["e2e"].observe(e2e_s)
            if throughput > 0:
                self.gen_throughput = throughput

    # -- exposition -------------------------------------------------------------------------------

    def text(self, running: int, waiting: int) -> str:
        with self._lock:
            return "\n".join(self._sglang(running, waiting) if self.engine == "sglang"
                             else self._vllm(running, waiting)) + "\n"

    def _vllm(self, running: int, waiting: int) -> List[str]:
        labels = f'model_name="{self.model_name}",engine="0"'
        out: List[str] = []

        def gauge(name, value):
            out.extend([f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)}"])

        def counter(name, value, extra=""):
            out.extend([f"# TYPE {name} counter", f"{name}_total{{{labels}{extra}}} {float(value)}"])

        gauge("vllm:num_requests_running", running)
        gauge("vllm:num_requests_waiting", waiting)
        gauge("vllm:kv_cache_usage_perc", min(1.0, self.kv_tokens / self.kv_capacity))
        gauge("vllm:engine_sleep_state", 0)
        counter("vllm:prefix_cache_queries", self.prefix_queries)
        counter("vllm:prefix_cache_hits", self.prefix_hits)
        counter("vllm:num_preemptions", self.preemptions)
        counter("vllm:prompt_tokens", self.prompt_tokens)
        counter("vllm:prompt_tokens_cached", self.cached_tokens)
        counter("vllm:generation_tokens", self.generation_tokens)
        out.append("# TYPE vllm:request_success counter")
        for reason in ("stop", "length", "abort"):
            out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} '
                       f"{float(self.finished.get(reason, 0))}")
        if self.spec_tokens:
            counter("vllm:spec_decode_num_drafts", self.drafts)
            counter("vllm:spec_decode_num_draft_tokens", self.draft_tokens)
            counter("vllm:spec_decode_num_accepted_tokens", self.accepted_tokens)
            out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
            for position, count in enumerate(self.accepted_per_pos):
                out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{position}"}} '
                           f"{float(count)}")
        for name, key in (("vllm:time_to_first_token_seconds", "ttft"), ("vllm:inter_token_latency_seconds", "itl"),
                          ("vllm:request_time_per_output_token_seconds", "tpot"),
                          ("vllm:request_queue_time_seconds", "queue"), ("vllm:request_prefill_time_seconds", "prefill"),
                          ("vllm:request_decode_time_seconds", "decode"),
                          ("vllm:request_inference_time_seconds", "inference")):
            out.extend(self.h[key].lines(name, labels))
        out.extend(self.h_prompt.lines("vllm:request_prompt_tokens", labels))
        out.extend(self.h_generation.lines("vllm:request_generation_tokens", labels))
        out.extend(self.h_max_tokens.lines("vllm:request_params_max_tokens", labels))
        out.extend(self.h_n.lines("vllm:request_params_n", labels))
        return out

    def _sglang(self, running: int, waiting: int) -> List[str]:
        labels = f'model_name="{self.model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
        out: List[str] = []

        def gauge(name, value):
            out.extend([f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)}"])

        def counter(name, value):  # SGLang's counter names already end in _total
            out.extend([f"# TYPE {name[:-6]} counter", f"{name}{{{labels}}} {float(value)}"])

        usage = min(1.0, self.kv_tokens / self.kv_capacity)
        gauge("sglang:num_running_reqs", running)
        gauge("sglang:num_queue_reqs", waiting)
        gauge("sglang:num_used_tokens", self.kv_tokens)
        gauge("sglang:max_total_num_tokens", self.kv_capacity)
        gauge("sglang:token_usage", usage)
        gauge("sglang:full_token_usage", usage)
        gauge("sglang:gen_throughput", self.gen_throughput)
        gauge("sglang:cache_hit_rate", self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0)
        counter("sglang:prompt_tokens_total", self.prompt_tokens)
        counter("sglang:generation_tokens_total", self.generation_tokens)
        counter("sglang:cached_tokens_total", self.cached_tokens)
        counter("sglang:num_requests_total", self.requests_total)
        counter("sglang:num_aborted_requests_total", self.finished.get("abort", 0))
        if self.spec_tokens:
            gauge("sglang:spec_accept_length", 1 + self.accepted_tokens / self.drafts if self.drafts else 0.0)
            gauge("sglang:spec_accept_rate", self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0)
            counter("sglang:spec_verify_calls_total", self.drafts)
        for name, key in (("sglang:time_to_first_token_seconds", "ttft"), ("sglang:inter_token_latency_seconds", "itl"),
                          ("sglang:request_time_per_output_token_seconds", "tpot"),
                          ("sglang:queue_time_seconds", "queue")):
            out.extend(self.h[key].lines(name, labels))
        out.extend(self.h_prompt.lines("sglang:prompt_tokens_histogram", labels))
        out.extend(self.h_generation.lines("sglang:generation_tokens_histogram", labels))
        return out
