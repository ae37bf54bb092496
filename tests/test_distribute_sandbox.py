"""`sparkctl distribute` on the sandbox cluster (3 hosts, real sshd and dockerd each), for real.

The source is this machine's throwaway engine (the "control machine"), or a cluster host with
--from. Every result is checked on the hosts' own engines, through their sockets, not only
through what sparkctl reports.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from sandbox_fixture import sandbox_cluster  # noqa: F401  (the session's shared sandbox)
from test_build_support import copy_chain, local_dockerd_fixture, run_sparkctl

from sparkctl.images.archive import SaveStreamParser, thin_copy
from sparkctl.images.inputs import chain_ids
from sparkctl.sandbox import cluster, procs

pytestmark = pytest.mark.sandbox

TAG = "sparkctl-sandbox:latest"
HOSTS = ["spark-1", "spark-2", "spark-3"]


@pytest.fixture(scope="session")
def local_dockerd(request):
    return local_dockerd_fixture(request)


@pytest.fixture(scope="module")
def env(sandbox_cluster, local_dockerd):
    return {"SPARKCTL_INVENTORY": sandbox_cluster.info.inventory, **local_dockerd.env()}


@pytest.fixture(scope="module")
def chain(tmp_path_factory, env, local_dockerd):
    folder = copy_chain(tmp_path_factory.mktemp("dist") / "sandbox")
    # Without the stand-in engine's python: a ~6 MB image keeps these transfer tests quick, and
    # their bandwidth limits and stall timeouts are sized for it.
    spec = folder / "chain.yaml"
    spec.write_text(spec.read_text().replace("    standin_engine: true", "    standin_engine: false"))
    result = run_sparkctl("--json", "build", "--image", str(folder), env=env)
    assert result.code == 0, result
    return folder


@pytest.fixture(scope="module")
def engines(sandbox_cluster):
    import docker

    clients = {h.name: docker.DockerClient(base_url=f"unix://{h.docker_socket}", timeout=120) for h in sandbox_cluster.info.hosts}
    yield clients
    for client in clients.values():
        client.close()


def forget(engines, *names: str) -> None:
    """Remove this chain's images from hosts (test set-up), so they need a full archive again."""
    for name in names:
        client = engines[name]
        for image in client.images.list(all=True, filters={"label": "org.sparkctl.chain=sandbox"}):
            for tag in image.tags:
                client.images.remove(tag, force=True)
        for image in client.images.list(all=True, filters={"label": "org.sparkctl.chain=sandbox"}):
            try:
                client.images.remove(image.id, force=True)
            except Exception:  # a parent removed with its child already
                pass


def host_image_id(engines, name: str, tag: str = TAG) -> str | None:
    import docker

    try:
        return engines[name].images.get(tag).id
    except docker.errors.ImageNotFound:
        return None


def local_save(local_dockerd, tag: str = TAG) -> tuple[bytes, list[str], str]:
    client = local_dockerd.client()
    try:
        image = client.images.get(tag)
        data = b"".join(client.api.get_image(tag, chunk_size=1 << 20))
        return data, image.attrs["RootFS"]["Layers"], image.id
    finally:
        client.close()


def distribute(env, *args: str):
    return run_sparkctl("--json", "distribute", "--image", "sandbox", *args, env=env)


def by_name(doc) -> dict:
    return {h["name"]: h for h in doc["hosts"]}


def test_first_distribution_sends_the_full_image_to_every_host_at_once(chain, env, engines, local_dockerd):
    forget(engines, *HOSTS)
    archive, _, image_id = local_save(local_dockerd)
    result = distribute(env)
    assert result.code == 0, result
    doc = result.json()
    assert set(doc) == {"image", "image_id", "hosts"} and (doc["image"], doc["image_id"]) == (TAG, image_id)
    for row in doc["hosts"]:
        assert set(row) == {"name", "status", "mode", "bytes_sent", "seconds", "error"}
        assert (row["status"], row["mode"], row["error"]) == ("loaded", "full", None)
        assert row["bytes_sent"] == len(archive) and row["seconds"] > 0
        assert host_image_id(engines, row["name"]) == image_id
    assert "via 10." in result.stderr  # the management address: the fabric is not reachable from here


def test_a_rerun_skips_every_host_and_sends_nothing(chain, env, engines):
    result = distribute(env)
    assert result.code == 0, result
    assert [(h["status"], h["mode"], h["bytes_sent"], h["error"]) for h in result.json()["hosts"]] == [("skipped", "none", 0, None)] * 3


