"""Commands print no library warnings (pydantic's protected "model_" namespace warned on every
command with pydantic 2.6, paramiko 3.4 about TripleDES on every SSH command), and the lower bounds are the versions scripts/lowest-versions.sh pins.
The lowest-versions job runs this module in a venv holding exactly those versions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clirun import REPO, cli_env

sys.path.insert(0, str(REPO / "scripts"))
from lowest_constraints import lower_bounds  # noqa: E402


# The commands run one after another in ONE fresh interpreter (clirun's in-process call, inside a
# process of its own): a warning printed when a module is imported shows only in a process that
# imports it anew, and with PYTHONWARNINGS=default each warning is printed once a process, so any
# warning any of them triggers is printed, in the stderr of the first command that triggers it.
# (One interpreter start instead of one a command.)
_IN_ONE_PROCESS = """
import json, sys
from clirun import run_cli_in_process
print(json.dumps([run_cli_in_process(*args).stderr for args in json.loads(sys.argv[1])]))
"""


@pytest.mark.integration  # a fresh interpreter: warnings are printed once per process
def test_commands_print_no_warnings(example_inventory):
    commands = [("profiles",), ("-i", example_inventory, "inventory", "check"), ("plan", "--profile", "tp4"),
                ("-i", example_inventory, "inventory", "show"),
                # SSH (paramiko): nothing listens on port 9, the command fails, and says nothing else
                ("init", "--hosts", "a=127.0.0.1", "--port", "9", "--connect-timeout", "1", "--dry-run")]
    env = cli_env({"PYTHONWARNINGS": "default", "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"})
    proc = subprocess.run([sys.executable, "-c", _IN_ONE_PROCESS, json.dumps(commands)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr[-2000:]  # nothing outside the calls
    stderrs = json.loads(proc.stdout)
    assert len(stderrs) == len(commands)
    for args, stderr in zip(commands, stderrs):
        assert "Warning" not in stderr, (args, stderr[-2000:])


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
