"""Run the real ``sparkctl`` CLI in a subprocess, as a user does. Shared by every test module.

A plain module (not conftest): with tests/sandbox/conftest.py also present, ``import conftest``
may name either file depending on collection order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_EMPTY_CONFIG_HOME = tempfile.mkdtemp(prefix="sparkctl-test-config-")


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.code, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr

    def json(self):
        return json.loads(self.stdout)

    def __repr__(self) -> str:
        return f"<exit {self.code}>\nstdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-4000:]}"


def run_cli(*args: str, cwd: str | Path | None = None, env: dict | None = None, timeout: float = 300,
            module: str = "sparkctl") -> CliResult:
    """``python -m sparkctl ARGS``. ``$SPARKCTL_INVENTORY`` and ``$SPARKCTL_RECIPES`` of the caller
    are dropped (a developer's own must not change what the tests see) unless ``env`` sets them."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("SPARKCTL_INVENTORY", "SPARKCTL_RECIPES", "SPARKCTL_PROFILE")}
    full_env["PYTHONPATH"] = str(REPO)
    full_env["XDG_CONFIG_HOME"] = _EMPTY_CONFIG_HOME  # a developer's own `sparkctl init` defaults must not leak in
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    return CliResult(proc)
