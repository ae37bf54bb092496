"""``sparkctl up`` against the sandbox cluster: from bare hosts to a served endpoint, then nothing to
do, then a patch change that rebuilds one layer and sends only it, then a failed run that resumes.

The image chain is a copy of images/sandbox under other tags (``$SPARKCTL_IMAGES``), so this module
never touches the ``sparkctl-sandbox:*`` images other suites check, and can change a patch file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from sandbox_fixture import sandbox_cluster, give_to_user  # noqa: F401  (the session's cluster)
from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.httpclient import tls_context
from test_standin_support import REPO, sparkctl

pytestmark = pytest.mark.sandbox

BASE = "/mnt/nvme/up-test"
TAG = "sparkctl-uptest:latest"
PROFILE = ["--profile", "sandbox", "--set", "tensor_parallel=3", "--set", "image.name=uptest", "--set", f"image.tag={TAG}",
           "--set", "env.SPARKCTL_STANDIN_TTFT_BASE_MS=null", "--set", "env.SPARKCTL_STANDIN_ITL_MS=null"]
STEPS = ["setup", "doctor", "checkpoint", "build", "distribute", "engram", "serve", "smoke"]


class Site:
    def __init__(self, cluster, inventory: Path, images: Path):
        self.cluster, self.inventory, self.images = cluster, inventory, images
        self.hosts = list(cluster.info.hosts)
        self.head = self.hosts[0]

    def cli(self, *args: str, timeout: float = 900):
        return sparkctl("-i", str(self.inventory), *args, timeout=timeout, env={"SPARKCTL_IMAGES": str(self.images)})

    def up(self, *extra: str):
        result = self.cli("--json", "up", *PROFILE, *extra)
        doc = json.loads(result.stdout) if result.stdout.strip() else None
        if result.code != 0:  # the whole story, for the failure message
            print(f"up {' '.join(extra)}: exit {result.code}\n{result.stdout}\n{result.stderr}")
        return result, doc

    def exec(self, host, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        from sparkctl.sandbox import cluster

        result = cluster.exec_in_host(self.cluster.info, host.name, list(argv), timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"{host.name}: {argv}: {result.stderr.decode(errors='replace')}")
        return result

    def local(self, host, path: str) -> Path:
        return Path(host.nvme_dir) / Path(path).relative_to("/mnt/nvme")

    def image_id(self, host) -> str:
        result = self.exec(host, "docker", "image", "inspect", "--format", "{{.Id}}", TAG, check=False)
        return result.stdout.decode().strip()


def statuses(doc: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in doc["steps"]}


@pytest.fixture(scope="module")
def site(sandbox_cluster, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("up")
    images = tmp / "images"
    shutil.copytree(REPO / "images" / "sandbox", images / "uptest")
    chain = images / "uptest" / "chain.yaml"
    chain.write_text(chain.read_text().replace("sparkctl-sandbox:", "sparkctl-uptest:"))
    inventory = yaml.safe_load(Path(sandbox_cluster.info.inventory).read_text())
    inventory["paths"].update(model_dir=f"{BASE}/model", engram_dir=f"{BASE}/engram", hf_cache=f"{BASE}/hf")
    inventory_path = tmp / "inventory.yaml"
    inventory_path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    s = Site(sandbox_cluster, inventory_path, images)
    for host in s.hosts:
        make_checkpoint(str(s.local(host, f"{BASE}/model")), vocab_size=64)
    for host in s.hosts:  # a prepared host has every folder of the inventory (else dockerd makes a bind source root's)
        for folder in ("engram", "hf"):
            s.local(host, f"{BASE}/{folder}").mkdir(parents=True, exist_ok=True)
    give_to_user(*(h.nvme_dir for h in s.hosts))  # the checkpoints are the login user's, as on a real box
    yield s
    s.cli("stop", "-y", "--profile", "sandbox", "--force-break-lock", "--grace", "5")
    for host in s.hosts:
        tags = s.exec(host, "sh", "-c", "docker images --format '{{.Repository}}:{{.Tag}}' | grep '^sparkctl-uptest:' || true")
        names = tags.stdout.decode().split()
        if names:
            s.exec(host, "docker", "rmi", "-f", *names, check=False)


def test_first_up_plans_then_converges_and_a_second_up_changes_nothing(site):
    plan, doc = site.up("--dry-run")
    assert plan.code == 0, plan
    assert [s["name"] for s in doc["steps"]] == STEPS and set(doc) == {"profile", "ok", "steps", "error"}
    assert statuses(doc) == {"setup": "ok", "doctor": "planned", "checkpoint": "skipped", "build": "planned", "distribute": "planned",
                             "engram": "planned",
                             "serve": "planned", "smoke": "planned"}
    assert "not deployed" in doc["steps"][6]["reason"]
    assert site.image_id(site.head) == ""  # the dry run built nothing

    started = time.monotonic()
    first, doc = site.up()
    first_seconds = time.monotonic() - started
    assert first.code == 0, first
    assert doc["ok"] and doc["profile"] == "sandbox"
    assert statuses(doc) == {"setup": "ok", "doctor": "ok", "checkpoint": "skipped", "build": "changed", "distribute": "changed",
                             "engram": "changed",
                             "serve": "changed", "smoke": "ok"}, doc
    assert "smoke checks passed" in doc["steps"][7]["reason"]
    for step in doc["steps"]:
        assert set(step) == {"name", "status", "reason", "seconds"} and step["reason"] and step["seconds"] >= 0
    ids = {site.image_id(h) for h in site.hosts}
    assert len(ids) == 1 and ids.pop().startswith("sha256:")
    assert "will act" in first.stderr  # the plan came first

    started = time.monotonic()
    second, doc = site.up()
    second_seconds = time.monotonic() - started
    assert second.code == 0, second
    assert statuses(doc) == {"setup": "ok", "doctor": "ok", "checkpoint": "skipped", "build": "ok", "distribute": "ok", "engram": "ok",
                             "serve": "ok",
                             "smoke": "ok"}, doc
    assert "nothing to do, every step is already true" in second.stderr
    print(f"\nfirst up {first_seconds:.1f} s, second up {second_seconds:.1f} s")
    assert second_seconds < first_seconds
    human = site.cli("up", *PROFILE)
    assert human.code == 0 and "nothing changed" in human.stdout


def test_a_patch_change_rebuilds_that_layer_sends_only_it_and_restarts(site):
    before = {h.name: site.image_id(h) for h in site.hosts}
    patch = site.images / "uptest" / "patch" / "engram.py"
    patch.write_text(patch.read_text() + "\n# changed for the up test\n")
    plan, doc = site.up("--dry-run")
    assert plan.code == 0, plan
    assert statuses(doc)["build"] == "planned" and doc["steps"][3]["reason"].startswith("build patch of ")
    assert statuses(doc)["serve"] == "planned" and statuses(doc)["distribute"] == "planned" and statuses(doc)["engram"] == "ok"
    human = site.cli("up", *PROFILE, "--dry-run")
    assert human.code == 0 and "up sandbox: 3 step(s) to act" in human.stdout, human
    assert "build      will act  build patch of" in human.stdout and "engram     ok " in human.stdout

    result, doc = site.up()
    assert result.code == 0, result
    assert statuses(doc) == {"setup": "ok", "doctor": "ok", "checkpoint": "skipped", "build": "changed", "distribute": "changed",
                             "engram": "ok",
                             "serve": "changed", "smoke": "ok"}, doc
    assert doc["steps"][3]["reason"].startswith("built patch of ")
    sent = doc["steps"][4]["reason"]
    assert "(thin, " in sent and "(full, " not in sent  # only the layer the hosts lack
    after = {h.name: site.image_id(h) for h in site.hosts}
    assert len(set(after.values())) == 1 and set(after.values()) != set(before.values())
    assert "runs" in doc["steps"][6]["reason"] or "image" in doc["steps"][6]["reason"]


def test_a_failed_up_resumes_from_what_is_already_true(site):
    worker = site.hosts[2]
    shutil.rmtree(site.local(worker, f"{BASE}/engram"))  # the worker lost its Engram shards
    patch = site.images / "uptest" / "patch" / "weight_utils.py"
    patch.write_text(patch.read_text() + "\n# changed again\n")
    # An engine that takes longer to load than this run waits: the serve step fails.
    failed, doc = site.up("--env", "SPARKCTL_STANDIN_LOAD_S=60", "--health-timeout", "3")
    assert failed.code == 1, failed
    # The lost folder is one the engine bind-mounts: setup makes it again as the user (left to
    # Docker it would be root's), and says so.
    assert doc["steps"][0]["reason"] == f"prepared {worker.name}: folders (created {BASE}/engram)", doc["steps"][0]
    assert statuses(doc) == {"setup": "changed", "doctor": "ok", "checkpoint": "skipped", "build": "changed", "distribute": "changed",
                             "engram": "changed",
                             "serve": "failed", "smoke": "skipped"}, doc
    assert "did not become healthy within 3 s" in doc["steps"][6]["reason"]
    assert doc["steps"][7]["reason"] == "not run: serve failed"

    resumed, doc = site.up()
    assert resumed.code == 0, resumed
    assert statuses(doc) == {"setup": "ok", "doctor": "ok", "checkpoint": "skipped", "build": "ok", "distribute": "ok", "engram": "ok",
                             "serve": "changed",
                             "smoke": "ok"}, doc
    again, doc = site.up()
    assert again.code == 0, again
    assert statuses(doc) == {name: ("skipped" if name == "checkpoint" else "ok") for name in STEPS}, doc


def test_the_checkpoint_step_verifies_and_repairs_from_a_model_source(site, tmp_path):
    from sparkctl.model.agent import MANIFEST_NAME

    source = make_checkpoint(str(tmp_path / "ckpt"), vocab_size=64).path  # the same bytes the hosts hold
    model_dir = site.local(site.hosts[1], f"{BASE}/model")
    shard = sorted(model_dir.glob("*.safetensors"))[0]
    os.truncate(shard, shard.stat().st_size - 16)  # one host's copy is damaged: doctor fails it

    plan, doc = site.up("--model-source", source, "--dry-run")
    assert plan.code == 0, plan
    step = doc["steps"][2]
    assert step["name"] == "checkpoint" and step["status"] == "planned", doc
    assert site.hosts[1].name in step["reason"] and "copy what differs" in step["reason"]

    result, doc = site.up("--model-source", source)
    assert result.code == 0, result
    assert statuses(doc)["doctor"] == "ok" and statuses(doc)["checkpoint"] == "changed", doc
    assert f"{site.hosts[1].name} (1 file(s)" in doc["steps"][2]["reason"]
    assert (model_dir / shard.name).read_bytes() == (Path(source) / shard.name).read_bytes()
    assert all((site.local(h, f"{BASE}/model") / MANIFEST_NAME).exists() for h in site.hosts)

    again, doc = site.up("--model-source", source, "--dry-run")
    assert again.code == 0 and statuses(doc)["checkpoint"] == "ok", doc
    assert doc["steps"][2]["reason"].startswith("present and verified on 3 host(s)")


def test_up_is_refused_while_another_run_holds_the_lock(site):
    from sparkctl.ops.lock import this_process

    info = json.dumps({"who": "bob@ci", "when": "2026-01-01T00:00:00Z", "what": "serve sandbox", "token": "t",
                       "holder": this_process()})
    site.exec(site.head, "sh", "-c", 'mkdir -p "$1" && printf %s "$2" > "$1/info.json"', "x",
              "/var/lib/sparkctl/deploy.lock", info)
    try:
        refused, doc = site.up()
        assert refused.code == 1 and not doc["ok"], refused
        assert "held by bob@ci" in refused.stdout + refused.stderr
        assert "held by bob@ci" in doc["error"], doc  # the document says why, not only stderr
    finally:
        site.exec(site.head, "rm", "-rf", "/var/lib/sparkctl/deploy.lock")


def _state(site: Site, host) -> dict:
    out = site.exec(host, "docker", "inspect", "--format", "{{json .State}}|{{.RestartCount}}", "sparkctl-sandbox")
    state, _, restarts = out.stdout.decode().strip().rpartition("|")
    return {**json.loads(state), "RestartCount": int(restarts)}


def _head_answers(site: Site) -> bool:
    """The head's /health answers 200: asked from here, no host work (a status that says ok needs it too)."""
    import httpx

    try:
        return httpx.get(f"http://{site.head.address}:8000/health", timeout=5, verify=tls_context()).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_serving(site: Site, timeout: float = 180) -> dict:
    """Poll `status` until the deployment serves again (the machine may be loaded: generous, polled).
    Until the head's own API answers, a status (every host's engine asked over SSH) could only say not yet:
    that is waited for first, with one HTTP request a poll."""
    deadline = time.monotonic() + timeout
    while not _head_answers(site) and time.monotonic() < deadline:
        time.sleep(0.5)
    while True:
        status = site.cli("--json", "status", *PROFILE)
        doc = json.loads(status.stdout)
        if doc["ok"] or time.monotonic() > deadline:
            return doc
        time.sleep(2)


