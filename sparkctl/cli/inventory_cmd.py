"""``sparkctl inventory check|show``."""

from __future__ import annotations

import dataclasses
import sys

import typer
from rich.console import Console
from rich.table import Table

from sparkctl.cli.context import JSON_OPTION, state

inventory_app = typer.Typer(help="Validate and show the host inventory.", no_args_is_help=True)


@inventory_app.command("check")
def check(ctx: typer.Context, json_flag: bool = JSON_OPTION) -> None:
    """Validate the inventory; one line per problem, exit 2 when it is invalid."""
    st = state(ctx)
    inv = st.inventory()
    out = st.output(json_flag)
    hosts = inv.hosts
    out.result(
        {"ok": True, "inventory": inv.path, "cluster": inv.model.cluster, "hosts": len(hosts), "head": inv.head.name},
        f"{inv.path}: ok — cluster {inv.model.cluster!r}, {len(hosts)} hosts, head {inv.head.name}",
    )


@inventory_app.command("show")
def show(ctx: typer.Context, json_flag: bool = JSON_OPTION) -> None:
    """Show every host with the defaults merged in."""
    st = state(ctx)
    inv = st.inventory()
    out = st.output(json_flag)
    hosts = [dataclasses.asdict(h) for h in inv.hosts]
    data = {
        "inventory": inv.path,
        "cluster": inv.model.cluster,
        "known_hosts": inv.model.known_hosts,
        "paths": inv.model.paths.model_dump(),
        "hosts": hosts,
    }
    if out.json_mode:
        out.result(data)
        return
    table = Table(title=f"{inv.model.cluster} ({inv.path})", title_justify="left")
    for column in ("name", "role", "address", "fabric", "ssh", "nvme", "interfaces", "hcas"):
        table.add_column(column, overflow="fold")  # on a narrow terminal a value wraps, never loses its end
    for h in inv.hosts:
        ssh = f"{h.ssh_user or '~'}@:{h.ssh_port or '~'}"
        table.add_row(
            h.name, h.role, h.address, ",".join(h.fabric_addresses) or "-", ssh, h.nvme_path,
            ",".join(h.fabric_interfaces) or "-", ",".join(h.hcas) or "-",
        )
    # In a pipe or a file nothing is cut to an imagined 80 columns: the table is as wide as its values.
    console = Console() if sys.stdout.isatty() else Console(width=100_000)
    console.print(table)
    paths = inv.model.paths
    console.print(f"model_dir={paths.model_dir}  engram_dir={paths.engram_dir}  hf_cache={paths.hf_cache}")


def register(app: typer.Typer) -> None:
    app.add_typer(inventory_app, name="inventory")
