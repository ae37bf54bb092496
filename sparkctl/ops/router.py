"""The router in front of the replicas: its container on the first replica's head, its workers.

What ``sglang_router`` 0.3.2 needs from a worker (read from its source and seen by running it
against a worker that logs every request):

* ``GET /health`` answering 200, asked without ``Authorization`` when the worker is added and
  then every ``--health-check-interval-secs``; 3 misses in a row take it out of rotation, 2
  answers put it back;
* ``GET /server_info`` (else ``/get_server_info``) and ``GET /model_info`` (else
  ``/get_model_info``), with ``Authorization: Bearer KEY``: ``served_model_name`` there is the
  model the router lists and routes by; a worker that answers neither (vLLM) is accepted but listed
  as model ``unknown`` unless it is added with a ``model_id`` (``POST /workers``, what sparkctl does);
* the OpenAI routes themselves: the router forwards ``/v1/chat/completions`` and
  ``/v1/completions`` with the client's ``Authorization`` header, after checking it against its
  own ``--api-key`` (401 otherwise; ``/health``, ``/v1/models`` and ``/metrics`` stay open).

This module is the runtime half: the router's state (``look_router``), its (re)start
(``start_router``) and its worker list (``RouterClient``, ``sync_workers``).
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field
from typing import Optional

from sparkctl.commands import router as R
from sparkctl.commands.serve import parse_containers, remove_argv, write_file_argv
from sparkctl.config.apikey import auth_headers
from sparkctl.httpclient import client as http_client, httpx
from sparkctl.ops.router_image import import_on_host
from sparkctl.ops.steps import STEP_TIMEOUT_S, check_result


class RouterError(RuntimeError):
    pass


class RouterClient:
    """The router's HTTP API: its health and its worker list (``/workers`` needs the API key)."""

    def __init__(self, endpoint: str, api_key: Optional[str], timeout_s: float = 10.0):
        self.endpoint, self.api_key = endpoint, api_key
        self.client = http_client(timeout=timeout_s, headers=auth_headers(api_key))

    def close(self) -> None:
        self.client.close()

    def healthy(self) -> bool:
        try:
            return self.client.get(self.endpoint + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def workers(self) -> list[dict]:
        response = self.client.get(self.endpoint + "/workers")
        if response.status_code != 200:
            raise RouterError(f"{self.endpoint}/workers answered {response.status_code}")
        return R.parse_workers(response.text)

    def add(self, url: str, model_id: str) -> None:
        # With a key the router asks the worker's /server_info with it (SGLang guards every path but /health).
        response = self.client.post(self.endpoint + "/workers", json=R.worker_body(url, model_id, self.api_key))
        if response.status_code not in (200, 201, 202):
            raise RouterError(f"the router refused worker {url}: {response.status_code} {response.text[:200]}")

    def remove(self, worker_id: str) -> None:
        response = self.client.delete(f"{self.endpoint}/workers/{worker_id}")
        if response.status_code not in (200, 202, 404):
            raise RouterError(f"the router did not remove worker {worker_id}: {response.status_code}")

    def wait_for(self, url: str, *, present: bool, healthy: bool = True, timeout_s: float = 120.0) -> dict | None:
        """Until ``url`` is listed (healthy) or gone; the worker entry (None when gone)."""
        deadline = time.monotonic() + timeout_s
        while True:
            entry = next((w for w in self.workers() if w["url"] == url), None)
            if (entry is None and not present) or (entry is not None and present and (entry["healthy"] or not healthy)):
                return entry
            if time.monotonic() > deadline:
                state = "still listed" if not present else ("listed, unhealthy" if entry else "not listed")
                raise RouterError(f"the router has not taken {url} {'in' if present else 'out'} within "
                                  f"{timeout_s:g} s ({state})")
            time.sleep(0.5)


def sync_workers(client: RouterClient, wanted: list[str], model_id: str, *, timeout_s: float = 120.0) -> list[str]:
    """Make the router's workers exactly ``wanted`` (replica endpoints); what it changed, in words."""
    listed = client.workers()
    changes = []
    for entry in listed:
        if entry["url"] not in wanted:
            client.remove(entry["id"])
            changes.append(f"removed {entry['url']}")
    have = {w["url"]: w for w in listed}
    for url in wanted:
        if url not in have or have[url]["model_id"] != model_id:
            if url in have:
                client.remove(have[url]["id"])
                client.wait_for(url, present=False, timeout_s=timeout_s)
            client.add(url, model_id)
            changes.append(f"added {url}")
    for url in wanted:
        client.wait_for(url, present=True, timeout_s=timeout_s)
    return changes


@dataclass
class RouterLook:
    """The router's container as it is, and whether it runs as the profile says."""

    container: Optional[object]  # commands.serve.Container
    wanted_argv: list[str]
    reasons: list[str] = field(default_factory=list)  # why it must be (re)started; empty: as wanted

    @property
    def as_wanted(self) -> bool:
        return not self.reasons


def look_router(conn, profile, api_key: Optional[str] = None) -> RouterLook:
    """The router container on ``conn``'s host against what the profile runs (image, options, key)."""
    result = conn.run(R.containers_argv(profile.name), timeout=STEP_TIMEOUT_S)
    check_result(result, "list the router container")
    found = [c for c in parse_containers(result.stdout) if c.name == profile.router.container]
    wanted = R.docker_run_argv(profile, "/")
    wanted_cmd = wanted[wanted.index("-c"):]
    look = RouterLook(found[0] if found else None, wanted)
    if not found:
        look.reasons.append("no router container")
        return look
    container = found[0]
    if not container.running:
        look.reasons.append(f"router container {container.describe()}")
    if container.image != R.router_image(profile):
        look.reasons.append(f"router runs {container.image}, the profile wants {R.router_image(profile)}")
    if container.cmd != wanted_cmd:
        look.reasons.append("router options changed")
    if container.env.get(R.KEY_VARIABLE, "") != (api_key or ""):  # compared, never shown
        look.reasons.append("the API key changed")
    return look


def ensure_image(conn, profile, *, reporter) -> str:
    """The router's image on the host: the serving image (when it has sglang_router) or the router
    image, made here and imported there when absent. Returns what was done, in words."""
    image = R.router_image(profile)
    probe = conn.run(R.has_router_argv(image), timeout=STEP_TIMEOUT_S * 4)
    if probe.ok and probe.stdout.strip():
        return f"{image} has sglang_router {probe.stdout.strip()}"
    if profile.router.image is None:
        raise RouterError(f"the serving image {image} has no sglang_router: set router.image (a tag; sparkctl makes "
                          "the router image under it when it is absent)")
    made = import_on_host(conn, image, profile.router.version, reporter=reporter)
    return f"made {image} (sglang-router {made['router']}, python {made['python']}, {made['bytes'] / 1e6:.0f} MB)"


def start_router(conn, profile, state_dir: str, api_key: Optional[str], *, reporter, timeout_s: float = 120.0) -> str:
    """(Re)start the router container on ``conn``'s host and wait for its /health (``reporter``: the run's, for its notes)."""
    done = ensure_image(conn, profile, reporter=reporter)
    env_path = R.env_file_path(profile.name, state_dir)
    check_result(conn.run(write_file_argv(posixpath.dirname(env_path), R.ENV_FILE, 0o600),
                          stdin=R.env_file_content(api_key).encode() or None, timeout=STEP_TIMEOUT_S),
                 f"write {env_path}")
    conn.run(remove_argv([profile.router.container]), timeout=STEP_TIMEOUT_S)
    started = conn.run(R.docker_run_argv(profile, state_dir), timeout=STEP_TIMEOUT_S * 2)
    if not started.ok:
        raise RouterError(f"docker run of the router failed: {(started.stderr or started.stdout).strip()[:300]}")
    endpoint = R.endpoint(conn.target.address, profile.router.port)
    client = RouterClient(endpoint, api_key)
    try:
        deadline = time.monotonic() + timeout_s
        while not client.healthy():
            if time.monotonic() > deadline:
                logs = conn.run(R.log_tail_argv(profile.router.container), timeout=STEP_TIMEOUT_S)
                raise RouterError(f"the router did not answer {endpoint}/health within {timeout_s:g} s; its log: "
                                  + " | ".join(logs.stdout.strip().splitlines()[-5:]))
            time.sleep(0.5)
    finally:
        client.close()
    return done
