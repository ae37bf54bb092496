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
    json_flag: bool = JSON_OPTION,
) -> None:
    """SSH, GPU/driver, Docker + NVIDIA runtime, ulimits, RDMA/MTU, fabric, disk, memory, ports, checkpoint, image, clocks."""
    from sparkctl.config.profile import ConfigError, load_profile, select_hosts
    from sparkctl.ops.doctor.run import run_doctor

    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    wanted = split_hosts(hosts)
    loaded = load_profile(profile, sets=sets, envs=envs).profile if profile else None
    if loaded is not None:
        picked, note = select_hosts(loaded, inventory.hosts, wanted)
        if note:
            out.info(note)
    else:
        by_name = {h.name: h for h in inventory.hosts}
        unknown = [n for n in wanted or [] if n not in by_name]
        if unknown:
            raise ConfigError(f"unknown host {unknown[0]!r} (inventory has: {', '.join(by_name)})", field="--hosts")
        picked = [by_name[n] for n in wanted] if wanted else inventory.hosts
    report = run_doctor(inventory, picked, loaded, accept_new_host_keys=accept_new_host_keys, connect_timeout=timeout)
    if out.json_mode:
        out.result(report.to_json())
    else:
        _print_report(report, verbose=st.verbose)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _print_report(report, verbose: bool = False) -> None:
    """One row per check, one column per host (8 hosts still fit a terminal), then every failure with its fix."""
    from rich.console import Console
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
                console.print(f"[{_STATUS_STYLE[c.status]}]{c.status}[/] {name} {c.id}: {c.detail}")
                if c.hint:
                    console.print(f"      fix: {c.hint}")
    if report.ok:
        console.print("[green]all hosts ready[/]")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
