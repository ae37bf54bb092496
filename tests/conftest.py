"""Shared test helpers: run the real CLI in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.code, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr

    def json(self):
        return json.loads(self.stdout)

    def __repr__(self) -> str:
        return f"<exit {self.code}>\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def run_cli(*args: str, cwd: str | Path | None = None, env: dict | None = None, timeout: float = 120) -> CliResult:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("SPARKCTL_INVENTORY", None) if env is None or "SPARKCTL_INVENTORY" not in env else None
    proc = subprocess.run(
        [sys.executable, "-m", "sparkctl", *args],
        cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout,
    )
    return CliResult(proc)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def example_inventory() -> str:
    return str(REPO / "inventory.example.yaml")
