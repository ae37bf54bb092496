"""serve / status / logs / stop (and bench) against the sandbox cluster: real sshd, dockerd and engine containers.

The image is the stand-in engine's own rootfs (``sparkctl.standin.rootfs``), imported on every host
under a test tag, so this module never touches the ``sparkctl-sandbox:*`` images other suites check.
Each host gets a synthetic checkpoint and its Engram shards from ``pack-engram``.

Each sandbox host has its own /var/lib/sparkctl (as a real box has), so the per-host env files,
deployment records, the lock and the audit log do not collide.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from sandbox_fixture import sandbox_cluster, give_to_user  # noqa: F401  (the session's cluster)
from sparkctl.engram.checkpoint_maker import make_checkpoint
from test_standin_support import REPO, sparkctl, standin_config

pytestmark = pytest.mark.sandbox

TAG = "sparkctl-standin:serve-test"
BASE = "/mnt/nvme/serve-test"
# The stand-in's own default timing (the sandbox profile sets the TP4 vLLM report's slower figures for the demo).
PROFILE = ["--profile", "sandbox", "--set", "tensor_parallel=3", "--set", f"image.tag={TAG}",
           "--set", "env.SPARKCTL_STANDIN_TTFT_BASE_MS=null", "--set", "env.SPARKCTL_STANDIN_ITL_MS=null"]
DIR = "/var/lib/sparkctl/sandbox"
LOCK = "/var/lib/sparkctl/deploy.lock/info.json"
AUDIT = "/var/lib/sparkctl/audit.log"


class Site:
    def __init__(self, cluster, inventory: Path, local_model: Path):
        self.cluster, self.inventory, self.local_model = cluster, inventory, local_model
        self.hosts = list(cluster.info.hosts)
        self.head = self.hosts[0]

    def cli(self, *args: str, timeout: float = 180):
        return sparkctl("-i", str(self.inventory), *args, timeout=timeout)

    def exec(self, host, *argv: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
        from sparkctl.sandbox import cluster

        result = cluster.exec_in_host(self.cluster.info, host.name, list(argv), input=input, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"{host.name}: {argv}: {result.stderr.decode(errors='replace')}")
        return result

    def containers(self, host) -> list[dict]:
        ids = self.exec(host, "docker", "ps", "-aq", "--filter", "label=sparkctl.profile=sandbox").stdout.split()
        if not ids:
            return []
        return json.loads(self.exec(host, "docker", "inspect", *[i.decode() for i in ids]).stdout)

    def read(self, host, path: str) -> str | None:
        """A file on the host as the host sees it (None when absent)."""
        result = self.exec(host, "cat", path, check=False)
        return result.stdout.decode() if result.returncode == 0 else None

    def mode(self, host, path: str) -> int:
        return int(self.exec(host, "stat", "-c", "%a", path).stdout.decode(), 8)

    def local(self, host, path: str) -> Path:
        return Path(host.nvme_dir) / Path(path).relative_to("/mnt/nvme")

    def shards(self, host) -> Path:
        return self.local(host, f"{BASE}/engram")

    def pack(self):
        result = self.cli("--json", "pack-engram", *PROFILE[:4], "--checkpoint", str(self.local_model))
        assert result.code == 0, result

    def stop(self):
        return self.cli("stop", "-y", "--profile", "sandbox", "--break-lock", "--timeout", "5")


@pytest.fixture(scope="module")
def site(sandbox_cluster, tmp_path_factory, request):  # noqa: F811
    """The serve test site. Built once per test process and shared by every module that uses it (this
    one, test_faults_sandbox, test_fidelity_sandbox, the fault matrix's serve cells): each module starts
    with nothing deployed and the image, checkpoint and shards in place (~20 s of set-up a module less)."""
    s = _shared_site(sandbox_cluster, tmp_path_factory, request.config)
    # What an earlier module left deployed is stopped here, and said so if it cannot be (a failure
    # in that module's teardown), rather than failing this module's first test with another reason.
    if any(s.containers(host) for host in s.hosts):
        stopped = s.stop()
        assert stopped.code == 0 and not any(s.containers(host) for host in s.hosts), \
            f"the shared serve site was left deployed and could not be stopped: {stopped}"
    yield s
    s.stop()
    for host in s.hosts:
        s.exec(host, "docker", "rm", "-f", "porthog", check=False)


def _shared_site(sandbox_cluster, tmp_path_factory, config) -> Site:  # noqa: F811
    """This process's site (kept on the pytest config, as the cluster is). Its image goes with the cluster:
    removing it at the end would only add to the short time an xdist worker has to take its cluster down."""
    shared = getattr(config, "_sparkctl_serve_site", None)
    if shared is None or shared.cluster is not sandbox_cluster:
        shared = _build_site(sandbox_cluster, tmp_path_factory.mktemp("serve"))
        config._sparkctl_serve_site = shared
    return shared


def _build_site(sandbox_cluster, tmp: Path) -> Site:  # noqa: F811
    import rootfs_once
    from sparkctl.standin.rootfs import docker_import_argv

    tar = rootfs_once.write_rootfs_tar(tmp / "standin.tar")
    data = Path(tar.path).read_bytes()
    local_model = tmp / "model"
    make_checkpoint(str(local_model), vocab_size=64)
    inventory = yaml.safe_load(Path(sandbox_cluster.info.inventory).read_text())
    inventory["paths"].update(model_dir=f"{BASE}/model", engram_dir=f"{BASE}/engram", hf_cache=f"{BASE}/hf")
    inventory_path = tmp / "inventory.yaml"
    inventory_path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    s = Site(sandbox_cluster, inventory_path, local_model)
    for host in s.hosts:
        make_checkpoint(str(s.local(host, f"{BASE}/model")), vocab_size=64)
        for attempt in range(3):  # a just-started engine may still refuse the first import
            imported = s.exec(host, *docker_import_argv(TAG), input=data, check=attempt == 2)
            if imported.returncode == 0:
                break
            time.sleep(1)
    give_to_user(*(h.nvme_dir for h in s.hosts))  # the checkpoints are the login user's, as on a real box
    s.pack()
    return s


def serve(site: Site, *extra: str, timeout: float = 120):
    return site.cli("--json", "serve", *PROFILE, *extra, timeout=timeout)


# ---------------------------------------------------------------------------------------------- refusals first


def test_serve_refused_when_the_port_is_taken(site):
    site.exec(site.head, "docker", "run", "-d", "--name", "porthog", "--network", "host", TAG,
              "python3", "-m", "http.server", "8000")
    try:
        # The serve must find the port taken: wait until it is, however long the container takes to start.
        deadline = time.monotonic() + 120
        while b":8000 " not in site.exec(site.head, "ss", "-Htln").stdout:
            assert time.monotonic() < deadline, "the container holding port 8000 never listened"
            time.sleep(0.1)
        result = serve(site)
        assert result.code == 1, result
        report = result.json()
        assert report["stage"] == "check" and not report["ok"]
        # The login user (nvidia) is not shown another user's process (the container runs as root), as on DGX OS.
        assert "port 8000 (serving port) is in use by another process" in report["message"]
        assert all(not site.containers(h) for h in site.hosts)  # refused before anything started
        assert site.read(site.head, LOCK) is None  # and the lock is released
        audit = site.read(site.head, AUDIT).splitlines()
        assert audit[-1].split()[2:4] == ["serve", "profile=sandbox"] and "result=failed:check" in audit[-1]
    finally:
        site.exec(site.head, "docker", "rm", "-f", "porthog", check=False)


def test_failed_health_wait_prints_every_hosts_logs_and_exits_1(site):
    worker = site.hosts[2]
    moved = site.shards(worker).with_name("engram-aside")
    site.shards(worker).rename(moved)
    try:
        # The rank fails at start and its restart policy (on-failure) runs it again, and again. serve
        # looks every few seconds and may see it down (exited, or waiting to be restarted) or, on a
        # loaded machine where each try lasts long enough for docker to reset its back-off, running
        # again: either way it has exited or been restarted since serve started it, and the wait ends
        # there, naming the host and the rank. The health timeout is far away: reaching it fails this.
        timeout_s = 600
        started = time.monotonic()
        result = site.cli("serve", *PROFILE, "--timeout", str(timeout_s), timeout=timeout_s + 300)
        took = time.monotonic() - started
        assert result.code == 1, result
        assert "serve failed (health): a container stopped while waiting for the endpoint: " in result.stdout, result
        assert re.search(f"{worker.name} \\(rank 2\\): container sparkctl-sandbox (exited with code 1 |restarting "
                         "|failed and docker restarted it \\d+ times? since serve started it)", result.stdout), result
        assert "did not become healthy" not in result.stdout
        assert took < timeout_s / 4, took  # ended by the rank, long before the timeout
        assert "stopped and removed the ranks it started on" in result.stdout, result
        assert all(not site.containers(h) for h in site.hosts)  # all or nothing
        # Every host's logs, read before the rollback removed the containers; the worker's has why it
        # failed (every try's, whatever its state when read: exited, restarting, or running its next try).
        err = result.stderr
        assert re.search(f"--- {worker.name} \\(rank 2, worker\\): container sparkctl-sandbox "
                         "(exited with code 1|restarting|running since \\S+ \\(restarted \\d+ times?\\))", err), err
        assert "Engram-on-disk (DSV41_ENGRAM_DISK=1): rank 2 of 3 is missing 2 of 2 shard(s) in /engram" in err
        assert f"--- {site.head.name} (rank 0, head): container sparkctl-sandbox running since " in err  # waits for rank 2
        assert "No such container" not in err
    finally:
        moved.rename(site.shards(worker))


def test_a_health_wait_that_times_out_prints_the_logs(site):
    # An engine that loads for longer than the wait: every liveness look (the last one at the timeout
    # too) sees the ranks serve started, running and never restarted, so the wait ends at its timeout,
    # not before, whether or not the engine has printed its first lines by then.
    result = serve(site, "--env", "SPARKCTL_STANDIN_LOAD_S=900", "--health-timeout", "8")
    assert result.code == 1, result
    report = result.json()
    assert report["stage"] == "health" and "did not become healthy within 8 s" in report["message"]
    assert "connection refused" in report["message"] and "a container stopped" not in report["message"]
    assert report["health_seconds"] >= 8
    # the logs and states were read while the ranks ran, before the rollback removed them (all or nothing)
    for host in report["hosts"]:
        assert host["state"] == "running" and host["container"]["restart_count"] == 0, host
        assert host["logs"] is not None and "No such container" not in host["logs"], host
    assert "stopped and removed the ranks it started" in report["message"]
    assert all(not site.containers(h) for h in site.hosts)


# ---------------------------------------------------------------------------------------------- the happy path


def test_serve_then_status_chat_and_logs(site):
    result = serve(site)
    assert result.code == 0, result
    report = result.json()
    assert report["ok"] and report["stage"] == "done"
    endpoint = report["endpoint"]
    assert endpoint == f"http://{site.head.address}:8000"
    assert [h["state"] for h in report["hosts"]] == ["running"] * 3
    assert all(len(h["container_id"]) == 12 for h in report["hosts"])
    assert report["health"]["health"] is None  # vLLM's /health has no body, and none is made up
    assert standin_config(endpoint)["ranks_connected"] == 3  # the stand-in's own view: all three ranks joined
    assert not any(h["replaced"] for h in report["hosts"])  # a failed serve leaves no rank behind (all or nothing)

    # per host: its own files, its own environment, modes as rendered
    for rank, host in enumerate(site.hosts):
        env = site.read(host, f"{DIR}/engine.env")
        assert f"VLLM_HOST_IP={host.fabric_address}" in env and "DSV41_ENGRAM_DISK=1" in env
        assert site.mode(host, f"{DIR}/engine.env") == 0o600 and site.mode(host, f"{DIR}/launch.sh") == 0o755
        assert json.loads(site.read(host, f"{DIR}/deployment.json"))["rank"] == rank
    assert site.read(site.head, LOCK) is None
    assert "result=ok" in site.read(site.head, AUDIT).splitlines()[-1]

    status = site.cli("--json", "status", "--profile", "sandbox")
    assert status.code == 0, status
    doc = status.json()
    assert doc["ok"] and doc["endpoint"] == endpoint and doc["problems"] == []
    assert doc["drift"] == []  # compared with the profile plus the serve's own --set, as recorded
    assert [(h["rank"], h["state"]) for h in doc["hosts"]] == [(0, "running"), (1, "running"), (2, "running")]
    assert doc["health"]["models"] == ["deepseek-v4.1-flash"]
    assert doc["health"]["health"] is None and isinstance(doc["health"]["max_model_len"], int)  # from /v1/models
    human = site.cli("status", "--profile", "sandbox")
    health_line = next(line for line in human.stdout.splitlines() if line.startswith("health:"))
    # nothing claimed about ranks: the real /health does not say how many joined
    assert health_line.startswith("health: ok; models: deepseek-v4.1-flash") and "ranks" not in health_line, human
    # -v: every remote command, per host, on stderr before it runs; stdout stays one JSON document
    verbose = site.cli("-v", "--json", "status", "--profile", "sandbox")
    assert verbose.code == 0 and verbose.json()["ok"], verbose
    for host in site.hosts:
        assert f"[{host.name}] $ sh -c " in verbose.stderr
    assert "[spark-1] $ " in verbose.stderr and verbose.stderr.count(" $ ") >= 3 * len(site.hosts)

    chat = httpx.post(endpoint + "/v1/chat/completions", timeout=30, json={
        "model": "deepseek-v4.1-flash", "max_tokens": 50, "chat_template_kwargs": {"thinking": True},
        "messages": [{"role": "user", "content": "Count from 1 to 10."}]}).json()
    message = chat["choices"][0]["message"]
    assert message["reasoning"] and message["content"] and chat["usage"]["completion_tokens"] == 50

    logs = site.cli("logs", "--profile", "sandbox", "--host", site.hosts[1].name, "--tail", "20")
    assert logs.code == 0 and "rank 1: the job started" in logs.stdout and "==> spark-2 (rank 1)" in logs.stdout
    all_logs = site.cli("--json", "logs", "--profile", "sandbox", "--tail", "0").json()
    assert [h["rank"] for h in all_logs["hosts"]] == [0, 1, 2]
    assert "POST /v1/chat/completions" in all_logs["hosts"][0]["logs"]


def test_bench_through_the_endpoint(site):
    # With the stand-in's default timing TPS is ~90 at C=1 and ~67 at C=2, so a target of 80 usually gives
    # Max C = 1; on a loaded machine both may fall below it. The verdict is checked against the means measured.
    result = site.cli("--json", "bench", *PROFILE[:2], "--set", "slo.tokens_per_s=80", "--concurrency", "1,2",
                      "--requests", "4", "--max-tokens", "24", "--prompt-tokens", "64")
    assert result.code == 0, result
    doc = result.json()
    levels = {row["concurrency"]: row for row in doc["levels"]}
    assert set(levels) == {1, 2}
    # The engine's own step times are floors of what the client measures (a loaded machine only adds to
    # them). Decoding slower with more streams (+35 % per stream here, ~3.5 ms) is below this shared
    # machine's jitter; test_standin_engine checks it with delays large enough to be seen.
    timing = standin_config(doc["endpoint"])["timing"]  # the stand-in's own route: /health has no body
    for row in levels.values():
        assert row["completed"] == 4 and row["failed"] == 0
        assert row["output_tokens"]["mean"] == 24
        assert row["ttft_ms"]["mean"] >= timing["ttft_base_ms"] and row["itl_ms"]["mean"] >= timing["itl_ms"], row
        assert row["tps"]["mean"] <= 1000 / timing["itl_ms"], row  # tokens per second of one stream, at most
    assert doc["endpoint"] == f"http://{site.head.address}:8000"  # found from the head's deployment record
    assert doc["server"]["engine_config"] is None  # nothing the real /health does not give
    slo = doc["slo"]
    assert slo["tokens_per_s"] == 80
    met = []  # per level, in order: does it meet both targets on the measured means
    for lv in sorted(slo["levels"], key=lambda lv: lv["concurrency"]):
        measured = levels[lv["concurrency"]]
        assert abs(lv["tps"] - measured["tps"]["mean"]) < 0.01 and abs(lv["ttft_ms"] - measured["ttft_ms"]["mean"]) < 0.01
        if abs(lv["tps"] - 80) > 0.01:  # (a mean within rounding of the target could go either way)
            assert lv["tps_ok"] == (lv["tps"] > 80), lv
        assert lv["ttft_ok"] == (lv["ttft_ms"] <= slo["ttft_ms"]), lv
        met.append(lv["tps_ok"] and lv["ttft_ok"])
    # the largest C that meets the targets together with every smaller C
    assert slo["max_concurrency"] == (2 if all(met) else 1 if met[0] else 0), slo


def test_status_reports_what_drifted_since_the_serve(site):
    head, spark2 = site.hosts[0], site.hosts[1]
    # The profile as it would render with other values; the running engines have the old ones.
    changed = site.cli("--json", "status", *PROFILE, "--set", "max_num_seqs=3", "--env", "NCCL_DEBUG=TRACE",
                       "--set", "container.shm_size=1g")
    assert changed.code == 0, changed  # drift is reported, not failed
    drift = changed.json()["drift"]
    for host in site.hosts:
        assert f"{host.name}: the engine runs with other arguments than the profile renders now: --max-num-seqs 8 → 3" in drift
        assert f"{host.name}: environment differs from the profile for NCCL_DEBUG" in drift
        assert f"{host.name}: the container runs with other docker options than the profile renders now: --shm-size 64m → 1g" in drift
    assert len(drift) == 3 * len(site.hosts)

    # A new image under the same tag on one host (as a distribute after the serve would leave it).
    old_id = site.exec(spark2, "docker", "image", "inspect", "--format", "{{.Id}}", TAG).stdout.decode().strip()
    site.exec(spark2, "docker", "commit", "--pause=false", "sparkctl-sandbox", TAG)
    try:
        status = site.cli("--json", "status", "--profile", "sandbox")
        new_id = site.exec(spark2, "docker", "image", "inspect", "--format", "{{.Id}}", TAG).stdout.decode().strip()
    finally:
        site.exec(spark2, "docker", "tag", old_id, TAG)
        site.exec(spark2, "docker", "rmi", new_id, check=False)
    assert new_id != old_id
    assert status.code == 0, status
    assert status.json()["drift"] == [
        f"{spark2.name}: runs {old_id[7:19]} but {TAG} is {new_id[7:19]} now (distributed since the serve): "
        "`sparkctl serve` again to run it"]
    text = site.cli("status", "--profile", "sandbox", "--set", "max_num_seqs=3")
    assert text.code == 0 and f"drift: {head.name}: the engine runs with other arguments" in text.stdout


def test_concurrent_serves_one_is_refused_by_the_lock(site):
    args = [sys.executable, "-m", "sparkctl", "-i", str(site.inventory), "--json", "serve", *PROFILE]
    env = {k: v for k, v in os.environ.items() if k != "SPARKCTL_INVENTORY"}
    procs = [subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    docs = [json.loads(out) for out, _ in outs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    refused = next(d for d in docs if not d["ok"])
    assert refused["stage"] == "lock"
    assert "deploy lock spark-1:/var/lib/sparkctl/deploy.lock is held by" in refused["message"]
    assert "(serve sandbox on spark-1, spark-2, spark-3)" in refused["message"] and "--break-lock" in refused["message"]


def _plant_lock(site: Site, **info) -> None:
    """A lock as another sparkctl run leaves it: written by the hosts' login user (the one sparkctl logs
    in as), so a run that may break it can remove it."""
    from sparkctl.sandbox.layout import USER_UID

    lock = {"who": "alice@laptop", "when": "2026-01-01T00:00:00Z", "what": "serve tp4 on a, b", "token": "t", **info}
    site.exec(site.head, "sh", "-c", 'rm -rf "$1" && mkdir "$1" && printf %s "$2" > "$1/info.json" && chown -R "$3:$3" "$1"',
              "x", LOCK.rsplit("/", 1)[0], json.dumps(lock), str(USER_UID))


def test_stale_lock_is_refused_until_broken(site):
    from sparkctl.ops.lock import this_process

    # A lock left by a run from before this machine's last boot (another boot ID): its process is
    # gone, but a clone of this machine could look the same, so it needs --break-lock.
    finished = subprocess.Popen(["true"])
    finished.wait()
    _plant_lock(site, holder={**this_process(), "pid": finished.pid, "started": "1", "boot": "an-earlier-boot"})
    refused = site.cli("stop", "-y", "--profile", "sandbox")
    assert refused.code == 1 and "held by alice@laptop since 2026-01-01T00:00:00Z" in refused.stdout
    assert "has restarted since" in refused.stdout and "--break-lock" in refused.stdout
    assert site.read(site.head, LOCK) is not None and all(site.containers(h) for h in site.hosts)  # nothing touched
    status = site.cli("--json", "status", "--profile", "sandbox")
    lock = status.json()["lock"]
    assert (lock["who"], lock["holder"]) == ("alice@laptop", "dead") and "restarted since" in lock["why"]
    result = serve(site, "--break-lock")
    assert result.code == 0, result
    assert result.json()["broken_lock"]["who"] == "alice@laptop" and site.read(site.head, LOCK) is None
    assert "breaking a stale deploy lock" in result.stderr
    assert site.cli("--json", "status", "--profile", "sandbox").json()["lock"] is None


def test_a_lock_of_a_dead_run_on_this_machine_and_boot_is_released_saying_so(site):
    from sparkctl.ops.lock import this_process

    finished = subprocess.Popen(["true"])  # a pid that has exited, on this machine, since its last boot
    finished.wait()
    _plant_lock(site, holder={**this_process(), "pid": finished.pid, "started": "1"})
    result = serve(site)
    assert result.code == 0, result
    assert "releasing a stale deploy lock" in result.stderr and f"process {finished.pid}" in result.stderr, result.stderr
    assert "held by alice@laptop" in result.stderr
    assert site.read(site.head, LOCK) is None


def test_break_lock_refuses_a_live_or_unknown_holder_and_force_breaks_it(site):
    from sparkctl.ops.lock import this_process

    # Held by a live process (this test's own): --break-lock must not take it away.
    _plant_lock(site, holder=this_process())
    live = site.cli("stop", "-y", "--profile", "sandbox", "--break-lock")
    assert live.code == 1, live
    assert f"not breaking it: process {os.getpid()} on " in live.stdout and "still runs" in live.stdout
    assert site.read(site.head, LOCK) is not None and all(site.containers(h) for h in site.hosts)  # nothing touched
    text = site.cli("status", "--profile", "sandbox")
    assert "lock: the deploy lock spark-1:/var/lib/sparkctl/deploy.lock is held by alice@laptop" in text.stdout
    assert "holder live" in text.stdout

    # Taken from another machine, or by an older sparkctl that recorded no process: cannot tell.
    for holder in ({**this_process(), "host": "someone-elses-laptop"}, None):
        _plant_lock(site, **({"holder": holder} if holder else {}))
        unknown = serve(site, "--break-lock")
        assert unknown.code == 1 and unknown.json()["stage"] == "lock", unknown
        assert "cannot tell whether its run is alive" in unknown.json()["message"]
        assert "--force-break-lock" in unknown.json()["message"] and site.read(site.head, LOCK) is not None

    forced = site.cli("--json", "stop", "-y", "--profile", "sandbox", "--force-break-lock", "--timeout", "5")
    assert forced.code == 0, forced
    assert "FORCE-BREAKING the deploy lock" in forced.stderr and site.read(site.head, LOCK) is None
    assert not any(site.containers(h) for h in site.hosts)
    assert serve(site).code == 0  # back up for the tests after this one


def test_logs_follow_streams_every_host(site):
    endpoint = f"http://{site.head.address}:8000"
    argv = [sys.executable, "-m", "sparkctl", "-i", str(site.inventory), "logs", "--profile", "sandbox",
            "--follow", "--tail", "1"]
    env = {k: v for k, v in os.environ.items() if k != "SPARKCTL_INVENTORY"}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        seen = []
        deadline = time.monotonic() + 30
        sent = False
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if len(seen) >= 3 and not sent:  # the three tails arrived: make a new line on the head
                httpx.post(endpoint + "/v1/completions", json={"prompt": "follow me", "max_tokens": 2}, timeout=30)
                sent = True
            if "POST /v1/completions" in line:
                break
        assert any(l.startswith("spark-1 | ") and "POST /v1/completions" in l for l in seen), seen
        assert {l.split(" | ")[0].strip() for l in seen[:3]} == {"spark-1", "spark-2", "spark-3"}
    finally:
        proc.terminate()
        proc.wait(10)


SGLANG = ["--profile", "sglang-tp4-1m", "--set", "tensor_parallel=3", "--set", f"image.tag={TAG}",
          "--set", "container.gpus=none", "--set", "container.memory=null",
          "--set", "container.ulimits.nofile=20000:20000", "--set", "container.ulimits.memlock=8388608:8388608",
          "--set", "container.ulimits.stack=8388608:8388608"]


def test_another_profile_holding_the_port_is_named(site):
    result = site.cli("--json", "serve", *SGLANG, "--set", "memory.unified_memory_gb=2")
    assert result.code == 1, result
    message = result.json()["message"]
    # As the login user (nvidia) the stand-in head's process is not named: its container runs as root.
    assert "port 8000 (serving port) is in use by another process" in message
    assert "container sparkctl-sandbox of profile sandbox runs there (`sparkctl stop -p sandbox` first)" in message


def _ctrl_c_as_on_a_terminal() -> None:
    """The watch gets SIGINT as a user's Ctrl-C: a test run started in the background (`cmd &`, nohup)
    ignores SIGINT, and a child inherits that, so its Ctrl-C would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _restart_count(site: Site, host) -> int:
    """How often the host's engine has restarted the rank's container (-1: no such container)."""
    seen = site.exec(host, "docker", "inspect", "--format", "{{.RestartCount}}", "sparkctl-sandbox", check=False)
    return int(seen.stdout.decode().strip()) if seen.returncode == 0 else -1


