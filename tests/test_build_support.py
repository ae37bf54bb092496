"""Helpers shared by the build and distribute tests (no tests here).

``run_sparkctl`` runs the real CLI (clirun.run_cli). ``local_dockerd_fixture`` is one throwaway Docker engine per test
process (tests/throwaway_dockerd.py, whose life cycle the bench scripts share).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from clirun import CliResult, run_cli
from throwaway_dockerd import ThrowawayDockerd, dockerd_skip_reason

REPO = Path(__file__).resolve().parent.parent
SANDBOX_CHAIN = REPO / "images" / "sandbox"

def run_sparkctl(*args: str, env: dict | None = None, timeout: float = 300, cwd: str | Path | None = None) -> CliResult:
    return run_cli(*args, env=env, timeout=timeout, cwd=cwd)


def copy_chain(dest: Path, source: Path = SANDBOX_CHAIN) -> Path:
    """A private copy of a chain folder (tests change its files)."""
    shutil.copytree(source, dest, symlinks=True)
    return dest


def local_dockerd_fixture(request) -> ThrowawayDockerd:
    """One throwaway dockerd per test process, shared by every module that asks (kept on the config);
    ``request`` is a session-scoped fixture's."""
    import pytest

    shared = getattr(request.config, "_sparkctl_local_dockerd", None)
    if isinstance(shared, str):
        pytest.skip(shared)
    if shared is None:
        reason = dockerd_skip_reason()
        if reason:
            request.config._sparkctl_local_dockerd = reason
            pytest.skip(reason)
        shared = ThrowawayDockerd().start()
        request.config._sparkctl_local_dockerd = shared
        # Stopped with the test run's fixtures (a session-scoped fixture's finalizer), not in the config's
        # clean-up, which a pytest-xdist worker runs after reporting itself done, ~10 s before it is killed.
        request.addfinalizer(shared.stop)
    return shared
