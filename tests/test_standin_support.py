"""Helpers for the stand-in, serve and bench tests (no tests here): engine processes on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from clirun import REPO, CliResult, run_cli
from sparkctl.httpclient import tls_context

FAST_PEERS = {"SPARKCTL_STANDIN_HEARTBEAT_S": "0.2", "SPARKCTL_STANDIN_PEER_TIMEOUT_S": "3",
              "SPARKCTL_STANDIN_RENDEZVOUS_TIMEOUT_S": "30"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proc:
    """One engine process; its output goes to a file the test can read at any time."""

    def __init__(self, argv: list[str], log: Path, env: dict | None = None, cwd: Path = REPO):
        self.log = log
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKCTL_STANDIN_", "DSV41_"))}
        full_env = {**inherited, **FAST_PEERS, **(env or {})}
        self.handle = open(log, "wb")
        self.popen = subprocess.Popen(argv, stdout=self.handle, stderr=subprocess.STDOUT, env=full_env, cwd=cwd)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = 20) -> int:
        try:
            return self.popen.wait(timeout)
        finally:
            self.handle.flush()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self.handle.close()

    def wait_for_output(self, text: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.popen.poll() is not None and text not in self.output:
                raise AssertionError(f"process exited {self.popen.returncode} before printing {text!r}:\n{self.output}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout}s:\n{self.output}")
            time.sleep(0.05)


def vllm_argv(model: str, *, port: int, rank: int = 0, nnodes: int = 1, master_port: int = 29501, extra=()) -> list[str]:
    argv = [sys.executable, "-m", "sparkctl.standin", "vllm", "serve", model, "--served-model-name", "dsv41",
            "--host", "127.0.0.1", "--port", str(port), "--tensor-parallel-size", str(nnodes),
            "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", "127.0.0.1",
            "--master-port", str(master_port), "--max-model-len", "4096"]
    if rank > 0:
        argv.append("--headless")
    return argv + list(extra)


def wait_http(url: str, timeout: float = 20, proc: Proc | None = None) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, timeout=2, verify=tls_context())
        except httpx.TransportError:
            if proc is not None and proc.popen.poll() is not None:
                raise AssertionError(f"engine exited {proc.popen.returncode}:\n{proc.output}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def standin_config(base_url: str, proc: Proc | None = None, timeout: float = 20) -> dict:
    """The stand-in's engine_config, once its API answers: read from its own route (``STATE_PATH``),
    since /health carries no body, as the real engines' does not."""
    from sparkctl.standin.server import STATE_PATH

    wait_http(base_url + "/health", timeout=timeout, proc=proc)
    answer = httpx.get(base_url + STATE_PATH, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["engine_config"]


def sparkctl(*args: str, module: str = "sparkctl", timeout: float = 300, env: dict | None = None) -> CliResult:
    """The real CLI (tests/clirun.py: in this process, or ``python -m sparkctl ARGS`` as a subprocess
    with SPARKCTL_TEST_SUBPROCESS=1)."""
    return run_cli(*args, module=module, timeout=timeout, env=env)
