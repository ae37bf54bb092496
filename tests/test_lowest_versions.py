"""Commands print no library warnings (pydantic's protected "model_" namespace warned on every
command with pydantic 2.6, paramiko 3.4 about TripleDES on every SSH command), and the lower bounds are the versions scripts/lowest-versions.sh pins.
The lowest-versions job runs this module in a venv holding exactly those versions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from clirun import REPO, run_cli_process

sys.path.insert(0, str(REPO / "scripts"))
from lowest_constraints import lower_bounds  # noqa: E402


@pytest.mark.integration  # fresh interpreters: warnings are printed once per process
def test_commands_print_no_warnings(example_inventory):
    for args in (("profiles",), ("-i", example_inventory, "inventory", "check"), ("plan", "--profile", "tp4"),
                 ("-i", example_inventory, "inventory", "show"),
                 # SSH (paramiko): nothing listens on port 9, the command fails, and says nothing else
                 ("init", "--hosts", "a=127.0.0.1", "--port", "9", "--connect-timeout", "1", "--dry-run")):
        result = run_cli_process(*args, env={"PYTHONWARNINGS": "default"})  # a process: warnings reach stderr
        assert "Warning" not in result.stderr, (args, result.stderr[-2000:])


def test_every_runtime_dependency_has_a_lower_bound():
    pins = lower_bounds((REPO / "pyproject.toml").read_text())
    names = {pin.split("==")[0].lower() for pin in pins}
    assert {"typer", "pydantic", "rich", "paramiko"} <= names
    typer_pin = next(pin for pin in pins if pin.startswith("typer=="))
    # typer._click and typer.exceptions, imported by sparkctl.cli.main, arrived in typer 0.27.2.
    assert tuple(int(x) for x in typer_pin.split("==")[1].split(".")) >= (0, 27, 2)


def test_the_cli_imports_what_the_installed_typer_has():
    import importlib

    for module in ("typer._click", "typer.exceptions"):
        importlib.import_module(module)
    assert "from typer import _click" in Path(REPO / "sparkctl/cli/main.py").read_text()