def test_killed_worker_shows_in_status(site):
    victim = site.hosts[2]
    # A watch started while all is well prints, as it happens, what changed.
    env = {k: v for k, v in os.environ.items() if k != "SPARKCTL_INVENTORY"}
    watcher = subprocess.Popen([sys.executable, "-m", "sparkctl", "-i", str(site.inventory), "status",
                                "--profile", "sandbox", "--watch", "1"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_on_a_terminal)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(watcher.stdout.readline, "")), daemon=True)
    reader.start()

    def wait_for(text: str) -> bool:
        deadline = time.monotonic() + 90  # polled: ends as soon as the line is there
        while time.monotonic() < deadline:
            if any(text in line for line in list(seen)):
                return True
            time.sleep(0.1)
        return False

    try:
        assert wait_for("profile sandbox: endpoint"), seen
        site.exec(victim, "docker", "kill", "sparkctl-sandbox")
        assert wait_for(f"+ {victim.name}: exited"), seen
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(timeout=30)
        reader.join(10)
    assert any(f"- {victim.name}: running" in line for line in seen), seen
    assert any(f"+ {victim.name}: exited" in line for line in seen), seen
    assert any("+ problem: " + f"{victim.name}: container sparkctl-sandbox exited with code 137" in line for line in seen), seen
    assert watcher.returncode == 1  # the last answer had problems
    # The head ends the job when rank 2 leaves (exit 1); its restart policy (on-failure) brings it back,
    # and it waits for rank 2, which was killed on purpose and stays down. The wait asks the head's engine
    # alone (one `docker inspect`, not a whole `status` of every host each half second); status is asked
    # once the restart has happened, and a restart count only grows.
    deadline = time.monotonic() + 120
    while _restart_count(site, site.head) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    status = site.cli("--json", "status", "--profile", "sandbox")
    doc = status.json()
    assert status.code == 1
    by_name = {h["name"]: h for h in doc["hosts"]}
    assert by_name[victim.name]["state"] == "exited" and by_name[victim.name]["container"]["exit_code"] == 137
    problem = next(p for p in doc["problems"] if p.startswith(f"{victim.name}: container sparkctl-sandbox exited with code 137"))
    assert "docker does not restart a rank stopped on purpose" in problem
    assert by_name[site.head.name]["container"]["restart_count"] >= 1  # it failed when rank 2 left, and came back
    assert doc["fix"].startswith("sparkctl serve --profile sandbox --set tensor_parallel=3 --set image.tag=")
    assert not doc["health"]["ok"]
    human = site.cli("status", "--profile", "sandbox")
    assert human.code == 1 and "health: not serving" in human.stdout and "fix: sparkctl serve --profile sandbox" in human.stdout
    head_logs = site.cli("logs", "--profile", "sandbox", "--host", site.head.name).stdout
    assert "rank 2 left the job" in head_logs


