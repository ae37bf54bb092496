"""The ``sparkctl`` command: global options, sub-commands, and the one place errors become exit codes.

Keep this import-light: ``sparkctl --help`` must not pull in paramiko, docker, httpx or jinja2.
Every command module imports what it needs inside its function.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer
from typer import _click  # typer's own click: its exceptions are the ones raised here
from typer.completion import completion_init
from typer.exceptions import Abort
from typer.main import get_command

from sparkctl import __version__
from sparkctl.cli import (bench_cmd, build_cmd, completion_cmd, doctor_cmd, engram_cmd, init_cmd, inventory_cmd,
                          model_cmd, plan_cmd, profiles_cmd, render_cmd, serve_cmd, setup_cmd, smoke_cmd, top_cmd,
                          up_cmd)
from sparkctl.cli.context import AppState, echo_remote_commands, log_ssh
from sparkctl.cli.timeouts import rewrite_legacy
from sparkctl.errors import SparkctlError
from sparkctl.sandbox.cli import app as sandbox_app

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).

app = typer.Typer(
    name="sparkctl",
    help="From a rack of DGX Spark boxes and a checkpoint to a healthy, benchmarked endpoint.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        print(f"sparkctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    ctx: typer.Context,
    inventory: Optional[str] = typer.Option(
        None, "--inventory", "-i", help="Inventory YAML (default: $SPARKCTL_INVENTORY, then ./inventory.yaml)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print exactly one JSON document on stdout."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="More detail on stderr."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print sparkctl's version and exit."),
) -> None:
    ctx.obj = AppState(inventory_option=inventory, json_mode=json_output, verbose=verbose)
    if verbose:  # say what runs: every remote command, per host, before it runs
        echo_remote_commands()


_registered = False


def register_commands() -> None:
    """Attach every command (once). Each command module imports its heavy libraries lazily."""
    global _registered
    if _registered:
        return
    for module in (init_cmd, inventory_cmd, profiles_cmd, plan_cmd, render_cmd, doctor_cmd, setup_cmd, build_cmd, engram_cmd,
                   serve_cmd, up_cmd, smoke_cmd, bench_cmd, top_cmd, model_cmd, completion_cmd):
        module.register(app)
    engram_cmd.register_sandbox(sandbox_app)
    app.add_typer(sandbox_app, name="sandbox", help="A local multi-host cluster (network namespaces, real sshd and dockerd).")
    _registered = True


_GLOBAL_WITH_VALUE = ("-i", "--inventory")
_GLOBAL_FLAGS = ("-v", "--verbose")


def hoist_global_options(argv: list[str]) -> list[str]:
    """Let the global options stand anywhere (``sparkctl render -i inv.yaml ...`` as well as
    ``sparkctl -i inv.yaml render ...``): move them in front of the command, where click wants them."""
    front, rest = [], []
    i = 0
    while i < len(argv) and argv[i] != "--":  # after "--" every word is the command's own
        arg = argv[i]
        if arg in _GLOBAL_WITH_VALUE and i + 1 < len(argv):
            front += argv[i:i + 2]
            i += 2
            continue
        (front if arg.startswith("--inventory=") or arg in _GLOBAL_FLAGS else rest).append(arg)
        i += 1
    return front + rest + argv[i:]


class _StdoutWatch:
    """sys.stdout, remembering whether anything was written (so an error after the one JSON
    document does not add a second one)."""

    def __init__(self, stream):
        self._stream, self.written = stream, False

    def write(self, text):
        if text:
            self.written = True
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def json_requested(argv: list[str]) -> bool:
    """``--json`` anywhere among the options (global or the command's own), not after ``--``."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in options


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped (a YAML key may hold them),
    so an error stays one line and cannot move the terminal's cursor."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in text)


def error_document(message: str, exit_code: int, err: BaseException | None = None) -> dict:
    """What ``--json`` prints when a command fails before its own document: still exactly one."""
    document = {"ok": False, "exit_code": exit_code, "error": message}
    for name in ("file", "field", "line"):
        value = getattr(err, name, None)
        if value is not None:
            document[name] = value
    several = getattr(err, "errors", None)
    if isinstance(several, list):
        document["errors"] = [{"error": one_line(str(e)), "file": e.file, "field": e.field, "line": e.line} for e in several]
    return document


# pydantic looks for plugins of its own (the `pydantic` entry point group) before it builds the first
# model, reading the metadata of every installed distribution: ~0.05 s of CPU per command. sparkctl's
# models are its own configuration, with nothing for such a plugin to observe, so the command does
# without them unless the environment says otherwise (PYDANTIC_DISABLE_PLUGINS set, even empty).
PYDANTIC_PLUGINS_VARIABLE = "PYDANTIC_DISABLE_PLUGINS"


def without_pydantic_plugins(environ=os.environ) -> None:
    environ.setdefault(PYDANTIC_PLUGINS_VARIABLE, "__all__")


def run() -> None:
    without_pydantic_plugins()
    register_commands()
    ssh_log = os.environ.get("SPARKCTL_SSH_LOG")
    if ssh_log:  # field debugging: why did a connection drop? (paramiko's own debug log)
        log_ssh(ssh_log)
    if os.environ.get("_SPARKCTL_COMPLETE"):  # the shell asks for completions (sparkctl completion SHELL)
        completion_init()
    argv = hoist_global_options(sys.argv[1:])
    argv = rewrite_legacy(argv, _GLOBAL_WITH_VALUE, lambda line: print(line, file=sys.stderr))
    watch = sys.stdout = _StdoutWatch(sys.stdout)

    def fail(message: str, exit_code: int, err: BaseException | None = None, *, show=None) -> None:
        several = getattr(err, "errors", None) if isinstance(getattr(err, "errors", None), list) else None
        message = "; ".join(one_line(str(e)) for e in several) if several else one_line(message)
        if show is not None:
            show()
        elif several:  # one line per problem, all of them (a file with three mistakes needs three fixes)
            for one in several:
                print(f"error: {one_line(str(one))}", file=sys.stderr)
        else:
            print(f"error: {message}", file=sys.stderr)
        if json_requested(argv) and not watch.written:
            watch.write(json.dumps(error_document(message, exit_code, err), indent=2) + "\n")
        sys.stdout.flush()
        sys.exit(exit_code)

    try:
        # Not standalone: click's usage errors arrive here too, so --json can answer them with a document.
        code = click_command().main(args=argv, prog_name="sparkctl", standalone_mode=False)
    except SparkctlError as err:
        fail(str(err), err.exit_code, err)
    except _click.exceptions.NoArgsIsHelpError as err:  # `sparkctl` or a group alone: its help, exit 2
        fail("no command given (see --help)", err.exit_code, show=lambda: _show_usage_error(err))
    except _click.exceptions.ClickException as err:  # usage errors: one line like ours, exit 2
        fail(_usage_line(err), err.exit_code)
    except (Abort, KeyboardInterrupt):
        fail("interrupted", 130)
    except RecursionError:
        fail("input nested too deeply to handle", 2)
    except Exception as err:  # a bug: still one line, never a traceback (SPARKCTL_DEBUG=1 shows it)
        if os.environ.get("SPARKCTL_DEBUG"):
            raise
        fail(f"unexpected {err.__class__.__name__}: {str(err).splitlines()[0] if str(err) else ''} "
             "(SPARKCTL_DEBUG=1 shows where)", 1, err)
    sys.exit(code if isinstance(code, int) else 0)


_command = None


def click_command():
    """The click command tree typer builds from ``app``, with the help tidied: an on/off flag
    shows no value type (typer prints ``<bool>`` for it, which reads as if it took a value).
    Built once per process: building reads every command's signature (~0.1 s), which a process
    that runs the CLI many times (the tests) would otherwise pay on each call."""
    global _command
    if _command is not None:
        return _command
    register_commands()
    command = get_command(app)
    stack = [command]
    while stack:
        current = stack.pop()
        for param in getattr(current, "params", []):
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        stack.extend(getattr(current, "commands", {}).values())
    _command = command
    return command


def _usage_line(err) -> str:
    """A click usage error as one line: the command, the problem, where help is."""
    ctx = getattr(err, "ctx", None)
    if ctx is None:
        return err.format_message()
    return f"{ctx.command_path}: {err.format_message()} (see {ctx.command_path} --help)"


def _show_usage_error(err) -> None:
    """Click's usage message as standalone mode prints it (typer's rich panel when rich is there)."""
    try:
        from typer import rich_utils

        rich_utils.rich_format_error(err)
    except ImportError:
        err.show()
