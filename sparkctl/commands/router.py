"""The router's commands as data: its ``docker run`` argv, its files, its worker registration.

The router is ``sglang_router`` 0.3.2 (the Rust router from PyPI, the version the SGLang line
measured its 2 x TP4 layout with), run the way the SGLang line's ``scripts/router.sh`` runs it:
a container of an image that has the package, ``--network host``, ``--restart unless-stopped``,
``python3 -m sglang_router.launch_router --policy P --host 0.0.0.0 --port 8889 --prometheus-port
29000 --request-timeout-secs 1800 --max-payload-size 536870912``.

Two differences, both for reasons:

* **No ``--worker-urls``.** sparkctl registers each replica with ``POST /workers`` giving its
  ``model_id`` (the served model name). The router learns a worker's model from ``/server_info``
  (``served_model_name``), which SGLang serves and vLLM does not: a vLLM replica given by URL is
  listed as model ``unknown`` by the router's ``/v1/models``. The same call (and ``DELETE
  /workers/{id}``) takes a replica out and puts it back during a rolling restart.
* **The API key is not in argv.** ``--api-key`` is both what the router demands of clients
  (``Authorization: Bearer``) and what it sends to the workers. argv is world-readable in
  ``/proc``; the key goes in ``router.env`` (mode 0600, ``--env-file``) and a two-line launcher
  puts it into ``sys.argv`` inside the process before running the module.
"""

from __future__ import annotations

import json
from typing import Optional

from sparkctl.commands.docker import remote_profile_dir
from sparkctl.commands.serve import url_host

LABEL_ROUTER = "sparkctl.router"  # value: the profile; not sparkctl.profile, so rank logic never sees it
ENV_FILE = "router.env"
KEY_VARIABLE = "SPARKCTL_ROUTER_API_KEY"
MODULE = "sglang_router.launch_router"

# Runs the router module with the key (if any) appended to argv from the environment.
_LAUNCHER = ("import os, runpy, sys\n"
             "key = os.environ.pop('" + KEY_VARIABLE + "', '')\n"
             "sys.argv = ['" + MODULE + "'] + sys.argv[1:] + (['--api-key', key] if key else [])\n"
             "runpy.run_module('" + MODULE + "', run_name='__main__', alter_sys=True)\n")


def router_args(router) -> list[str]:
    """The router's own options, from the profile's ``router:`` section."""
    return ["--policy", router.policy, "--host", "0.0.0.0", "--port", str(router.port),
            "--prometheus-port", str(router.prometheus_port), "--prometheus-host", "0.0.0.0",
            "--request-timeout-secs", str(router.request_timeout_s),
            "--max-payload-size", str(router.max_payload_bytes),
            "--health-check-interval-secs", str(router.health_check_interval_s)]


def router_image(profile) -> str:
    return profile.router.image or profile.image.tag


def env_file_path(profile_name: str, state_dir: str) -> str:
    return f"{remote_profile_dir(profile_name, state_dir)}/{ENV_FILE}"


def env_file_content(api_key: Optional[str]) -> str:
    return f"{KEY_VARIABLE}={api_key}\n" if api_key else ""


def docker_run_argv(profile, state_dir: str) -> list[str]:
    router = profile.router
    return ["docker", "run", "-d", "--name", router.container, "--network", "host",
            "--restart", "unless-stopped", "--label", f"{LABEL_ROUTER}={profile.name}",
            "--env-file", env_file_path(profile.name, state_dir),
            "--entrypoint", "python3", router_image(profile), "-c", _LAUNCHER, *router_args(router)]


def containers_argv(profile_name: str) -> list[str]:
    # set -eu: a docker that cannot answer fails the listing (an empty answer would read as "no router").
    script = ('set -eu\nids=$(docker ps -aq --filter "label=' + LABEL_ROUTER + '=$1")\n'
              'if [ -z "$ids" ]; then echo "[]"; else docker inspect $ids; fi\n')
    return ["sh", "-c", script, "sparkctl-router", profile_name]


def has_router_argv(image: str) -> list[str]:
    """Whether ``image`` holds sglang_router (prints its version), run with no network."""
    probe = "import importlib.metadata as m; print(m.version('sglang-router'))"
    return ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", probe]


def endpoint(address: str, port: int) -> str:
    return f"http://{url_host(address)}:{port}"


def worker_body(url: str, model_id: str, api_key: Optional[str] = None) -> dict:
    """``POST /workers``: a replica's head, with the model it serves (and the key it wants)."""
    body = {"url": url, "model_id": model_id, "worker_type": "regular"}
    return {**body, "api_key": api_key} if api_key else body


def parse_workers(text: str) -> list[dict]:
    """``GET /workers`` -> [{id, url, model_id, is_healthy, load}]."""
    doc = json.loads(text or "{}")
    workers = doc.get("workers") if isinstance(doc, dict) else None
    if not isinstance(workers, list):
        raise ValueError("the router's /workers answer has no worker list")
    return [{"id": w.get("id"), "url": w.get("url"), "model_id": w.get("model_id"),
             "healthy": bool(w.get("is_healthy")), "load": w.get("load")} for w in workers if isinstance(w, dict)]


def log_tail_argv(container: str, lines: int = 20) -> list[str]:
    """The router container's last ``lines`` log lines, stdout and stderr together."""
    return ["sh", "-c", 'docker logs --tail "$2" "$1" 2>&1', "logs", container, str(lines)]