def test_the_ray_launcher_serves_through_a_ray_cluster(site):
    """distributed.launcher=ray: the head runs `ray start --head && exec vllm serve ... --distributed-
    executor-backend ray`, the workers `ray start --address=HEAD:6379 --block` (the stand-in Ray)."""
    ray = ["--set", "distributed.launcher=ray", "--set", "engine_args.distributed-executor-backend=null"]
    result = serve(site, *ray)
    assert result.code == 0, result
    report = result.json()
    assert standin_config(report["endpoint"])["ranks_connected"] == 3
    workers = site.containers(site.hosts[1])
    assert workers[0]["Config"]["Cmd"][:2] == ["ray", "start"] and "--block" in workers[0]["Config"]["Cmd"]
    head_logs = site.cli("logs", "--profile", "sandbox", "--host", site.head.name).stdout
    assert "Ray cluster ready: 3 node(s)" in head_logs
    status = site.cli("--json", "status", "--profile", "sandbox")
    assert status.code == 0 and status.json()["drift"] == [], status  # compared with the serve's own --set
    # A worker node leaving breaks the job, as a dead Ray worker does in vLLM.
    site.exec(site.hosts[2], "docker", "kill", "sparkctl-sandbox")
    # The head exits non-zero and its restart policy (on-failure) brings it back, to wait for the node.
    deadline = time.monotonic() + 120  # polled: ends as soon as the head has restarted
    while time.monotonic() < deadline and _restart_count(site, site.head) < 1:
        time.sleep(0.3)
    head = site.containers(site.head)[0]
    assert head["RestartCount"] >= 1 and head["HostConfig"]["RestartPolicy"]["Name"] == "on-failure"
    head_logs = site.cli("logs", "--profile", "sandbox", "--host", site.head.name).stdout
    assert "left the cluster; a tensor parallel worker is gone, the engine exits" in head_logs


