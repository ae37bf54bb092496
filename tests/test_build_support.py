"""Helpers shared by the build and distribute tests (no tests here).

``run_sparkctl`` runs the real CLI in a subprocess (clirun.run_cli). ``LocalDockerd`` is a throwaway Docker engine on this
machine (own data root, exec root and socket; no bridge, no iptables), stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from clirun import CliResult, run_cli

REPO = Path(__file__).resolve().parent.parent
SANDBOX_CHAIN = REPO / "images" / "sandbox"

def run_sparkctl(*args: str, env: dict | None = None, timeout: float = 300, cwd: str | Path | None = None) -> CliResult:
    return run_cli(*args, env=env, timeout=timeout, cwd=cwd)


def copy_chain(dest: Path, source: Path = SANDBOX_CHAIN) -> Path:
    """A private copy of a chain folder (tests change its files)."""
    shutil.copytree(source, dest, symlinks=True)
    return dest


def dockerd_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "a throwaway dockerd needs root"
    for binary in ("dockerd", "containerd", "runc"):
        if shutil.which(binary, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"{binary} is not installed (apt-get install docker.io)"
    return None


class LocalDockerd:
    """A private Docker engine for tests: ``with LocalDockerd() as d: d.url`` -> ``unix:///…/docker.sock``."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="sparkctl-dockerd-")
        # containerd's socket paths must stay under 108 bytes: keep the exec root short.
        self.exec_root = tempfile.mkdtemp(prefix="sdx-", dir="/tmp")
        self.socket = os.path.join(self.root, "docker.sock")
        self.pidfile = os.path.join(self.root, "dockerd.pid")
        self.log = os.path.join(self.root, "dockerd.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 60) -> "LocalDockerd":
        dockerd = shutil.which("dockerd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        argv = [dockerd, "--data-root", os.path.join(self.root, "data"), "--exec-root", self.exec_root,
                "--pidfile", self.pidfile, "-H", self.url, "--bridge=none", "--iptables=false", "--ip-masq=false"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited: {open(self.log).read()[-2000:]}")
            if os.path.exists(self.socket) and self._ping():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"dockerd did not answer within {timeout}s: {open(self.log).read()[-2000:]}")

    def _ping(self) -> bool:
        import socket

        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(1)
                sock.connect(self.socket)
                sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                return b"OK" in sock.recv(1024)
        except OSError:
            return False

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.url, timeout=300)

    def env(self) -> dict:
        return {"DOCKER_HOST": self.url}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        subprocess.run(["umount", "-R", os.path.join(self.root, "data")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.exec_root, ignore_errors=True)

    def __enter__(self) -> "LocalDockerd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def local_dockerd_fixture(request) -> LocalDockerd:
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
        shared = LocalDockerd().start()
        request.config._sparkctl_local_dockerd = shared
        # Stopped with the test run's fixtures (a session-scoped fixture's finalizer), not in the config's
        # clean-up, which a pytest-xdist worker runs after reporting itself done, ~10 s before it is killed.
        request.addfinalizer(shared.stop)
    return shared
