"""``sparkctl setup``: parse, read the sudo password when asked, call ``sparkctl.ops.setup``, print."""

from __future__ import annotations

from typing import Optional

import typer

from sparkctl.cli.context import HOSTS_OPTION, JSON_OPTION, connections, split_hosts, state
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION
from sparkctl.errors import EXIT_FAILED
from sparkctl.reporter import Reporter

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).

ASK_BECOME_PASS = typer.Option(
    False, "--ask-become-pass", "-K",
    help="Read the sudo password once from the terminal (sent to sudo on stdin; never stored or shown).")


def read_become_password(ask: bool):
    """The Become for this run: sudo -n, or the password read once from the terminal."""
    from sparkctl.ops.become import Become

    if not ask:
        return Become()
    import getpass

    try:
        password = getpass.getpass("sudo password for the hosts: ")
    except (EOFError, OSError):
        from sparkctl.errors import SparkctlError

        raise SparkctlError("--ask-become-pass: no terminal to read the password from") from None
    return Become(password)


def pick_hosts(inventory, wanted: list[str] | None):
    return inventory.pick(wanted)  # the one host-selection rule (config/inventory.pick_hosts)


def setup(
    ctx: typer.Context,
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated host names (default: every host)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Look at every host and print what would change; change nothing."),
    ask_become_pass: bool = ASK_BECOME_PASS,
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="Record unknown host keys (never changed ones)."),
    connect_timeout: float = CONNECT_TIMEOUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Prepare the hosts: docker group, sparkctl's folders, fabric addresses + MTU 9000, nvidia runtime, SSH between hosts.

    Idempotent (a second run changes nothing) and on every host at once. Root only through `sudo -n`,
    or with --ask-become-pass the password typed once. `-v` shows every command, sudo ones included.
    """
    from sparkctl.ops.setup import SetupOptions, run_setup
    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    picked = pick_hosts(inventory, split_hosts(hosts))
    become = read_become_password(ask_become_pass) if not dry_run else read_become_password(False)
    with connections(connect_timeout, accept_new_host_keys) as pool:
        # every step's end on stderr as it comes; with --json only the document (its steps: the reporter's record)
        reporter = out.reporter if not out.json_mode else Reporter()
        report = run_setup(inventory, picked, SetupOptions(dry_run=dry_run), pool=pool, become=become, reporter=reporter)
    out.result(report.to_json(), format_report(report))
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def format_report(report) -> str:
    rows = [("host", "step", "status", "seconds", "reason")]
    for hs in report.hosts:
        rows += [(hs.name, s.name, "will act" if s.status == "planned" else s.status, f"{s.seconds:.1f}", s.reason)
                 for s in hs.steps]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    changed = sum(1 for hs in report.hosts for s in hs.steps if s.status == "changed")
    verb = "would change" if report.dry_run else "changed"
    planned = sum(1 for hs in report.hosts for s in hs.steps if s.status == "planned")
    count = planned if report.dry_run else changed
    summary = (f"setup: {'ok' if report.ok else 'failed'} in {report.seconds:.1f} s; "
               + (f"{verb} {count} step(s)" if count else "nothing to change"))
    return "\n".join(lines) + "\n" + summary


def register(app: typer.Typer) -> None:
    app.command("setup")(setup)
