"""What a real rack needs, caught on the sandbox: the RDMA devices in the container (NCCL's "No
device found" without them), doctor's device check, and an image whose engine lacks a rendered
option or variable refused by serve and render before anything starts.

Uses test_serve_sandbox's site (the stand-in image imported on every host, a checkpoint, Engram shards).
"""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest

from sandbox_fixture import sandbox_cluster  # noqa: F401  (the session's cluster)
from test_doctor_sandbox import checks_of, doctor
from test_serve_sandbox import BASE, PROFILE, TAG, site  # noqa: F401  (the module's own site)

pytestmark = pytest.mark.sandbox

VARIANT = "sparkctl-standin:fidelity-variant"


@pytest.fixture(autouse=True)
def own_surface_cache(tmp_path, monkeypatch):
    """Surfaces read by these tests' serves land in a cache of their own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def variant_rootfs(tmp_path, *, drop_flag: str | None = None, drop_env: str | None = None) -> bytes:
    """The stand-in image's rootfs with one option or variable missing from its engine: what a
    different engine build would be."""
    from rootfs_once import write_rootfs_tar  # the real maker's bytes, made once a process

    report = write_rootfs_tar(tmp_path / "standin.tar")
    out = io.BytesIO()
    with tarfile.open(report.path) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            data = src.extractfile(member).read() if member.isfile() else None
            if data is not None and member.name.endswith("sparkctl_standin/engine_flags/vllm-0.33.0.json") and drop_flag:
                flags = json.loads(data)
                del flags[drop_flag]
                data = json.dumps(flags).encode()
            if data is not None and member.name.endswith("sparkctl_standin/engine_flags/vllm-0.33.0-envs.txt") and drop_env:
                data = b"".join(line + b"\n" for line in data.split() if line != drop_env.encode())
            if data is not None:
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def import_everywhere(site, data: bytes, tag: str) -> None:  # noqa: F811
    from sparkctl.standin.rootfs import docker_import_argv

    for host in site.hosts:
        site.exec(host, *docker_import_argv(tag), input=data)


def engine_logs(site, host, name: str, wanted: str, timeout: float = 60) -> str:  # noqa: F811
    deadline = time.monotonic() + timeout
    while True:
        logs = site.exec(host, "docker", "logs", name, check=False)
        text = (logs.stdout + logs.stderr).decode(errors="replace")
        if wanted in text or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


@pytest.mark.parametrize("with_device", [False, True])
def test_the_engine_without_the_rdma_device_fails_as_nccl_would(site, with_device):  # noqa: F811
    """NCCL_IB_HCA set and no verbs device in the container (the old render: no --device) -> NCCL's
    "No device found" and no engine; with --device /dev/infiniband the rank goes on to the rendezvous."""
    host, name = site.hosts[1], "fidelity-nccl"
    device = ["--device", "/dev/infiniband"] if with_device else []
    site.exec(host, "docker", "run", "-d", "--name", name, "--network", "host", *device,
              "-e", "NCCL_IB_HCA=rocep1s0f0", "-v", f"{BASE}/model:/model:ro", TAG,
              "vllm", "serve", "/model", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "0",
              "--master-port", "29611", "--port", "8611")
    try:
        if with_device:
            logs = engine_logs(site, host, name, "rendezvous open on port 29611")
            assert "rendezvous open on port 29611" in logs and "No device found" not in logs, logs
        else:
            logs = engine_logs(site, host, name, "NCCL found no RDMA device")
            assert "NCCL INFO NET/IB : No device found." in logs, logs
            state = json.loads(site.exec(host, "docker", "inspect", "--format", "{{json .State}}", name).stdout)
            deadline = time.monotonic() + 30
            while state["Running"] and time.monotonic() < deadline:
                time.sleep(0.5)
                state = json.loads(site.exec(host, "docker", "inspect", "--format", "{{json .State}}", name).stdout)
            assert not state["Running"] and state["ExitCode"] == 1
    finally:
        site.exec(host, "docker", "rm", "-f", name, check=False)


def test_a_host_without_rdma_devices_is_named_by_doctor_and_serve(site):  # noqa: F811
    from sparkctl.sandbox import cluster

    worker = site.hosts[2]
    _, report = doctor(site.inventory, *PROFILE[:4])
    for host in site.hosts:
        check = checks_of(report)[host.name]["rdma_devices"]
        assert check["status"] == "pass" and "/dev/infiniband/uverbs0" in check["detail"], check
    cluster.set_rdma_devices(site.cluster.info, worker.name, present=False)
    try:
        _, report = doctor(site.inventory, *PROFILE[:4])
        check = checks_of(report)[worker.name]["rdma_devices"]
        assert check["status"] == "fail" and "No device found" in check["detail"] and "ib_uverbs" in check["hint"]
        # docker itself refuses --device /dev/infiniband on a box whose RDMA modules are not loaded
        result = site.cli("--json", "serve", *PROFILE, "--timeout", "60")
        assert result.code == 1, result
        report = result.json()
        assert report["stage"] == "start" and worker.name in report["message"], report
        failed = next(h for h in report["hosts"] if h["name"] == worker.name)
        assert "/dev/infiniband" in failed["error"], failed
    finally:
        cluster.set_rdma_devices(site.cluster.info, worker.name, present=True)
    result = site.cli("--json", "serve", *PROFILE, "--timeout", "120")
    assert result.code == 0, result
    container = site.containers(worker)[0]
    assert [d["PathOnHost"] for d in container["HostConfig"]["Devices"]] == ["/dev/infiniband"]
    assert site.stop().code == 0


@pytest.mark.parametrize("drop_flag,drop_env,named", [
    ("--limit-mm-per-prompt", None, "has no option --limit-mm-per-prompt"),
    (None, "VLLM_HOST_IP", "does not read the environment variable VLLM_HOST_IP"),
])
def test_an_image_lacking_a_rendered_option_or_variable_is_refused(site, tmp_path, drop_flag, drop_env, named):  # noqa: F811
    import_everywhere(site, variant_rootfs(tmp_path, drop_flag=drop_flag, drop_env=drop_env), VARIANT)
    try:
        result = site.cli("--json", "serve", *PROFILE, "--set", f"image.tag={VARIANT}", "--timeout", "60")
        assert result.code == 1, result
        report = result.json()
        assert report["stage"] == "check", report
        assert named in report["message"] and report["message"].startswith("the image on spark-1 does not accept")
        assert all(not site.containers(h) for h in site.hosts)  # refused before anything started
        # the surface was kept by image ID: render now refuses the same deployment offline
        rendered = site.cli("render", *PROFILE, "--set", f"image.tag={VARIANT}")
        assert rendered.code == 2, rendered
        assert named in rendered.stderr and f"image {VARIANT}" in rendered.stderr
        # the stock stand-in image still serves the same profile
        assert site.cli("render", *PROFILE).code == 0
    finally:
        for host in site.hosts:
            site.exec(host, "docker", "rmi", "-f", VARIANT, check=False)