def test_a_changed_patch_sends_about_the_patch_layer_not_the_image(chain, env, engines, local_dockerd):
    full, old_layers, old_id = local_save(local_dockerd)
    (chain / "patch" / "attention.py").write_text('ORIGIN = "patch"\nPATCHED = True\nREVISION = 2\n')
    built = run_sparkctl("--json", "build", "--image", str(chain), env=env)
    assert built.code == 0, built
    assert [l["cached"] for l in built.json()["layers"]] == [True, True, True, True, False]
    archive, layers, new_id = local_save(local_dockerd)
    expected = len(b"".join(thin_copy(SaveStreamParser(layers).feed(archive), set(chain_ids(old_layers)))))
    dry = distribute(env, "--dry-run")
    assert [(h["status"], h["mode"]) for h in dry.json()["hosts"]] == [("planned", "thin")] * 3 and dry.json()["dry_run"]
    assert {host_image_id(engines, n) for n in HOSTS} == {old_id}  # a dry run changes nothing
    result = distribute(env, "--transport", "paramiko")
    assert result.code == 0, result
    for row in result.json()["hosts"]:
        assert (row["status"], row["mode"]) == ("loaded", "thin")
        assert row["bytes_sent"] == expected, (row, expected, len(archive))
        assert host_image_id(engines, row["name"]) == new_id
    assert expected < len(full) * 0.05


def kill_sshd(sandbox_cluster, host: str) -> None:
    """The host's sshd dies: the listener and every session it serves (ours, mid-transfer)."""
    listener = cluster.host_pids(sandbox_cluster.info, host)["sshd"]
    # Listed first: once the listener is gone, its sessions have another parent.
    sessions = [pid for pid in procs.descendants(listener) if procs.process_name(pid) == "sshd"]
    cluster.stop_sshd(sandbox_cluster.info, host)
    procs.signal_pids(sessions, signal.SIGKILL)


def _run_in_process(sandbox_cluster, local_dockerd, monkeypatch, **options):
    from sparkctl.config.inventory import load_inventory
    from sparkctl.ops.distribute import DistributeOptions, run_distribute
    from sparkctl.output import Output

    monkeypatch.setenv("DOCKER_HOST", local_dockerd.url)
    inventory = load_inventory(sandbox_cluster.info.inventory)
    return run_distribute(inventory, DistributeOptions(tag=TAG, **options), Output())


def test_a_host_whose_sshd_dies_mid_transfer_fails_alone_and_a_rerun_completes_it(
        chain, env, engines, local_dockerd, sandbox_cluster, monkeypatch):
    forget(engines, *HOSTS)
    archive, _, image_id = local_save(local_dockerd)
    killed = threading.Event()
    sent_when_killed = {}

    def on_progress(host: str, sent: int) -> None:
        if host == "spark-2" and sent > 1_000_000 and not killed.is_set():
            killed.set()
            sent_when_killed["spark-2"] = sent
            kill_sshd(sandbox_cluster, "spark-2")

    try:
        report = _run_in_process(sandbox_cluster, local_dockerd, monkeypatch, transport="openssh", bwlimit=2.0,
                                 retries=1, retry_delay=0.2, on_progress=on_progress)
        assert killed.is_set() and sent_when_killed["spark-2"] < len(archive)
        rows = {h.name: h for h in report.hosts}
        assert [(rows[n].status, rows[n].mode) for n in ("spark-1", "spark-3")] == [("loaded", "full")] * 2
        assert rows["spark-2"].status == "failed" and rows["spark-2"].attempts == 2
        assert "spark-2" in rows["spark-2"].error and "refused" in rows["spark-2"].error  # the retry found sshd gone
        assert [host_image_id(engines, n) for n in HOSTS] == [image_id, None, image_id]
        assert not report.ok
    finally:
        cluster.start_sshd(sandbox_cluster.info, "spark-2")
    rerun = distribute(env)
    assert rerun.code == 0, rerun
    assert [(h["status"], h["mode"]) for h in rerun.json()["hosts"]] == [("skipped", "none"), ("loaded", "full"), ("skipped", "none")]
    assert host_image_id(engines, "spark-2") == image_id


def _docker_load_pid(sandbox_cluster, host: str) -> int | None:
    netns = os.stat(sandbox_cluster.info.host(host).netns_path).st_ino
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if cmdline[:2] == [b"docker", b"load"] and os.stat(f"/proc/{entry}/ns/net").st_ino == netns:
                return int(entry)
        except OSError:
            continue
    return None


def test_a_host_that_falls_behind_is_detached_and_retried_with_its_own_read(
        chain, env, engines, local_dockerd, sandbox_cluster, monkeypatch):
    forget(engines, *HOSTS)
    archive, _, image_id = local_save(local_dockerd)
    stopped: dict[str, int] = {}

    def on_progress(host: str, sent: int) -> None:
        if host == "spark-3" and sent > 500_000 and not stopped:
            pid = _docker_load_pid(sandbox_cluster, "spark-3")
            if pid is not None:
                stopped["pid"] = pid
                os.kill(pid, signal.SIGSTOP)  # the host stops reading (a stuck disk, a busy box)
                threading.Timer(10.0, lambda: os.kill(pid, signal.SIGCONT)).start()

    report = _run_in_process(sandbox_cluster, local_dockerd, monkeypatch, transport="openssh", bwlimit=3.0,
                             stall_timeout=3.0, queue_bytes=256 * 1024, retries=1, retry_delay=0.2,
                             on_progress=on_progress)
    assert stopped, "spark-3's docker load was never seen"
    rows = {h.name: h for h in report.hosts}
    assert (rows["spark-3"].status, rows["spark-3"].attempts) == ("loaded", 2)
    # On a loaded machine a healthy host's docker load may also start later than the stall timeout:
    # then it is detached and retried with its own read like spark-3, never lost.
    retried = [n for n in HOSTS if rows[n].attempts == 2]
    assert all(rows[n].status == "loaded" and rows[n].attempts in (1, 2) for n in HOSTS)
    assert report.source_bytes == (1 + len(retried)) * len(archive)  # the shared read, then each retried host's own
    assert [host_image_id(engines, n) for n in HOSTS] == [image_id] * 3
    assert rows["spark-3"].bytes_sent > len(archive)


