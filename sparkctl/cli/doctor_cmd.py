"""``sparkctl doctor``: check every host in parallel; exit 1 if any check fails."""

from __future__ import annotations

from typing import Optional

import typer

from sparkctl.cli.context import ENV_OPTION, HOSTS_OPTION, JSON_OPTION, SET_OPTION, split_hosts, state
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION
from sparkctl.errors import EXIT_FAILED

_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def doctor(
    ctx: typer.Context,
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Also check what this profile needs (ulimits, disk, memory, ports, image)."),
    hosts: Optional[str] = HOSTS_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="Record unknown host keys (never changed ones)."),
    timeout: float = CONNECT_TIMEOUT_OPTION,
    fix: bool = typer.Option(False, "--fix", help="Run the `sparkctl setup` steps that fix what failed, then check again."),
    ask_become_pass: bool = typer.Option(False, "--ask-become-pass", "-K", help="With --fix: read the sudo password once from the terminal."),
    json_flag: bool = JSON_OPTION,
) -> None:
    """SSH, GPU/driver, Docker + NVIDIA runtime, ulimits, RDMA/MTU, fabric, disk, memory, ports, checkpoint, image, clocks."""
    from sparkctl.config.profile import load_profile, select_hosts
    from sparkctl.ops.doctor.run import run_doctor

    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    wanted = split_hosts(hosts)
    loaded = load_profile(profile, sets=sets, envs=envs).profile if profile else None
    if loaded is not None and loaded.replicas > 1:  # every replica's hosts
        from sparkctl.ops.replicas import split_replicas

        replicas, note = split_replicas(loaded, inventory.hosts, wanted, sets)
        picked = [h for r in replicas for name in r.hosts for h in inventory.hosts if h.name == name]
        if note:
            out.reporter.note(note)
    elif loaded is not None:
        picked, note = select_hosts(loaded, inventory.hosts, wanted)
        if note:
            out.reporter.note(note)
    else:
        picked = inventory.pick(wanted)
    # each check is a step told to the reporter (JSON lines with SPARKCTL_EVENTS=json); the table is the report
    report = run_doctor(inventory, picked, loaded, accept_new_host_keys=accept_new_host_keys, connect_timeout=timeout,
                        reporter=out.reporter)
    setup_report = None
    if fix:
        setup_report, report = _fix(inventory, picked, loaded, report, out, ask_become_pass, accept_new_host_keys, timeout)
    if out.json_mode:
        doc = report.to_json()
        if setup_report is not None:
            doc["setup"] = setup_report.to_json()
        out.result(doc)
    else:
        _print_report(report, verbose=st.verbose)
    if not report.ok or (setup_report is not None and not setup_report.ok):
        raise typer.Exit(EXIT_FAILED)


def _fix(inventory, picked, profile, report, out, ask_become_pass: bool, accept_new_host_keys: bool, timeout: float):
    """`setup` limited to the steps that fix what doctor found, on the hosts where it found it; then doctor again."""
    from sparkctl.cli.setup_cmd import format_report, read_become_password
    from sparkctl.ops.doctor.fixes import steps_to_fix
    from sparkctl.ops.doctor.run import run_doctor
    from sparkctl.cli.context import connections
    from sparkctl.ops.setup import SetupOptions, run_setup

    failing = {name: checks for name, checks in report.hosts if steps_to_fix(checks)}
    steps = steps_to_fix([c for checks in failing.values() for c in checks])
    if not steps:
        out.reporter.note("doctor --fix: nothing setup can fix")
        return None, report
    # The SSH mesh needs every host (each authorizes the others); the other steps only the failing ones.
    hosts = picked if "ssh_mesh" in steps else [h for h in picked if h.name in failing]
    out.reporter.note(f"doctor --fix: setup {', '.join(steps)} on {', '.join(h.name for h in hosts)}")
    with connections(timeout, accept_new_host_keys) as pool:
        setup_report = run_setup(inventory, hosts, SetupOptions(only=steps), pool=pool,
                                 become=read_become_password(ask_become_pass))
    if not out.json_mode:
        out.reporter.note(format_report(setup_report))
    return setup_report, run_doctor(inventory, picked, profile, accept_new_host_keys=accept_new_host_keys,
                                    connect_timeout=timeout, reporter=out.reporter)


def _print_report(report, verbose: bool = False) -> None:
    """One row per check, one column per host (8 hosts still fit a terminal), then every failure with its fix."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    check_ids: list[str] = []
    for _, checks in report.hosts:
        for c in checks:
            if c.id not in check_ids:
                check_ids.append(c.id)
    table = Table(title="doctor")
    table.add_column("check")
    for name, _ in report.hosts:
        table.add_column(name)
    by_host = [{c.id: c for c in checks} for _, checks in report.hosts]
    for cid in check_ids:
        cells = []
        for checks in by_host:
            c = checks.get(cid)
            cells.append(f"[{_STATUS_STYLE[c.status]}]{c.status}[/]" if c else "")
        table.add_row(cid, *cells)
    console.print(table)
    for name, checks in report.hosts:
        for c in checks:
            if c.status in ("fail", "warn") or verbose:
                # a detail or hint is the host's words (an error's "[refused]"): shown as they are, not as markup
                console.print(f"[{_STATUS_STYLE[c.status]}]{c.status}[/] {escape(name)} {c.id}: {escape(c.detail)}")
                if c.setup:
                    console.print(f"      fix: `sparkctl setup` ({c.setup}), or `sparkctl doctor --fix`")
                elif c.hint:
                    console.print(f"      fix: {escape(c.hint)}")
    if report.ok:
        console.print("[green]all hosts ready[/]")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