def test_stop_removes_everything_and_is_idempotent(site):
    first = site.cli("--json", "stop", "-y", "--profile", "sandbox")
    assert first.code == 0, first
    removed = {h["name"]: h["removed"] for h in first.json()["hosts"]}
    assert all(r == ["sparkctl-sandbox (exited)"] or r == ["sparkctl-sandbox (running)"] for r in removed.values()), removed
    for host in site.hosts:
        assert site.containers(host) == []
        assert site.read(host, f"{DIR}/deployment.json") is None
        assert site.read(host, f"{DIR}/engine.env")  # what ran stays readable
    again = site.cli("stop", "-y", "--profile", "sandbox")
    assert again.code == 0 and again.stdout.count("nothing to stop") == 3
    status = site.cli("--json", "status", "--profile", "sandbox")
    assert status.code == 1 and status.json()["deployed"] is False
    assert "stop profile=sandbox" in site.read(site.head, AUDIT)


def test_serve_and_stop_under_another_state_dir(site, tmp_path):
    """paths.state_dir moves the deployed files, the lock and the audit log (as for a non-root SSH user)."""
    state = "/mnt/nvme/serve-test/state"
    data = yaml.safe_load(site.inventory.read_text())
    data["paths"]["state_dir"] = state
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    served = sparkctl("-i", str(inventory), "--json", "serve", *PROFILE, timeout=120)
    assert served.code == 0, served
    for rank, host in enumerate(site.hosts):
        assert json.loads(site.read(host, f"{state}/sandbox/deployment.json"))["rank"] == rank
        assert f"VLLM_HOST_IP={host.fabric_address}" in site.read(host, f"{state}/sandbox/engine.env")
        assert site.mode(host, f"{state}/sandbox/engine.env") == 0o600
    assert "result=ok" in site.read(site.head, f"{state}/audit.log").splitlines()[-1]
    assert site.read(site.head, f"{state}/deploy.lock/info.json") is None
    status = sparkctl("-i", str(inventory), "--json", "status", "--profile", "sandbox")
    assert status.code == 0 and status.json()["endpoint"] == served.json()["endpoint"], status
    stopped = sparkctl("-i", str(inventory), "--json", "stop", "-y", "--profile", "sandbox", "--timeout", "5")
    assert stopped.code == 0, stopped
    assert site.read(site.head, f"{state}/sandbox/deployment.json") is None
    assert "stop" in site.read(site.head, f"{state}/audit.log").splitlines()[-1]


