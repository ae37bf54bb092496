"""Optional: the exported recipe.yaml through sparkrun 0.4.2's own dry run (bench/sparkrun_export.py),
for every shipped profile that exports one recipe.

Skips cleanly when the sparkrun venv is absent (it needs Python >= 3.12; never a CI requirement):
    python3.12 -m venv /tmp/sparkrun-venv && /tmp/sparkrun-venv/bin/pip install sparkrun==0.4.2
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkctl.config.profile import available_profiles
from test_render_helpers import INVENTORY, render

REPO = Path(__file__).resolve().parent.parent
SPARKRUN_PYTHON = os.environ.get("SPARKRUN_PYTHON", "/tmp/sparkrun-venv/bin/python")
SHIPPED = sorted(name for name in available_profiles(REPO / "recipes") if not name.startswith("_"))


@pytest.mark.integration
@pytest.mark.skipif(not Path(SPARKRUN_PYTHON).exists(), reason=f"no sparkrun venv at {SPARKRUN_PYTHON}")
@pytest.mark.parametrize("profile", SHIPPED)
def test_sparkrun_starts_the_same_container_and_command(profile, tmp_path):
    probe = render("--profile", profile, "--out", str(tmp_path / "out"))
    if probe.code != 0:
        pytest.skip(f"{profile} does not render against the example inventory: {probe.stderr.strip()[:200]}")
    if not (tmp_path / "out" / "recipe.yaml").exists():
        pytest.skip(f"{profile} exports no single sparkrun recipe (one host, or one recipe per replica)")
    proc = subprocess.run([sys.executable, "bench/sparkrun_export.py", "--profile", profile, "--inventory", INVENTORY,
                           "--sparkrun-python", SPARKRUN_PYTHON], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "SPARKCTL_RECIPES": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MISS" not in proc.stdout, proc.stdout
    for item in ("restart policy on-failure", "mount /mnt/nvme/models/DeepSeek-V4.1-Flash:", "gpus", "capability IPC_LOCK",
                 "device /dev/infiniband", "every engine option"):
        assert f"ok   {item}" in proc.stdout, proc.stdout
