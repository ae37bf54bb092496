"""Two SGLang replicas (the sandbox SGLang line, TP2 each) behind the real sglang_router 0.3.2 on the
4-host sandbox: ``up`` builds the stand-in sglang-dsv41 chain, packs each replica's Engram shards,
serves both, starts the router and smokes through it; the router answers chat and spreads requests
over both replicas. Then ``stop --hosts`` of one replica keeps the router serving the other (the
stopped one out of its list), and stopping the last replica stops the router.

The chain is a copy of images/sandbox-sglang under other tags (``$SPARKCTL_IMAGES``), so this module
never touches the images other suites check. The session's 4-host cluster is reused.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from replicas_site import ReplicasSite, make_site
from sandbox_fixture import give_to_user, sandbox_cluster4  # noqa: F401  (the session's 4-host cluster)
from sparkctl.commands.engine_metrics import parse_exposition, value
from sparkctl.engram.checkpoint_maker import make_checkpoint

pytestmark = pytest.mark.sandbox

BASE = "/mnt/nvme/sglang-replicas"
TAG = "sparkctl-sglreptest:latest"
PROFILE = ["--profile", "sandbox-sglang", "--set", "tensor_parallel=2", "--set", "replicas=2",
           "--set", "router.image=sparkctl-router:0.3.2",  # the stand-in SGLang image has no sglang_router
           "--set", "image.name=sglreptest", "--set", f"image.tag={TAG}",
           "--set", "env.SPARKCTL_STANDIN_TTFT_BASE_MS=null", "--set", "env.SPARKCTL_STANDIN_ITL_MS=null"]
MODEL = "deepseek-v4.1-flash"


def router_container(site: ReplicasSite) -> str:
    return site.exec(site.hosts[0], "docker", "ps", "-a", "--filter", "label=sparkctl.router=sandbox-sglang",
                     "--format", "{{.Names}} {{.State}}").stdout.decode().strip()


@pytest.fixture(scope="module")
def site(sandbox_cluster4, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("sglang-replicas")
    # The router image is made once per machine from a cache outside this test's own.
    cache = tmp / "cache" / "sparkctl"
    cache.mkdir(parents=True)
    for found in (Path.home() / ".cache" / "sparkctl").glob("sglang-router-*"):
        (cache / found.name).symlink_to(found)
    s = make_site(sandbox_cluster4, tmp, chain="sandbox-sglang", name="sglreptest", tag=TAG, base=BASE, profile=PROFILE,
                  env={"XDG_CACHE_HOME": str(tmp / "cache")})
    for host in s.hosts:
        make_checkpoint(str(s.local(host, f"{BASE}/model")), vocab_size=64, table_files=True)
        s.local(host, f"{BASE}/hf").mkdir(parents=True, exist_ok=True)
    give_to_user(*(h.nvme_dir for h in s.hosts))
    yield s
    stopped = s.cli("stop", "-y", *PROFILE, "--force-break-lock", "--grace", "5")
    for host in s.hosts:
        s.exec(host, "docker", "rmi", "-f", TAG, TAG.replace(":latest", ":base"))
    assert stopped.code == 0, stopped  # ranks or the router left running would hold the ports the replicas tests use


def _requests_done(endpoint: str) -> float:
    return value(parse_exposition(httpx.get(endpoint + "/metrics", timeout=10).text), "sglang:num_requests_total") or 0.0


def _chat(endpoint: str, text: str) -> httpx.Response:
    return httpx.post(endpoint + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": text}]})


def test_up_serves_two_sglang_replicas_behind_the_real_router(site):
    started = time.monotonic()
    result = site.cli("--json", "up", *PROFILE)
    seconds = time.monotonic() - started
    assert result.code == 0, result
    steps = {s["name"]: s for s in result.json()["steps"]}
    assert steps["engram"]["status"] == "changed" and steps["smoke"]["status"] == "ok", steps
    serve = steps["serve"]["reason"]
    assert "router started" in serve and steps["smoke"]["reason"].startswith(site.router), steps
    for index, host in enumerate(site.hosts):  # each replica's ranks cut their own TP2 shards
        shard = site.local(host, f"{BASE}/engram") / f"engram-l1-r{index % 2}of2.bin"
        assert shard.read_bytes()[:8] == b"DSV1EN41", shard

    workers = httpx.get(site.router + "/workers", timeout=10).json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(site.replicas)
    assert all(w["model_id"] == MODEL and w["is_healthy"] for w in workers), workers
    info = httpx.get(site.replicas[1] + "/server_info", timeout=10).json()  # what the router read from the worker
    assert info["tp_size"] == 2 and info["served_model_name"] == MODEL
    before = [_requests_done(r) for r in site.replicas]
    answers = [_chat(site.router, f"question {i}") for i in range(6)]
    assert [a.status_code for a in answers] == [200] * 6, [a.text[:200] for a in answers]
    assert all(a.json()["choices"][0]["message"]["content"] for a in answers)
    done = [_requests_done(r) - b for r, b in zip(site.replicas, before)]
    print(f"\n2 x SGLang TP2 behind the router: up {seconds:.1f} s; 6 chats through the router, per replica {done}")
    assert done[0] >= 2 and done[1] >= 2  # round_robin: both replicas answer


def test_stop_one_replica_keeps_the_router_then_the_last_stops_it(site):
    names = [h.name for h in site.hosts]
    partial = site.cli("--json", "stop", "-y", *PROFILE, "--hosts", ",".join(names[2:]))
    assert partial.code == 0, partial
    router = partial.json()["router"]
    assert router["stop"] is False and router["leaving"] == ["replica 2"], router
    assert router["reason"] == f"the router stays: replica 1 ({names[0]}, {names[1]}) still runs behind it"
    assert router["done"] == [f"replica 2: out of the router ({site.replicas[1]})"]
    assert router_container(site).endswith(" running")
    workers = httpx.get(site.router + "/workers", timeout=10).json()["workers"]
    assert [w["url"] for w in workers] == [site.replicas[0]]
    answers = [_chat(site.router, f"after {i}") for i in range(3)]  # replica 1 serves them all, none fails
    assert [a.status_code for a in answers] == [200] * 3, [a.text[:200] for a in answers]

    plan = site.cli("--json", "stop", "-y", *PROFILE, "--hosts", ",".join(names[:2]), "--dry-run")
    assert plan.code == 0 and plan.json()["router"].startswith("no other replica runs (replica 2 "), plan
    last = site.cli("--json", "stop", "-y", *PROFILE, "--hosts", ",".join(names[:2]))
    assert last.code == 0, last
    router = last.json()["router"]
    assert router["stop"] is True and router["reason"].startswith("no other replica runs"), router
    assert router["done"][0].startswith("removed the router (") and router_container(site) == ""
