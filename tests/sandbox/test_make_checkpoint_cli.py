"""`sparkctl sandbox make-checkpoint --sandbox NAME` puts the same synthetic checkpoint on every host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]


def test_make_checkpoint_on_every_sandbox_host(sandbox_cluster):
    proc = subprocess.run(
        [sys.executable, "-m", "sparkctl", "sandbox", "make-checkpoint", "--sandbox", sandbox_cluster.name, "--vocab", "40", "--json"],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)["paths"]
    assert len(written) == len(sandbox_cluster.info.hosts)
    contents = []
    for host, path in zip(sandbox_cluster.info.hosts, written):
        assert path.startswith(host.nvme_dir + "/"), (host.name, path)
        index = json.loads((Path(path) / "model.safetensors.index.json").read_text())
        contents.append(sorted((name, (Path(path) / name).read_bytes()) for name in set(index["weight_map"].values())))
    assert all(c == contents[0] for c in contents)


def test_make_checkpoint_needs_a_target(cli):
    result = cli("sandbox", "make-checkpoint")
    assert result.code == 2 and "DIRECTORY or --sandbox" in result.stderr
