"""A throwaway Docker engine on this machine: its own data root, exec root and socket, no bridge, no
iptables. Started and waited for until it answers, then stopped by its PID, its mounts undone and its
folders removed. One place for that life cycle: the build and distribute tests
(tests/test_build_support.py) and the bench scripts (bench/chain_build.py, bench/distribute_bench.py).

A plain module (no pytest): the bench scripts import it with tests/ on their path.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Callable


def _search_path() -> str:
    # dockerd is in /usr/sbin on Debian, which a non-login PATH may lack
    return os.environ.get("PATH", "") + ":/usr/sbin:/sbin"


def dockerd_skip_reason() -> str | None:
    """Why no throwaway engine can start here (None: it can)."""
    if os.geteuid() != 0:
        return "a throwaway dockerd needs root"
    for binary in ("dockerd", "containerd", "runc"):
        if shutil.which(binary, path=_search_path()) is None:
            return f"{binary} is not installed (apt-get install docker.io)"
    return None


class ThrowawayDockerd:
    """``with ThrowawayDockerd() as d: d.url`` -> ``unix:///…/docker.sock``.

    ``launch`` turns dockerd's argv into the one started (bench/chain_build.py runs it inside a
    cgroup of its own); ``prefix`` names its temporary folder."""

    def __init__(self, prefix: str = "sparkctl-dockerd-", launch: Callable[[list[str]], list[str]] | None = None):
        self.root = tempfile.mkdtemp(prefix=prefix)
        # containerd's socket paths must stay under 108 bytes: keep the exec root short.
        self.exec_root = tempfile.mkdtemp(prefix="sdx-", dir="/tmp")
        self.socket = os.path.join(self.root, "docker.sock")
        self.pidfile = os.path.join(self.root, "dockerd.pid")
        self.log = os.path.join(self.root, "dockerd.log")
        self.launch = launch or (lambda argv: argv)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def env(self) -> dict:
        return {"DOCKER_HOST": self.url}

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.url, timeout=300)

    def start(self, timeout: float = 60) -> "ThrowawayDockerd":
        """Started and answering ``/_ping``; stopped again (and RuntimeError) when it exits or stays silent."""
        dockerd = shutil.which("dockerd", path=_search_path()) or "/usr/sbin/dockerd"
        argv = [dockerd, "--data-root", os.path.join(self.root, "data"), "--exec-root", self.exec_root,
                "--pidfile", self.pidfile, "-H", self.url, "--bridge=none", "--iptables=false", "--ip-masq=false"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.launch(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)
        try:
            self._wait_answering(timeout)
        except BaseException:  # also a Ctrl-C while waiting: dockerd is in a session of its own and would stay
            self.stop()
            raise
        return self

    def _wait_answering(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited: {self._log_tail()}")
            if os.path.exists(self.socket) and self._ping():
                return
            time.sleep(0.1)
        raise RuntimeError(f"dockerd did not answer within {timeout}s: {self._log_tail()}")

    def _ping(self) -> bool:
        # the engine's own health call over its socket: no docker CLI or SDK process per poll
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(1)
                sock.connect(self.socket)
                sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                return b"OK" in sock.recv(1024)
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            with open(self.log, errors="replace") as log:
                return log.read()[-2000:]
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 30) -> None:
        """SIGTERM (SIGKILL after ``grace`` seconds), then its mounts undone and its folders removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        subprocess.run(["umount", "-R", os.path.join(self.root, "data")], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.exec_root, ignore_errors=True)

    def __enter__(self) -> "ThrowawayDockerd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
