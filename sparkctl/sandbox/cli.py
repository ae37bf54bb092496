"""`sparkctl sandbox up|status|down`: parse, call sparkctl.sandbox.cluster, print.

Import-light on purpose (``--help`` must stay fast): the cluster module and rich load inside
the commands. With ``--json`` exactly one JSON document goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

app = typer.Typer(
    help="A local multi-host cluster: network namespaces with their own sshd, dockerd and /mnt/nvme.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

NAME_OPTION = typer.Option("default", "--name", help="Which sandbox (several can coexist on different subnets).")
JSON_OPTION = typer.Option(False, "--json", help="Print exactly one JSON document on stdout.")


def _json_mode(ctx: typer.Context, flag: bool) -> bool:
    root = ctx.find_root().obj
    return flag or bool(getattr(root, "json_mode", False))


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _emit(document: dict) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()


def _fail(err: Exception) -> typer.Exit:
    _say(f"error: {err}")
    return typer.Exit(getattr(err, "exit_code", 1))


def _call(action, *args, **kwargs):
    """``action(...)``, a step of the sandbox module: its SandboxError is the command's one-line failure."""
    from sparkctl.sandbox import cluster

    try:
        return action(*args, **kwargs)
    except cluster.SandboxError as err:
        raise _fail(err) from None


def _guard() -> None:
    """Refuse early, in one line, what cannot work (not root, programs missing)."""
    import os

    from sparkctl.errors import EXIT_USAGE

    if os.geteuid() != 0:
        _say("error: `sparkctl sandbox` needs root: it creates network namespaces, bridges, and an sshd and "
             "dockerd per host (run it with sudo)")
        raise typer.Exit(EXIT_USAGE)


@app.command()
def up(
    ctx: typer.Context,
    hosts: Optional[int] = typer.Option(
        None, "--hosts", "-n", min=1, max=100, help="Number of hosts (default 4 for a new sandbox, else unchanged)."
    ),
    bare: Optional[bool] = typer.Option(
        None, "--bare/--prepared",
        help="Hosts as a rack on its first day (user not in the docker group, no folders, no fabric addresses, "
             "no host-to-host keys; `sparkctl setup` prepares them) or prepared (default). Fixed at creation."),
    password_sudo: Optional[bool] = typer.Option(
        None, "--password-sudo/--passwordless-sudo",
        help="sudo asks the user's password (written 0600 to the sandbox's sudo_password file). Fixed at creation."),
    name: str = NAME_OPTION,
    mgmt_subnet: Optional[str] = typer.Option(None, "--mgmt-subnet", help="Management subnet (default 10.231.0.0/24, else the first free pair)."),
    fabric_subnet: Optional[str] = typer.Option(None, "--fabric-subnet", help="Fabric subnet (default 10.232.0.0/24)."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Create the sandbox, or bring it back to health (idempotent). Prints the inventory path."""
    _guard()
    from sparkctl.sandbox import cluster

    info = _call(cluster.up, name, hosts, mgmt_subnet=mgmt_subnet, fabric_subnet=fabric_subnet, bare=bare,
                 password_sudo=password_sudo, log=_say)
    if _json_mode(ctx, json_output):
        _emit({
            "inventory": info.inventory,
            "known_hosts": info.known_hosts,
            "user": "nvidia",
            "bare": info.bare,
            "password_sudo": info.password_sudo,
            **({"sudo_password_file": info.sudo_password_file} if info.password_sudo else {}),
            "hosts": [{"name": h.name, "address": h.address, "netns": h.netns} for h in info.hosts],
        })
    else:
        _say(f"inventory: {info.inventory}  (export SPARKCTL_INVENTORY={info.inventory})")
        print(info.inventory)


@app.command()
def status(ctx: typer.Context, name: str = NAME_OPTION, json_output: bool = JSON_OPTION) -> None:
    """Show each host's namespace, sshd and dockerd. Exit 1 when a host is unhealthy or the sandbox is absent."""
    _guard()
    from sparkctl.sandbox import cluster

    report = _call(cluster.status, name)
    if _json_mode(ctx, json_output):
        _emit(report.to_json())
    elif not report.exists:
        _say(f"no sandbox named {name!r} (run `sparkctl sandbox up --name {name}`)")
    else:
        _print_hosts(name, report)
    raise typer.Exit(0 if report.healthy else 1)


def _print_hosts(name: str, report) -> None:
    """status for people: a table of the hosts on stderr."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sandbox {name}  ({report.layout.inventory})", title_justify="left")
    for column in ("host", "address", "fabric", "netns", "sshd", "dockerd", "state"):
        table.add_column(column)

    def mark(pid, answers):
        return f"{pid} ok" if pid and answers else (f"{pid} silent" if pid else "down")

    for h in report.hosts:
        table.add_row(h.name, h.address, h.fabric_address, h.netns if h.netns_present else "missing",
                      mark(h.sshd_pid, h.ssh_answers), mark(h.dockerd_pid, h.docker_answers),
                      "healthy" if h.healthy else "[red]unhealthy[/red] (run `sandbox up` to repair)")
    Console(stderr=True, width=None if sys.stderr.isatty() else 160).print(table)


@app.command()
def down(ctx: typer.Context, name: str = NAME_OPTION,
         dry_run: bool = typer.Option(False, "--dry-run", help="Say which hosts and state would go; remove nothing."),
         yes: bool = typer.Option(False, "--yes", "-y", help="Do it without asking (needed without a terminal)."),
         json_output: bool = JSON_OPTION) -> None:
    """Stop every process of the sandbox (by recorded PID), delete its namespaces, links and state.
    Asks first (-y/--yes answers; without a terminal it refuses unless -y is given)."""
    _guard()
    from sparkctl.sandbox import cluster

    if dry_run or not yes:
        report = _call(cluster.status, name)
        hosts = [h.name for h in report.hosts] if report.exists else []
        if dry_run:
            if _json_mode(ctx, json_output):
                _emit({"name": name, "dry_run": True, "exists": report.exists, "would_remove": hosts})
            else:
                _say(f"would remove sandbox {name!r}: {', '.join(hosts)} and its state" if report.exists
                     else f"no sandbox named {name!r}; nothing to do")
            return
        if report.exists:
            from sparkctl.cli.confirm import confirm
            from sparkctl.errors import SparkctlError

            try:
                confirm(f"remove sandbox {name!r} ({', '.join(hosts)}: their engines, sshd, dockerd and files)?", yes=yes)
            except SparkctlError as err:
                raise _fail(err) from None

    report = _call(cluster.down, name, log=_say)
    if _json_mode(ctx, json_output):
        _emit(report.to_json())
    elif not report.existed:
        _say(f"no sandbox named {name!r}; nothing to do")
    elif report.ok:
        _say(f"sandbox {name!r} removed ({len(report.hosts)} hosts)")
    else:
        _say(f"sandbox {name!r}: processes {report.survivors} survived; state kept, run `sandbox down` again")
    raise typer.Exit(0 if report.ok else 1)