def test_api_key_end_to_end_and_smoke(site):
    """serving.api_key_env: the key reaches the engine through engine.env only, /v1/* wants it,
    serve's quick smoke, status, bench and `smoke` send it; smoke passes including the tool call."""
    key = "sk-sandbox-" + "7" * 16
    env = {"SANDBOX_API_KEY": key}
    keyed = [*PROFILE, "--set", "serving.api_key_env=SANDBOX_API_KEY"]
    inventory = ["-i", str(site.inventory)]
    served = sparkctl(*inventory, "--json", "serve", *keyed, timeout=180, env=env, module="sparkctl")
    assert served.code == 0, served
    report = served.json()
    assert [(c["name"], c["ok"]) for c in report["health"]["smoke"]["checks"]] == [
        ("models", True), ("chat", True), ("chat_stream", True)]
    endpoint = report["endpoint"]
    assert httpx.get(endpoint + "/v1/models", timeout=10).status_code == 401
    assert httpx.get(endpoint + "/health", timeout=10).status_code == 200
    assert httpx.get(endpoint + "/v1/models", timeout=10, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    for host in site.hosts:
        assert f"VLLM_API_KEY={key}" in site.read(host, f"{DIR}/engine.env").splitlines()
        assert site.mode(host, f"{DIR}/engine.env") == 0o600
        for other in ("compose.yaml", "launch.sh", "deployment.json"):
            assert key not in (site.read(host, f"{DIR}/{other}") or ""), other
        for container in site.containers(host):
            assert key not in json.dumps([container["Path"], container["Args"], container["Config"]["Cmd"]])
    assert key not in site.read(site.head, AUDIT)

    smoke = sparkctl(*inventory, "--json", "smoke", *keyed, env=env, module="sparkctl")
    assert smoke.code == 0, smoke
    checks = {c["name"]: c for c in smoke.json()["checks"]}
    assert all(c["ok"] for c in checks.values()) and {"tool_call", "tool_call_stream", "auth"} <= set(checks)
    status = sparkctl(*inventory, "--json", "status", *keyed[:2], *keyed[-2:], env=env, module="sparkctl")
    assert status.code == 0 and status.json()["health"]["ok"], status
    bench = sparkctl(*inventory, "--json", "bench", *keyed, "-c", "1", "-n", "2", "--max-tokens", "8",
                     "--warmup", "0", env=env, module="sparkctl")
    assert bench.code == 0, bench
    for result in (served, smoke, status, bench):
        assert key not in result.stdout + result.stderr
    metrics = httpx.get(endpoint + "/metrics", timeout=10).text  # open, as in vLLM
    assert "vllm:spec_decode_num_drafts_total" in metrics and "vllm:generation_tokens_total" in metrics
    unauthenticated = sparkctl(*inventory, "--json", "smoke", *keyed, module="sparkctl")  # the variable unset
    assert unauthenticated.code == 2 and "SANDBOX_API_KEY" in unauthenticated.stderr
