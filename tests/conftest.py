"""Shared fixtures: the real CLI (see clirun.py) and the example inventory; the fuzz profiles."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import docker_counting
from clirun import REPO, run_cli

# How many examples a property gets: `--hypothesis-profile=quick` (scripts/test.sh --quick) tries
# a few, the full run (the default) more; SPARKCTL_FUZZ_EXAMPLES sets the full run's count (1000
# digs deeper). Settings a test gives itself still win.
settings.register_profile("quick", max_examples=8)
settings.register_profile("full", max_examples=int(os.environ.get("SPARKCTL_FUZZ_EXAMPLES", 40)))
settings.load_profile("full")


@pytest.fixture(autouse=True, scope="session")
def _standin_rootfs_made_once():
    """Plans of the stand-in chain get the one rootfs tar this process made (rootfs_once.py)."""
    import rootfs_once
    from sparkctl.images import plan

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan, "STANDIN_ROOTFS_MAKER", rootfs_once.MAKER)
        yield
    rootfs_once.forget()


@pytest.fixture(autouse=True)
def _docker_calls_know_their_test(request):
    """SPARKCTL_TEST_DOCKER_CALLS (tests/docker_counting.py): each counted docker call names its test."""
    if docker_counting.enabled():
        docker_counting.on_test(request.node.nodeid)
    yield


@pytest.fixture(autouse=True)
def _quick_tests_keep_their_own_cache(request, tmp_path_factory, monkeypatch):
    """A quick test (neither mark) reads no cache this machine's earlier runs left: ~/.cache/sparkctl
    holds the engine surfaces every image build recorded (hundreds after a while, each read by every
    render, and one recorded under a shipped tag would change what render checks). One folder per
    test process; the other tiers keep the real one (the sandbox's router venv, the rootfs)."""
    if not any(request.node.get_closest_marker(mark) for mark in ("integration", "sandbox")):
        cache = tmp_path_factory.getbasetemp() / "xdg-cache"
        cache.mkdir(exist_ok=True)
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    yield


# The sandbox tier's processes (scripts/test.sh: `-n N --dist loadfile`) take work a file at a time, so
# what a module builds once (its site) is built once, except the fault matrix, which is four parts: the
# longest file would otherwise decide the tier's time on its own. The two replicas files are one part:
# both run on the 4-host cluster a process brings up for them (sandbox_cluster4), so together they bring
# it up, and make and import the router's image on its head, once instead of in two processes. Parts are handed out heaviest first
# (a long one started last runs alone at the end); the weights are seconds measured on a loaded 2-core
# machine, and a stale figure only orders worse (the fault matrix's serve parts: each run alone, measured after
# its looks shared one injection of a fault, docs/hardening.md: 214 s and 192 s; serve-2's engine column
# gives each look its own kill again, about three serves more at the ~11 s a serve cost there: 225).
# (pytest-xdist's own groups, `--dist loadgroup`, rename the tests' IDs, which pytest 9 no longer lets it
# do: a scheduler of our own says what goes together.)
REPLICAS_PART = "replicas"  # tests/test_replicas_sandbox.py and tests/test_replicas_sglang_sandbox.py
_REPLICAS_FILES = ("tests/test_replicas_sandbox.py", "tests/test_replicas_sglang_sandbox.py")
SANDBOX_PART_SECONDS = {
    REPLICAS_PART: 265, "fault-matrix-serve-2": 225, "fault-matrix-chain": 180,
    "tests/test_setup_sandbox.py": 160, "fault-matrix-serve-1": 214, "tests/test_faults_sandbox.py": 120,
    "tests/test_distribute_sandbox.py": 125, "tests/test_up_sglang_sandbox.py": 115, "tests/test_serve_sandbox.py": 105,
    "tests/test_up_sandbox.py": 105, "fault-matrix-up": 95, "tests/test_engram_sandbox.py": 85,
    "tests/test_model_sandbox.py": 85, "tests/sandbox/test_sandbox_cluster.py": 85, "tests/test_single_box_sandbox.py": 65,
    "tests/test_fidelity_sandbox.py": 60, "tests/sandbox/test_hostile_hosts.py": 50,
    "tests/test_doctor_sandbox.py": 40, "tests/test_engram_hostile_sandbox.py": 40, "tests/test_first_hour_sandbox.py": 35,
    "tests/remote/test_remote_sandbox.py": 25, "tests/sandbox/test_make_checkpoint_cli.py": 5,
}
UNKNOWN_PART_SECONDS = 60  # a file not in the table yet: in the middle, not last
_FAULT_MATRIX = "tests/test_fault_matrix_sandbox.py"


def sandbox_part(nodeid: str) -> str:
    """Which part of the tier a test is in: its file, the replicas files' one part, or one of the fault
    matrix's four (the serve cells by fault, tests/test_fault_matrix_sandbox.py)."""
    path, _, name = nodeid.partition("::")
    if path in _REPLICAS_FILES:
        return REPLICAS_PART
    if path != _FAULT_MATRIX:
        return path
    if name.startswith("test_fault_matrix["):
        return "fault-matrix-serve-1" if name.endswith(("-dockerd_stopped]", "-sshd_hung]")) else "fault-matrix-serve-2"
    return "fault-matrix-up" if name.startswith("test_fault_matrix_up[") else "fault-matrix-chain"


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a run without xdist (-p no:xdist) knows it not
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile" or (config.getoption("markexpr") or "").strip() != "sandbox":
        return None  # xdist's own loadfile elsewhere (the integration tier: files by their count of tests)
    from xdist.scheduler import LoadScopeScheduling

    class SandboxPartScheduling(LoadScopeScheduling):
        """loadfile, with the parts above for scopes, heaviest first."""

        def _split_scope(self, nodeid: str) -> str:
            return sandbox_part(nodeid)

        def _assign_work_unit(self, node) -> None:
            heaviest = max(self.workqueue, key=lambda part: SANDBOX_PART_SECONDS.get(part, UNKNOWN_PART_SECONDS))  # the first of equals
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # the order above, not the count of tests per part
    return SandboxPartScheduling(config, log)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def example_inventory() -> str:
    return str(REPO / "inventory.example.yaml")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed sandbox test also shows the end of each host's sshd and dockerd log: what CI
    prints is often all there is to learn why a connection dropped or an engine refused."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or "sandbox_cluster" not in getattr(item, "fixturenames", ()):
        return
    shared = getattr(item.config, "_sparkctl_sandbox", None)
    layout = getattr(shared, "info", None)
    if layout is None:
        return
    for host in layout.hosts:
        for service in ("sshd", "dockerd"):
            try:
                with open(host.logfile(service), "rb") as handle:
                    lines = handle.read().decode("utf-8", "replace").splitlines()[-12:]
            except OSError:
                continue
            report.sections.append((f"{host.name} {service}.log (end)", "\n".join(lines)))
