"""sparkctl's wheel pip-installed into a fresh venv (tests/fresh_venv.py): the wheel carries templates/,
recipes/ and images/, the installed command works from any folder, not only from a checkout, with
nothing but the dependencies the wheel declares."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import fresh_venv

pytestmark = pytest.mark.integration  # builds and installs a wheel

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("pkg")
    venv = root / "venv"
    # the wheel is built from a copy of the tracked tree, which is gone by now: the installed copy
    # needs no source tree
    pip = fresh_venv.install(venv, fresh_venv.shared_wheel(tmp_path_factory))
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv, root


def _run(venv, *args, cwd):
    return subprocess.run([str(venv / "bin" / "sparkctl"), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_wheel_ships_data_directories(installed):
    venv, root = installed
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from sparkctl.resources import data_dir; print(data_dir('recipes')); print(data_dir('templates')); print(data_dir('images'))"],
        cwd=root, capture_output=True, text=True, check=True,
    )
    for line in probe.stdout.split():
        # in the fresh venv's own site-packages (its dependencies are links into the test venv's)
        assert line.startswith(str(venv)) and "site-packages/sparkctl/_data/" in line, probe.stdout


def test_the_venv_holds_only_what_the_wheel_declares(installed):
    """What the test venv has beyond sparkctl's dependencies (pytest, hypothesis) is not there, so a
    module the code imports without declaring it fails here as on a user's machine."""
    venv, root = installed
    expected = {"yaml": True, "matplotlib": True, "click": True, "pytest": False, "hypothesis": False}
    # one interpreter looks every name up (find_spec finds a top-level module without importing it)
    found = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util, sys; "
                            "print(*(importlib.util.find_spec(name) is not None for name in sys.argv[1:]))", *expected],
                           cwd=root, capture_output=True, text=True, check=True)
    assert dict(zip(expected, found.stdout.split())) == {name: str(present) for name, present in expected.items()}, found.stdout


def test_installed_command_runs_outside_a_checkout(installed):
    venv, root = installed
    help_result = _run(venv, "--help", cwd=root)
    assert help_result.returncode == 0 and "profiles" in help_result.stdout, help_result.stderr
    profiles = _run(venv, "profiles", cwd=root)
    assert profiles.returncode == 0, profiles.stderr
    for name in ("tp4", "tp8-300k", "tp8-1m", "sglang-tp4-1m"):
        assert name in profiles.stdout
    inventory = root / "inventory.yaml"
    shutil.copy(REPO / "inventory.example.yaml", inventory)
    out = root / "rendered"
    render = _run(venv, "render", "--profile", "tp8-1m", "-i", str(inventory), "--out", str(out), cwd=root)
    assert render.returncode == 0, render.stderr
    assert any(out.rglob("*.env")), list(out.rglob("*"))  # (each command has _run's timeout: none hangs)


def test_the_wheel_ships_the_example_inventory_and_license(installed, tmp_path):
    """The README's way in from an install: `sparkctl init --example` writes the commented example
    (it is in the wheel); the wheel's metadata carries the license, classifiers and project URLs."""
    venv, root = installed
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"))
    out = tmp_path / "inventory.yaml"
    proc = subprocess.run([str(venv / "bin" / "sparkctl"), "init", "--example", "--out", str(out)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "spark-153" in out.read_text() and out.read_text() == (REPO / "inventory.example.yaml").read_text()
    meta = subprocess.run([str(venv / "bin" / "python"), "-c", "from importlib.metadata import metadata; "
                           "m = metadata('sparkctl'); print(m.get_all('Classifier')); print(m.get_all('Project-URL'))"],
                          capture_output=True, text=True, check=True).stdout
    assert "License :: OSI Approved :: MIT License" in meta and "Source" in meta
    version = subprocess.run([str(venv / "bin" / "sparkctl"), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith("sparkctl ")
