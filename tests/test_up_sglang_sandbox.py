"""``sparkctl up`` of the SGLang line on the sandbox: the sandbox-sglang chain (stand-in SGLang + the
stand-in adapter overlay) built and sent, the packed Engram shards cut on every host, the ranks
serving from them, smoke; then a second ``up`` that changes nothing; then a rank whose shard is
replaced by a vLLM-layout file is found and repaired by the next ``up``.

The chain is a copy of images/sandbox-sglang under other tags (``$SPARKCTL_IMAGES``), so this module
never touches the images other suites check.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from sandbox_fixture import sandbox_cluster, give_to_user  # noqa: F401  (the session's cluster)
from sparkctl.engram.checkpoint_maker import make_checkpoint
from test_standin_support import REPO, sparkctl, standin_config

pytestmark = pytest.mark.sandbox

BASE = "/mnt/nvme/sglang-up"
TAG = "sparkctl-sgluptest:latest"
# The stand-in's default timing, with a prefill 40 times quicker per prompt token: smoke --full's
# retrievals (32k to 1M tokens) would otherwise sleep ~30 s of simulated prefill, which no assert reads.
PROFILE = ["--profile", "sandbox-sglang", "--set", "tensor_parallel=3", "--set", "image.name=sgluptest",
           "--set", f"image.tag={TAG}", "--set", "env.SPARKCTL_STANDIN_TTFT_BASE_MS=null",
           "--set", "env.SPARKCTL_STANDIN_ITL_MS=null", "--set", "env.SPARKCTL_STANDIN_TTFT_PER_TOKEN_MS=0.0005"]
STEPS = ["setup", "doctor", "checkpoint", "build", "distribute", "engram", "serve", "smoke"]


class Site:
    def __init__(self, cluster, inventory: Path, images: Path):
        self.cluster, self.inventory, self.images = cluster, inventory, images
        self.hosts = list(cluster.info.hosts)

    def cli(self, *args: str, timeout: float = 900):
        # A cache of its own: no surface read by an earlier run can stand in for the chain's switch list.
        return sparkctl("-i", str(self.inventory), *args, timeout=timeout,
                        env={"SPARKCTL_IMAGES": str(self.images), "XDG_CACHE_HOME": str(self.images.parent / "cache")})

    def up(self, *extra: str):
        result = self.cli("--json", "up", *PROFILE, *extra)
        doc = json.loads(result.stdout) if result.stdout.strip() else None
        if result.code != 0:
            print(f"up {' '.join(extra)}: exit {result.code}\n{result.stdout}\n{result.stderr}")
        return result, doc

    def local(self, host, path: str) -> Path:
        return Path(host.nvme_dir) / Path(path).relative_to("/mnt/nvme")

    def exec(self, host, *argv: str):
        from sparkctl.sandbox import cluster

        return cluster.exec_in_host(self.cluster.info, host.name, list(argv), timeout=120)


def statuses(doc: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in doc["steps"]}


@pytest.fixture(scope="module")
def site(sandbox_cluster, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("sglang-up")
    images = tmp / "images"
    shutil.copytree(REPO / "images" / "sandbox-sglang", images / "sgluptest")
    chain = images / "sgluptest" / "chain.yaml"
    chain.write_text(chain.read_text().replace("sparkctl-sandbox-sglang:", "sparkctl-sgluptest:"))
    inventory = yaml.safe_load(Path(sandbox_cluster.info.inventory).read_text())
    inventory["paths"].update(model_dir=f"{BASE}/model", engram_dir=f"{BASE}/engram", hf_cache=f"{BASE}/hf")
    inventory_path = tmp / "inventory.yaml"
    inventory_path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    s = Site(sandbox_cluster, inventory_path, images)
    for host in s.hosts:  # the real checkpoint's shape: each Engram layer's weight and scale in one file
        make_checkpoint(str(s.local(host, f"{BASE}/model")), vocab_size=64, table_files=True)
        # The HF cache folder exists, as on a prepared box: a missing one is created by docker (as root)
        # when the container mounts it, and the next up's setup would find it not the user's.
        s.local(host, f"{BASE}/hf").mkdir(parents=True, exist_ok=True)
    give_to_user(*(h.nvme_dir for h in s.hosts))  # the checkpoints are the login user's, as on a real box
    yield s
    s.cli("stop", "-y", "--profile", "sandbox-sglang", "--force-break-lock", "--timeout", "5")
    for host in s.hosts:
        tags = s.exec(host, "sh", "-c", "docker images --format '{{.Repository}}:{{.Tag}}' | grep '^sparkctl-sgluptest:' || true")
        names = tags.stdout.decode().split()
        if names:
            s.exec(host, "docker", "rmi", "-f", *names)


def test_the_sglang_line_converges_and_a_second_up_changes_nothing(site):
    plan, doc = site.up("--dry-run")  # render knows the overlay's switches before any image exists
    assert plan.code == 0, plan
    assert {s["name"]: s["status"] for s in doc["steps"]}["build"] == "planned"
    started = time.monotonic()
    first, doc = site.up()
    first_seconds = time.monotonic() - started
    assert first.code == 0, first
    assert statuses(doc) == {"setup": "changed", "doctor": "ok", "checkpoint": "skipped", "build": "changed",
                             "distribute": "changed", "engram": "changed", "serve": "changed", "smoke": "ok"}, doc
    # The Engram folder does not exist yet: setup creates it as the login user (left to Docker it would be root's).
    setup = next(s for s in doc["steps"] if s["name"] == "setup")
    assert "folders on every host" in setup["reason"], setup  # the step's line names each step once
    told = {line for line in first.stderr.splitlines() if ": folders: changed: created " in line}
    for host in site.hosts:  # each host's own step said what it created, as it ended
        assert any(line.startswith(f"{host.name}: folders:") and f"{BASE}/engram" in line for line in told), first.stderr
    for rank, host in enumerate(site.hosts):
        folder = site.local(host, f"{BASE}/engram")
        for layer in (1, 14):
            data = (folder / f"engram-l{layer}-r{rank}of3.bin").read_bytes()
            assert data[:8] == b"DSV1EN41"  # the SGLang line's packed file, not the vLLM one
            manifest = json.loads((folder / f"engram-l{layer}-r{rank}of3.json").read_text())
            assert manifest["layout"] == "sglang-packed" and len(data) == manifest["size"]
    logs = site.cli("logs", "--profile", "sandbox-sglang", "--tail", "200")
    assert "File-backed Engram layer=14 rank=2/3" in logs.stdout + logs.stderr

    started = time.monotonic()
    second, doc = site.up()
    second_seconds = time.monotonic() - started
    assert second.code == 0, second
    assert statuses(doc) == {name: ("skipped" if name == "checkpoint" else "ok") for name in STEPS}, \
        [(s["name"], s["status"], s["reason"]) for s in doc["steps"]]
    print(f"\nSGLang line on the sandbox: first up {first_seconds:.1f} s (build included), "
          f"second up {second_seconds:.1f} s")
    assert second_seconds < first_seconds


def test_smoke_full_passes_on_the_sandbox_line_at_1m(site):
    started = time.monotonic()
    result = site.cli("--json", "smoke", *PROFILE, "--full", timeout=1200)
    seconds = time.monotonic() - started
    assert result.code == 0, result
    doc = result.json()
    checks = {c["name"]: c for c in doc["checks"]}
    assert doc["ok"] and "retrieval_1m" in checks and "tool_round_trip" in checks, doc
    assert int(checks["retrieval_1m"]["detail"].split()[0]) > 1_000_000
    print(f"\nsmoke --full on the sandbox SGLang line: {seconds:.1f} s; "
          + ", ".join(f"{c['name']} {c['seconds']:.2f} s" for c in doc["checks"]))


def test_a_shard_in_the_vllm_layout_is_replaced_by_the_next_up(site):
    host = site.hosts[1]
    folder = site.local(host, f"{BASE}/engram")
    shard = folder / "engram-l1-r1of3.bin"
    shard.write_bytes(b"\0" * 64)  # another file under the shard's name: its manifest no longer re-checks
    result, doc = site.up()
    assert result.code == 0, result
    assert statuses(doc)["engram"] == "changed", doc
    assert shard.read_bytes()[:8] == b"DSV1EN41"


def test_push_mode_skips_what_the_hosts_cut_and_verify_finds_a_flipped_byte(site, tmp_path):
    """The same checkpoint here gives the same plan: push skips every shard the hosts cut; a byte
    flipped in one record is found by --verify on its host and rewritten by the next pack."""
    local = make_checkpoint(str(tmp_path / "ckpt"), vocab_size=64, table_files=True).path
    pack = ["pack-engram", *PROFILE, "-c", local]
    first = site.cli("--json", *pack)
    assert first.code == 0, first
    assert {s["action"] for h in first.json()["hosts"] for s in h["shards"]} == {"skipped"}
    host = site.hosts[2]
    shard = site.local(host, f"{BASE}/engram") / "engram-l14-r2of3.bin"
    good = shard.read_bytes()
    data = bytearray(good)
    data[4096 + 264] ^= 0x01  # a weight byte of the second record
    shard.write_bytes(bytes(data))
    verify = site.cli("--json", *pack, "--verify")
    assert verify.code == 1, verify
    statuses = {(h["host"], s["file"]): s["status"] for h in verify.json()["hosts"] for s in h["shards"]}
    assert statuses.pop((host.name, "engram-l14-r2of3.bin")) == "corrupt"
    assert set(statuses.values()) == {"ok"}
    repaired = site.cli("--json", *pack)
    assert repaired.code == 0, repaired
    actions = {s["file"]: s["action"] for h in repaired.json()["hosts"] for s in h["shards"] if h["host"] == host.name}
    assert actions["engram-l14-r2of3.bin"] in ("replaced", "written") and shard.read_bytes() == good


def test_the_memory_guard_then_serve_through_the_shim_and_stop(site):
    """``serve`` of the SGLang line through the stand-in's ``python3 -m sglang.launch_server``: a node
    whose memory fraction the hosts cannot give is refused before any rank starts, naming every host
    (the check comes after the old ranks are stopped: they hold the memory it measures); the served
    ranks report SGLang's config; ``stop`` removes every rank."""
    big = site.cli("--json", "serve", *PROFILE, "--set", "memory.unified_memory_gb=121")  # a GB10's 121 GB x 0.80
    assert big.code == 1, big
    doc = big.json()
    names = ", ".join(h.name for h in site.hosts)
    assert doc["stage"] == "check" and doc["message"].startswith(f"not enough free memory on {names}"), doc
    assert "the engine needs 96.8 GB" in doc["hosts"][0]["error"]

    served = site.cli("--json", "serve", *PROFILE)
    assert served.code == 0, served
    assert served.json()["health"]["health"] is None  # SGLang's /health: a bare 200, no body
    config = standin_config(served.json()["endpoint"])
    assert (config["engine"], config["engine_version"], config["ranks_connected"]) == ("sglang", "0.5.23", 3)
    assert config["max_model_len"] == 1048576 and config["reasoning_parser"] == "deepseek-v41"
    logs = site.cli("logs", "--profile", "sandbox-sglang", "--host", site.hosts[2].name)
    assert "stand-in sglang 0.5.23" in logs.stdout and "rank 2: the job started" in logs.stdout, logs
    stopped = site.cli("--json", "stop", "-y", "--profile", "sandbox-sglang")
    assert stopped.code == 0, stopped
    assert [h["removed"] for h in stopped.json()["hosts"]] == [["sparkctl-sandbox-sglang (running)"]] * 3
