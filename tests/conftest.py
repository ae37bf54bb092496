"""Shared fixtures: the real CLI (see clirun.py) and the example inventory; the fuzz profiles."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

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
