"""Optional: the exported recipe.yaml through sparkrun 0.4.2's own dry run (bench/sparkrun_export.py),
for every shipped profile that exports one recipe.

Skips cleanly when the sparkrun venv is absent (it needs Python >= 3.12; never a CI requirement):
    python3.12 -m venv /tmp/sparkrun-venv && /tmp/sparkrun-venv/bin/pip install sparkrun==0.4.2

The script runs once for all of them (one sparkrun process: its start-up was most of each
profile's cost); each profile's test reads its own part of the report.
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
HEADER = "sparkrun dry run of "

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path(SPARKRUN_PYTHON).exists(), reason=f"no sparkrun venv at {SPARKRUN_PYTHON}"),
]


def why_not_exported(profile: str, out: Path) -> str | None:
    """None when `sparkctl render` writes one recipe.yaml for the profile, else why the test skips."""
    probe = render("--profile", profile, "--out", str(out))
    if probe.code != 0:
        return f"{profile} does not render against the example inventory: {probe.stderr.strip()[:200]}"
    if not (out / "recipe.yaml").exists():
        return f"{profile} exports no single sparkrun recipe (one host, or one per replica)"
    return None


def sections(stdout: str) -> dict[str, str]:
    """profile -> its part of the script's report (its header line and the item lines under it)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith(HEADER):
            current = line[len(HEADER):].split(":", 1)[0]
            found[current] = []
        elif not line.startswith("  "):
            current = None
        if current is not None:
            found[current].append(line)
    return {name: "\n".join(lines) for name, lines in found.items()}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """(profile -> why it skips, the script's one run over every exporting profile)."""
    skips = {name: why_not_exported(name, tmp_path_factory.mktemp(name)) for name in SHIPPED}
    exported = [name for name, why in skips.items() if why is None]
    argv = [sys.executable, "bench/sparkrun_export.py", "--inventory", INVENTORY, "--sparkrun-python", SPARKRUN_PYTHON]
    for name in exported:
        argv += ["--profile", name]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "SPARKCTL_RECIPES": ""}) if exported else None
    return skips, proc


@pytest.mark.parametrize("profile", SHIPPED)
def test_sparkrun_starts_the_same_container_and_command(profile, dry_runs):
    skips, proc = dry_runs
    if skips[profile]:
        pytest.skip(skips[profile])
    report = sections(proc.stdout)
    # the script's exit says whether every profile matched: 0 exactly when no part has a MISS
    assert proc.returncode == (1 if "MISS" in proc.stdout else 0), proc.stdout + proc.stderr
    assert profile in report, proc.stdout + proc.stderr
    mine = report[profile]
    assert "MISS" not in mine, mine
    for item in ("restart policy on-failure", "mount /mnt/nvme/models/DeepSeek-V4.1-Flash:", "gpus", "capability IPC_LOCK",
                 "device /dev/infiniband", "every engine option"):
        assert f"ok   {item}" in mine, mine
