"""The CLI contract of ARCHITECTURE.md, checked over every registered command."""

from __future__ import annotations

import subprocess
import sys

import typer.main

from sparkctl.cli import main


def _commands():
    main.register_commands()
    root = typer.main.get_command(main.app)
    stack = [((), root)]
    while stack:
        path, command = stack.pop()
        if hasattr(command, "commands"):  # a group (typer ships its own click)
            for name, sub in command.commands.items():
                stack.append((path + (name,), sub))
        else:
            yield " ".join(path), command


def _options(command) -> set[str]:
    return {opt for param in command.params for opt in getattr(param, "opts", [])}


def test_every_profile_verb_takes_set_and_env():
    checked = []
    for name, command in _commands():
        options = _options(command)
        if "--profile" in options:
            checked.append(name)
            assert {"--set", "--env"} <= options, f"`sparkctl {name}` takes --profile but not --set/--env"
    assert {"plan", "render", "doctor", "pack-engram"} <= set(checked)


def test_every_command_offers_json():
    missing = [name for name, command in _commands() if "--json" not in _options(command) and name not in {"logs"}]
    assert not missing, missing


def test_help_is_fast_and_light():
    """`sparkctl --help` must not import the heavy libraries (they load inside the commands that need them)."""
    probe = (
        "import sys, runpy; sys.argv = ['sparkctl', '--help']\n"
        "try:\n    runpy.run_module('sparkctl', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('paramiko', 'docker', 'httpx', 'jinja2', 'numpy') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    # A fresh interpreter: what start-up imports is only seen in a new process.
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in proc.stdout, proc.stdout[-500:] + proc.stderr[-2000:]


def test_usage_errors_exit_2_without_traceback(cli):
    for args in (["no-such-command"], ["plan"], ["render", "--profile"], ["plan", "--profile", "tp4", "--bogus"]):
        result = cli(*args)
        assert result.code == 2, (args, result)
        assert "Traceback" not in result.stderr
