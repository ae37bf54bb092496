"""The ``sparkctl`` command: global options, sub-commands, and the one place errors become exit codes.

Keep this import-light: ``sparkctl --help`` must not pull in paramiko, docker, httpx or jinja2.
Every command module imports what it needs inside its function.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer

from sparkctl.errors import SparkctlError

app = typer.Typer(
    name="sparkctl",
    help="From a rack of DGX Spark boxes and a checkpoint to a healthy, benchmarked endpoint.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def main(
    ctx: typer.Context,
    inventory: Optional[str] = typer.Option(
        None, "--inventory", "-i", help="Inventory YAML (default: $SPARKCTL_INVENTORY, then ./inventory.yaml)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print exactly one JSON document on stdout."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="More detail on stderr."),
) -> None:
    from sparkctl.cli.context import AppState

    ctx.obj = AppState(inventory_option=inventory, json_mode=json_output, verbose=verbose)


_registered = False


def _register() -> None:
    """Attach every command (once). Each command module imports its heavy libraries lazily."""
    global _registered
    if _registered:
        return
    from sparkctl.cli import (bench_cmd, build_cmd, doctor_cmd, engram_cmd, inventory_cmd, plan_cmd, profiles_cmd,
                              render_cmd, serve_cmd, smoke_cmd)
    from sparkctl.sandbox.cli import app as sandbox_app

    for module in (inventory_cmd, profiles_cmd, plan_cmd, render_cmd, doctor_cmd, build_cmd, engram_cmd, serve_cmd,
                   bench_cmd, smoke_cmd):
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
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg in _GLOBAL_WITH_VALUE and i + 1 < len(argv):
            front += [arg, argv[i + 1]]
            i += 2
            continue
        if arg.startswith("--inventory=") or arg in _GLOBAL_FLAGS:
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def run() -> None:
    _register()
    ssh_log = os.environ.get("SPARKCTL_SSH_LOG")
    if ssh_log:  # field debugging: why did a connection drop? (paramiko's own debug log)
        from sparkctl.remote.debuglog import log_ssh_to

        log_ssh_to(ssh_log)
    try:
        # standalone mode: click prints its own usage errors and exits 2; ours arrive here.
        app(args=hoist_global_options(sys.argv[1:]), prog_name="sparkctl")
    except SparkctlError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
