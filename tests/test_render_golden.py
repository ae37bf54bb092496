"""`sparkctl render --out` against reviewed golden files, byte for byte.

The golden trees under tests/golden/<profile>/ are what a reviewer reads to see exactly what a
deployment runs. After an intended change, regenerate them and review the diff:

    SPARKCTL_UPDATE_GOLDEN=1 python3 -m pytest -q tests/test_render_golden.py
"""

from __future__ import annotations

import difflib
import os
import shutil

import pytest

from test_render_helpers import REPO, read_tree, render

GOLDEN = REPO / "tests" / "golden"
PROFILES = ["tp4", "tp8-1m", "sglang-tp4-1m"]


def _diff(expected: bytes, actual: bytes, name: str) -> str:
    lines = difflib.unified_diff(
        expected.decode().splitlines(keepends=True), actual.decode().splitlines(keepends=True), f"golden/{name}", f"rendered/{name}"
    )
    return "".join(lines)


@pytest.mark.parametrize("profile", PROFILES)
def test_render_matches_golden_files(profile, tmp_path):
    out = tmp_path / "out"
    result = render("--profile", profile, "--out", str(out))
    assert result.code == 0, result
    rendered = read_tree(out)
    golden_dir = GOLDEN / profile
    if os.environ.get("SPARKCTL_UPDATE_GOLDEN") == "1":
        shutil.rmtree(golden_dir, ignore_errors=True)
        shutil.copytree(out, golden_dir)
    golden = read_tree(golden_dir)
    assert sorted(rendered) == sorted(golden), "a file was added or removed; regenerate with SPARKCTL_UPDATE_GOLDEN=1"
    for name, expected in golden.items():
        assert rendered[name] == expected, _diff(expected, rendered[name], f"{profile}/{name}")


def test_golden_trees_hold_one_directory_per_rank():
    # tp8-1m runs on all 8 inventory hosts, tp4 and sglang-tp4-1m on the head and the first 3 workers.
    expected_hosts = {
        "tp8-1m": ["spark-147", "spark-148", "spark-153", "spark-157", "spark-158", "spark-161", "spark-162", "spark-166"],
        "tp4": ["spark-147", "spark-153", "spark-157", "spark-158"],
        "sglang-tp4-1m": ["spark-147", "spark-153", "spark-157", "spark-158"],
    }
    for profile, hosts in expected_hosts.items():
        tree = read_tree(GOLDEN / profile)
        assert sorted({name.split("/")[0] for name in tree if "/" in name}) == hosts
        for host in hosts:
            assert {f"{host}/engine.env", f"{host}/compose.yaml", f"{host}/launch.sh"} <= set(tree)
        assert "recipe.yaml" in tree
