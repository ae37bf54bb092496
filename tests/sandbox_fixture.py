"""A real sandbox cluster for the tests that need one, brought up once per test session.

Import the fixtures into a conftest (``from sandbox_fixture import sandbox_cluster, ...``); every
conftest that does so shares the one cluster (it is kept on the pytest config object), which is
torn down with the test run's fixtures.

The test cluster never touches a developer's own sandboxes: it lives under a private state root in
/tmp, is named after the test process (``t<pid>``, so its interfaces are unique too) and takes the
first pair of subnets that clashes with no route on the machine. The sandbox tier runs several test
processes at once (pytest-xdist): each brings up clusters of its own, and the pick of a subnet pair is
one step machine-wide (``cluster.up``), so two processes never take the same pair. Clusters left behind by a test
session that was killed are removed first (only those: state roots of ours whose process is gone).
SPARKCTL_TEST_KEEP_SANDBOX=1 leaves the cluster (and its sshd/dockerd logs) up after the session.
"""

from __future__ import annotations

import glob
import io
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass

import pytest

import docker_counting

HOSTS = 3
ROOT_PREFIX = "/tmp/sparkctl-sbx-"


def skip_reason() -> str | None:
    """Why the sandbox cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "sandbox tests need root (network namespaces, bridges, sshd and dockerd per host)"
    from sparkctl.sandbox.cluster import missing_binaries

    missing = missing_binaries()
    if missing:
        return "sandbox tests need: " + ", ".join(missing)
    if not os.path.isdir("/run/netns") and shutil.which("ip") is None:
        return "no iproute2"
    return None


@dataclass
class SandboxUnderTest:
    info: object  # sparkctl.sandbox.layout.SandboxLayout
    root: str
    seconds_up: float
    subnets: tuple[str, str]

    @property
    def name(self) -> str:
        return self.info.name

    def targets(self, **overrides):
        from sparkctl.sandbox import cluster

        return cluster.targets(self.info, **overrides)


def _remove_stale_test_clusters() -> None:
    from sparkctl.sandbox import cluster, procs

    for state in glob.glob(ROOT_PREFIX + "*/*/state.json"):
        root = os.path.dirname(os.path.dirname(state))
        name = os.path.basename(os.path.dirname(state))
        pid = name.lstrip("abcdefghijklmnopqrstuvwxyz")
        if not pid.isdigit() or procs.is_alive(int(pid)):
            continue
        previous = os.environ.get("SPARKCTL_SANDBOX_ROOT")
        os.environ["SPARKCTL_SANDBOX_ROOT"] = root
        try:
            cluster.down(name)
        finally:
            if previous is None:
                os.environ.pop("SPARKCTL_SANDBOX_ROOT", None)
            else:
                os.environ["SPARKCTL_SANDBOX_ROOT"] = previous
        shutil.rmtree(root, ignore_errors=True)


_CLAIMED_PREFIXES: dict[str, str] = {}


def sandbox_name(prefix: str, purpose: str) -> str:
    """The name of a test's own sandbox: one prefix per purpose in a test process. Interface and
    namespace names come from the sandbox name, so two sandboxes alive at once under one name
    collide and the second `up` rightly refuses; claiming the prefix here makes that a clear error
    at the point of the mistake instead of a failure that depends on which tests ran first."""
    owner = _CLAIMED_PREFIXES.setdefault(prefix, purpose)
    if owner != purpose:
        raise AssertionError(f"sandbox name prefix {prefix!r} belongs to {owner!r}; {purpose!r} needs its own")
    return f"{prefix}{os.getpid()}"


def _bring_up(hosts: int = HOSTS, prefix: str = "t") -> SandboxUnderTest:
    from sparkctl.sandbox import cluster

    _remove_stale_test_clusters()
    root = tempfile.mkdtemp(prefix=ROOT_PREFIX)
    os.environ["SPARKCTL_SANDBOX_ROOT"] = root
    name = sandbox_name(prefix, f"the session's {hosts}-host cluster")
    started = time.monotonic()
    try:
        info = cluster.up_on_free_subnets(name, hosts, cluster.subnet_pairs(251, 200))
    except cluster.SandboxError:
        cluster.down(name)
        raise
    docker_counting.install(name, [host.bin_dir for host in info.hosts])  # opt-in measurement (SPARKCTL_TEST_DOCKER_CALLS)
    return SandboxUnderTest(info=info, root=root, seconds_up=time.monotonic() - started,
                            subnets=(info.mgmt_subnet, info.fabric_subnet))


def _tear_down(test_cluster: SandboxUnderTest) -> None:
    from sparkctl.sandbox import cluster

    docker_counting.collect(test_cluster.name)
    if os.environ.get("SPARKCTL_TEST_KEEP_SANDBOX"):  # debugging: keep the hosts' logs (the next session removes it)
        print(f"\nsandbox kept: {test_cluster.info.root}")
        return
    os.environ["SPARKCTL_SANDBOX_ROOT"] = test_cluster.root
    try:
        report = cluster.down(test_cluster.name)
    finally:
        os.environ.pop("SPARKCTL_SANDBOX_ROOT", None)
    if report.ok:
        shutil.rmtree(test_cluster.root, ignore_errors=True)


# _FINALIZED_WITH_THE_RUN: a cluster goes down with the test run's fixtures (the last test's teardown),
# not in the config's clean-up: a pytest-xdist worker runs that after it has told the controller it is done,
# and the controller kills it 10 s later, which left a loaded machine's clusters running.


@pytest.fixture(scope="session")
def sandbox_cluster(request) -> SandboxUnderTest:
    """The session's sandbox (3 hosts). Skips the test when the machine cannot run one."""
    config = request.config
    shared = getattr(config, "_sparkctl_sandbox", None)
    if isinstance(shared, str):  # an earlier attempt failed or was skipped: same outcome for every test
        pytest.skip(shared)
    if shared is None:
        reason = skip_reason()
        if reason:
            config._sparkctl_sandbox = reason
            pytest.skip(reason)
        shared = _bring_up()
        config._sparkctl_sandbox = shared
        request.addfinalizer(lambda: _tear_down(shared))  # see _FINALIZED_WITH_THE_RUN
    os.environ["SPARKCTL_SANDBOX_ROOT"] = shared.root
    return shared


