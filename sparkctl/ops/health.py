"""Is the endpoint serving? One probe (``probe_endpoint``) and the wait with backoff (``wait_healthy``).

A served model is healthy when ``GET /health`` answers 200 *and* ``GET /v1/models`` lists the
served model name: vLLM answers /health as soon as its API server is up, and the model list is
what a client will actually use (the TP4 vLLM report App. C). With an API key (``serving.api_key_env``) the
model list is asked with ``Authorization: Bearer``: vLLM guards ``/v1/*``, never ``/health``. ``/health``'s JSON body, when there is one (the
stand-in and the single-box engine carry ``engine_config``), is kept for the report.

The wait backs off from ``initial_s`` by ``factor`` up to ``max_interval_s`` between attempts, so
a 20-minute load (the single-box engine's README: a server not answering at minute 5 is normal) costs a few hundred
requests, and every ``alive_every_s`` (and once more at the timeout) it asks ``check_alive`` whether
the engine still runs as it was started: an engine that died or restarted at start fails the wait at
once instead of after the whole timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from sparkctl.config.apikey import auth_headers
from sparkctl.httpclient import client as http_client, httpx


@dataclass
class Probe:
    ok: bool
    stage: str  # "health" (waiting for /health), "models" (waiting for the model list), "ready"
    detail: str  # why not ready, in one line
    health: Optional[dict] = None
    models: list[str] = field(default_factory=list)
    max_model_len: Optional[int] = None

    def to_json(self) -> dict:
        return {"ok": self.ok, "stage": self.stage, "detail": self.detail, "health": self.health,
                "models": self.models, "max_model_len": self.max_model_len}


def _short_error(err: Exception) -> str:
    if isinstance(err, httpx.ConnectError):
        text = str(err) or "connection failed"
        return "connection refused" if "refused" in text.lower() else text
    if isinstance(err, httpx.TimeoutException):
        return "timed out"
    return " ".join(str(err).split()) or type(err).__name__


def probe_endpoint(base_url: str, served_model_name: str | None, *, client=None, timeout_s: float = 5.0,
                   api_key: str | None = None) -> Probe:
    """One look at ``/health`` then ``/v1/models`` (no retries), with the API key when there is one."""
    own = client is None
    client = client or http_client(timeout=timeout_s)
    headers = auth_headers(api_key)
    try:
        try:
            response = client.get(base_url + "/health")
        except httpx.HTTPError as err:
            return Probe(False, "health", _short_error(err))
        if response.status_code != 200:
            return Probe(False, "health", f"/health answered {response.status_code}")
        try:
            health = response.json() if response.content.strip() else None
        except ValueError:
            health = None
        try:
            models_response = client.get(base_url + "/v1/models", headers=headers)
        except httpx.HTTPError as err:
            return Probe(False, "models", _short_error(err), health)
        if models_response.status_code == 401:
            why = "the API key was refused" if api_key else "the endpoint wants an API key (the profile's serving.api_key_env, or --api-key-env)"
            return Probe(False, "models", f"/v1/models answered 401: {why}", health)
        if models_response.status_code != 200:
            return Probe(False, "models", f"/v1/models answered {models_response.status_code}", health)
        try:
            data = models_response.json().get("data") or []
        except (ValueError, AttributeError):
            return Probe(False, "models", "/v1/models did not answer a model list", health)
        ids = [str(m.get("id")) for m in data if isinstance(m, dict)]
        # no name asked: the first model listed, the one a client (bench) then uses; vLLM's and SGLang's
        # /health have no body, so /v1/models is the only place the served context is told
        wanted = served_model_name if served_model_name else (ids[0] if ids else None)
        lengths = [m.get("max_model_len") for m in data if isinstance(m, dict) and str(m.get("id")) == wanted]
        if served_model_name and served_model_name not in ids:
            return Probe(False, "models", f"/v1/models lists {ids or 'nothing'}, not {served_model_name!r}", health, ids)
        return Probe(True, "ready", "ok", health, ids, lengths[0] if lengths else None)
    finally:
        if own:
            client.close()


@dataclass
class WaitResult:
    ok: bool
    seconds: float
    attempts: int
    probe: Probe
    stopped_by: Optional[str] = None  # check_alive's reason when a container died


def backoff_intervals(initial_s: float = 0.5, factor: float = 1.5, max_interval_s: float = 5.0):
    interval = initial_s
    while True:
        yield interval
        interval = min(max_interval_s, interval * factor)


def wait_healthy(
    base_url: str,
    served_model_name: str | None,
    *,
    timeout_s: float,
    check_alive: Optional[Callable[[], Optional[str]]] = None,
    alive_every_s: float = 5.0,
    first_alive_s: float = 2.0,
    on_attempt: Optional[Callable[[float, Probe], None]] = None,
    initial_s: float = 0.5,
    factor: float = 1.5,
    max_interval_s: float = 5.0,
    request_timeout_s: float = 5.0,
    api_key: str | None = None,
) -> WaitResult:
    """Poll until healthy, ``timeout_s`` passes, or ``check_alive`` returns a reason to stop."""
    started = time.monotonic()
    deadline = started + timeout_s
    next_alive = started + min(first_alive_s, alive_every_s)
    attempts = 0
    intervals = backoff_intervals(initial_s, factor, max_interval_s)
    with http_client(timeout=min(request_timeout_s, max(0.5, timeout_s))) as client:
        while True:
            attempts += 1
            probe = probe_endpoint(base_url, served_model_name, client=client, api_key=api_key)
            now = time.monotonic()
            if on_attempt is not None:
                on_attempt(now - started, probe)
            if probe.ok:
                return WaitResult(True, now - started, attempts, probe)
            # At the deadline too: a rank that failed (or restarted) is why it timed out, not a slow start.
            if check_alive is not None and (now >= next_alive or now >= deadline):
                reason = check_alive()
                next_alive = time.monotonic() + alive_every_s
                if reason:
                    return WaitResult(False, time.monotonic() - started, attempts, probe, stopped_by=reason)
            if now >= deadline:
                return WaitResult(False, now - started, attempts, probe)
            time.sleep(max(0.0, min(next(intervals), deadline - now)))
