"""``sparkctl model sync``: parse, call ``sparkctl.ops.model_sync``, print."""

from __future__ import annotations

from typing import Optional

import typer

from sparkctl.cli.context import ENV_OPTION, JSON_OPTION, SET_OPTION, split_hosts, state
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION
from sparkctl.errors import EXIT_FAILED

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).

model_app = typer.Typer(no_args_is_help=True, help="The checkpoint on every host: sync it and verify it.")


@model_app.command("sync")
def sync(
    ctx: typer.Context,
    source: str = typer.Option(..., "--source", "-s", help="hf:OWNER/NAME, optionally @REVISION (the hub), or a folder "
                               "(on this machine, or on --from HOST)."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="The profile being deployed (needed for "
                                          "--without-engram-tables)."),
    from_host: Optional[str] = typer.Option(None, "--from", help="A folder source: it is on this inventory host, which "
                                            "sends to the others itself, over the fabric. A hub source: downloaded "
                                            "here, sent to this host once, and it sends to the others."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated host names (default: every host)."),
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    bwlimit: Optional[float] = typer.Option(None, "--bwlimit", min=0.001, max=1e6, help="Per receiving host, MB/s."),
    without_engram_tables: bool = typer.Option(False, "--without-engram-tables", help="Leave out the files holding "
                                               "only Engram tables (vLLM with engram.mode=disk never loads them)."),
    download_dir: Optional[str] = typer.Option(None, "--download-dir", help="Where a hub source is downloaded on "
                                               "this machine (default: $SPARKCTL_MODEL_CACHE or ~/.cache/sparkctl/models/OWNER--NAME)."),
    download_only: bool = typer.Option(False, "--download-only", help="A hub source: download and verify it on "
                                       "this machine, send it nowhere yet."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check every host and say what would be sent; send nothing."),
    retries: int = typer.Option(1, "--retries", min=0, max=100, help="Check and send again to a host whose transfer failed."),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="Record unknown host keys (never changed ones)."),
    timeout: float = CONNECT_TIMEOUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Copy the checkpoint into paths.model_dir on every host: only what a host lacks or holds wrongly,
    many hosts at once, resumable, verified against a manifest kept with each copy."""
    from sparkctl.ops import model_sync as ops

    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    options = ops.SyncOptions(source=source, from_host=from_host, hosts=split_hosts(hosts), bwlimit=bwlimit,
                              without_engram_tables=without_engram_tables, download_dir=download_dir, dry_run=dry_run,
                              download_only=download_only,
                              retries=retries, accept_new_host_keys=accept_new_host_keys, connect_timeout=timeout)
    if profile:
        from sparkctl.config.profile import load_profile

        loaded = load_profile(profile, sets=sets, envs=envs).profile
        options.engram_mode, options.engine = loaded.engram.mode, loaded.engine
    report = ops.run_sync(inventory, options, out)
    out.result(report.to_json(), ops.format_report(report))
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add the ``model`` group to the top-level app (idempotent)."""
    if any(group.name == "model" for group in app.registered_groups):
        return
    app.add_typer(model_app, name="model", help="The checkpoint on every host: sync it and verify it.")
