"""Closed-loop load through an endpoint for as long as a block runs: N clients, each sending one
streamed-off chat request after another, every outcome kept (for the router tests and bench/).

    with Load(endpoint, model, concurrency=4) as load:
        ...  # a rolling upgrade, a killed replica
    load.failed, load.ok, load.worst_s, load.tokens_per_s
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Outcome:
    started: float
    seconds: float
    ok: bool
    tokens: int = 0
    error: str = ""
    client: int = 0


@dataclass
class Load:
    endpoint: str
    model: str
    concurrency: int = 4
    max_tokens: int = 32
    api_key: str | None = None
    timeout_s: float = 120.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.began = self.ended = 0.0

    def _client(self, index: int) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {"model": self.model, "max_tokens": self.max_tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"client {index}: count slowly"}]}
        with httpx.Client(timeout=self.timeout_s, headers=headers) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    response = client.post(self.endpoint + "/v1/chat/completions", json=body)
                    ok = response.status_code == 200
                    tokens = response.json().get("usage", {}).get("completion_tokens", 0) if ok else 0
                    error = "" if ok else f"{response.status_code} {response.text[:120]}"
                except httpx.HTTPError as err:
                    ok, tokens, error = False, 0, f"{type(err).__name__}: {err}"
                with self._lock:
                    self.outcomes.append(Outcome(started, time.monotonic() - started, ok, tokens, error, index))

    def __enter__(self) -> "Load":
        self.began = time.monotonic()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.concurrency)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s + 5)
        self.ended = time.monotonic()

    def run_for(self, seconds: float) -> "Load":
        with self:
            time.sleep(seconds)
        return self

    @property
    def ok(self) -> int:
        return sum(1 for o in self.outcomes if o.ok)

    @property
    def failed(self) -> int:
        return sum(1 for o in self.outcomes if not o.ok)

    @property
    def worst_s(self) -> float:
        return max((o.seconds for o in self.outcomes if o.ok), default=0.0)

    @property
    def tokens_per_s(self) -> float:
        """Aggregate output rate: per client, its tokens over the time to its last finished request
        (a request cut off by the end of the block would otherwise count its time, not its tokens)."""
        total = 0.0
        for client in range(self.concurrency):
            mine = [o for o in self.outcomes if o.client == client and o.ok]
            if mine:
                span = max(o.started + o.seconds for o in mine) - self.began
                total += sum(o.tokens for o in mine) / span if span > 0 else 0.0
        return total

    def errors(self, limit: int = 5) -> list[str]:
        return [o.error for o in self.outcomes if not o.ok][:limit]

    def summary(self) -> dict:
        return {"requests": len(self.outcomes), "ok": self.ok, "failed": self.failed,
                "worst_latency_s": round(self.worst_s, 3), "tokens_per_s": round(self.tokens_per_s, 2),
                "errors": self.errors()}
