"""Optional: the exported recipe.yaml through sparkrun 0.4.2's own dry run (bench/sparkrun_export.py).

Skips cleanly when the sparkrun venv is absent (it needs Python >= 3.12; never a CI requirement):
    python3.12 -m venv /tmp/sparkrun-venv && /tmp/sparkrun-venv/bin/pip install sparkrun==0.4.2
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPARKRUN_PYTHON = os.environ.get("SPARKRUN_PYTHON", "/tmp/sparkrun-venv/bin/python")


@pytest.mark.integration
@pytest.mark.skipif(not Path(SPARKRUN_PYTHON).exists(), reason=f"no sparkrun venv at {SPARKRUN_PYTHON}")
@pytest.mark.parametrize("profile", ["tp4"])
def test_sparkrun_starts_the_same_container_and_command(profile):
    proc = subprocess.run([sys.executable, "bench/sparkrun_export.py", "--profile", profile,
                           "--sparkrun-python", SPARKRUN_PYTHON], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for item in ("device /dev/infiniband", "memory 112g", "mount /mnt/nvme/engram:/engram", "capability IPC_LOCK",
                 "ulimit memlock=-1:-1", "every engine option"):
        assert f"ok   {item}" in proc.stdout, proc.stdout