def test_build_on_the_head_and_stream_from_it(chain, env, engines, sandbox_cluster):
    built = run_sparkctl("--json", "build", "--image", str(chain), "--on", "spark-1", env=env, timeout=300)
    assert built.code == 0, built
    head_id = built.json()["image_id"]
    assert host_image_id(engines, "spark-1") == head_id
    again = run_sparkctl("--json", "build", "--image", str(chain), "--on", "spark-1", env=env)
    assert again.code == 0 and [l["cached"] for l in again.json()["layers"]] == [True] * 5, again
    forget(engines, "spark-3")
    result = distribute(env, "--from", "spark-1", "--hosts", "spark-2,spark-3")
    assert result.code == 0, result
    rows = by_name(result.json())
    assert set(rows) == {"spark-2", "spark-3"}
    assert rows["spark-2"]["status"] == "loaded" and rows["spark-3"]["status"] == "loaded"
    assert rows["spark-3"]["mode"] == "full"
    assert host_image_id(engines, "spark-2") == host_image_id(engines, "spark-3") == head_id
    assert "from spark-1's engine" in result.stderr
    # Host to host: spark-1 itself logged in to spark-3 over the fabric (with the hosts' own key).
    spark1_fabric = sandbox_cluster.info.host("spark-1").fabric_address
    assert f"via {sandbox_cluster.info.host('spark-3').fabric_address} from spark-1" in result.stderr
    assert f"Accepted publickey for nvidia from {spark1_fabric} " in _sshd_log(sandbox_cluster, "spark-3")


def _sshd_log(sandbox_cluster, host: str) -> str:
    with open(sandbox_cluster.info.host(host).logfile("sshd"), errors="replace") as handle:
        return handle.read()


def test_a_source_host_that_cannot_reach_a_host_falls_back_to_sending_through_here(
        chain, env, engines, local_dockerd, sandbox_cluster, monkeypatch):
    """Without SSH from spark-1 to the others, the first round fails for them and the retry streams
    spark-1's image through this machine: the hosts still get it."""
    assert host_image_id(engines, "spark-1") is not None  # built there by the test above
    forget(engines, "spark-2", "spark-3")
    key = Path(sandbox_cluster.info.host("spark-1").user_home) / ".ssh" / "id_ed25519"
    hidden = key.with_suffix(".hidden")
    key.rename(hidden)
    try:
        report = _run_in_process(sandbox_cluster, local_dockerd, monkeypatch, source="spark-1", hosts=["spark-2", "spark-3"],
                                 retry_delay=0.1)
    finally:
        hidden.rename(key)
    rows = {h.name: h for h in report.hosts}
    assert [(rows[n].status, rows[n].attempts) for n in ("spark-2", "spark-3")] == [("loaded", 2), ("loaded", 2)]
    assert host_image_id(engines, "spark-2") == host_image_id(engines, "spark-3") == host_image_id(engines, "spark-1")


def test_the_fabric_route_keeps_the_host_key_check_on_the_management_name(sandbox_cluster):
    """Run the bulk-stream ssh command from spark-1 (which reaches the fabric) to spark-2's fabric address."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.remote.openssh import Route, client_argv as openssh_argv

    inventory = load_inventory(sandbox_cluster.info.inventory)
    spark2 = next(h for h in inventory.hosts if h.name == "spark-2")
    target = inventory.ssh_target(spark2)
    for via_fabric, expect in ((True, 0), (False, 255)):
        argv = openssh_argv(Route("spark-2", target, spark2.fabric_address, via_fabric=via_fabric), ["hostname"])
        proc = cluster.exec_in_host(sandbox_cluster.info, "spark-1", argv, timeout=30)
        assert proc.returncode == expect, proc.stderr
        if expect == 0:
            assert proc.stdout.decode().strip() == "spark-2"
        else:
            assert b"Host key verification failed" in proc.stderr


def test_unknown_hosts_and_missing_images_are_clear_errors(chain, env):
    result = distribute(env, "--hosts", "spark-1,nope")
    assert result.code == 2 and "unknown host 'nope'" in result.stderr
    missing = run_sparkctl("distribute", "--image", "vllm-dsv41", env=env)
    assert missing.code == 1 and "vllm-dsv41:latest is not on this machine's Docker engine" in missing.stderr