def test_a_crashed_rank_comes_back_by_the_restart_policy(site):
    """A worker's engine process dies (not a docker stop/kill): docker restarts it; the head, whose job
    lost a rank, exits non-zero and restarts too; the other worker's job is gone, so it restarts and
    rejoins: the deployment serves again by itself."""
    import os
    import signal

    up, doc = site.up()
    assert up.code == 0, up
    worker = site.hosts[1]
    before = {h.name: _state(site, h)["RestartCount"] for h in site.hosts}
    os.kill(_state(site, worker)["Pid"], signal.SIGKILL)  # the host's view of the engine process
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(_state(site, h)["RestartCount"] <= before[h.name] for h in site.hosts):
        time.sleep(1)
    assert all(_state(site, h)["RestartCount"] > before[h.name] for h in site.hosts)
    doc = _wait_serving(site)
    assert doc["ok"] and doc["fix"] is None, doc
    assert all(h["container"]["restart_count"] >= 1 for h in doc["hosts"] if h["in_deployment"])
    text = site.cli("status", *PROFILE)
    assert "(restarted " in text.stdout


def test_a_killed_head_is_named_with_the_fix_and_up_brings_it_back(site):
    """docker kill is a stop on purpose: docker does not restart the head; its workers, whose job is
    gone, restart and wait for it. status says so and prints the serve that fixes it."""
    head = site.hosts[0]
    site.exec(head, "docker", "kill", "sparkctl-sandbox")
    deadline = time.monotonic() + 60
    while _state(site, head)["Status"] != "exited" and time.monotonic() < deadline:
        time.sleep(0.5)
    status = site.cli("--json", "status", *PROFILE)
    assert status.code == 1, status
    doc = json.loads(status.stdout)
    problem = next(p for p in doc["problems"] if p.startswith(f"{head.name}: container sparkctl-sandbox exited with code 137"))
    assert "docker does not restart a rank stopped on purpose" in problem
    # the values of env.* were not recorded at serve time: the fix asks for them again
    recorded = " ".join(f"--set {o.partition('=')[0]}=..." if o.startswith("env.") else f"--set {o}" for o in PROFILE[2:][1::2])
    assert doc["fix"] == "sparkctl serve --profile sandbox " + recorded, doc["fix"]
    text = site.cli("status", *PROFILE)
    assert f"fix: sparkctl serve --profile sandbox {recorded}" in text.stdout
    time.sleep(5)
    assert _state(site, head)["Status"] == "exited"  # the policy leaves it down

    back, doc = site.up()
    assert back.code == 0, back
    assert statuses(doc)["serve"] == "changed" and f"{head.name}: container sparkctl-sandbox exited" in doc["steps"][6]["reason"]
    assert _wait_serving(site, 30)["ok"]
