"""The CI smoke-deploy workflow, checked by a real linter (actionlint), and what it and .ci/run run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def actionlint() -> str:
    found = Path(sys.executable).with_name("actionlint")
    if found.exists():
        return str(found)
    path = shutil.which("actionlint")
    if path is None:
        pytest.fail("actionlint is not installed: it comes with the test extra (bash scripts/setup.sh)")
    return path


def lint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint(), "-no-color", *map(str, paths)], capture_output=True, text=True, timeout=120)


def test_every_workflow_passes_actionlint():
    assert WORKFLOWS, "no workflow in .github/workflows"
    result = lint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The linter really reads the file: a typo in an expression and an unknown key fail it."""
    broken = (REPO / ".github" / "workflows" / "smoke-deploy.yml").read_text()
    broken = broken.replace("${{ github.ref }}", "${{ github.reff }}").replace("timeout-minutes:", "timeout-minutez:")
    path = tmp_path / "broken.yml"
    path.write_text(broken)
    result = lint(path)
    assert result.returncode != 0
    assert "reff" in result.stdout and "timeout-minutez" in result.stdout


def test_the_workflow_brings_up_runs_smokes_uploads_and_tears_down():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "smoke-deploy.yml").read_text())
    steps = workflow["jobs"]["smoke-deploy"]["steps"]
    runs = [step.get("run", "") for step in steps]
    assert any("scripts/smoke-deploy.sh" in run for run in runs)
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-artifact@"))
    teardown = next(step for step in steps if "scripts/demo.sh --down" in step.get("run", ""))
    assert upload["if"] == "always()" and teardown["if"] == "always()" and steps.index(teardown) == len(steps) - 1
    script = (REPO / "scripts" / "smoke-deploy.sh").read_text()
    assert "bash scripts/demo.sh" in script and "smoke" in script and "up --profile sandbox" in script
    demo = (REPO / "scripts" / "demo.sh").read_text()
    assert "sparkctl --json up --profile" in demo and "bench --profile" in demo


def test_ci_runs_the_readme_test_command_every_tier_then_one_smoke_deploy():
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "bash scripts/test.sh" in readme and "bash scripts/demo.sh" in readme
    lines = [line for line in ci.splitlines() if line and not line.startswith("#")]
    assert "bash scripts/test.sh --all" in lines[-1]
    tiers = (REPO / "scripts" / "test.sh").read_text()
    assert "tiers=(quick integration sandbox smoke)" in tiers and "bash scripts/smoke-deploy.sh" in tiers
    assert subprocess.run(["bash", "-n", str(REPO / ".ci" / "run")]).returncode == 0
    for script in ("demo.sh", "smoke-deploy.sh"):
        assert subprocess.run(["bash", "-n", str(REPO / "scripts" / script)]).returncode == 0, script