@pytest.fixture(scope="session")
def sandbox_cluster4(request) -> SandboxUnderTest:
    """A second, 4-host sandbox for the tests that need two replicas of TP2 (brought up on first use)."""
    config = request.config
    shared = getattr(config, "_sparkctl_sandbox4", None)
    if isinstance(shared, str):
        pytest.skip(shared)
    if shared is None:
        reason = skip_reason()
        if reason:
            config._sparkctl_sandbox4 = reason
            pytest.skip(reason)
        previous = os.environ.get("SPARKCTL_SANDBOX_ROOT")
        shared = _bring_up(4, "r")
        config._sparkctl_sandbox4 = shared
        request.addfinalizer(lambda: _tear_down(shared))  # see _FINALIZED_WITH_THE_RUN
        if previous is not None:
            os.environ["SPARKCTL_SANDBOX_ROOT"] = previous
    return shared


def busybox_rootfs_tar() -> bytes | None:
    """A tiny image rootfs (static busybox, /bin/sh) as a tar, for `docker import`; None without busybox."""
    busybox = shutil.which("busybox") or ("/bin/busybox" if os.path.exists("/bin/busybox") else None)
    if busybox is None:
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in ("sh", "hostname", "cat", "ip", "sleep"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return buffer.getvalue()


@pytest.fixture(scope="session")
def busybox_tar() -> bytes:
    data = busybox_rootfs_tar()
    if data is None:
        pytest.skip("busybox (busybox-static) is not installed")
    return data


@pytest.fixture
def isolated_home(tmp_path, monkeypatch) -> str:
    """HOME in a temporary folder and no ssh-agent: tests never read or write the real ~/.ssh."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return str(home)



def give_to_user(*paths: str) -> None:
    """Hand what a test wrote into hosts' folders (as root, from this machine) to the hosts' login user."""
    from sparkctl.sandbox.hostetc import give_to_user as give

    for path in paths:
        give(path)
