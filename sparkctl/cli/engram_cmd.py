"""``sparkctl pack-engram`` and ``sparkctl sandbox make-checkpoint``: parse, call ``sparkctl.ops.engram``, print."""

from __future__ import annotations

from typing import Optional

import typer

from sparkctl.cli.context import HOSTS_OPTION, JSON_OPTION, PROFILE_OPTION, SET_OPTION, split_hosts, state


def pack_engram(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", "-c",
        help="Checkpoint folder (config.json, model.safetensors.index.json, *.safetensors). "
        "With --source on-hosts: the folder on the hosts (default: the inventory's paths.model_dir).",
    ),
    sets: list[str] = SET_OPTION,
    hosts: Optional[str] = HOSTS_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the layout (rows and bytes per rank and host) and stop."),
    json_flag: bool = JSON_OPTION,
) -> None:
    """Cut the Engram tables into per-rank shards and write them to each host's NVMe."""
    from sparkctl.config.profile import load_profile
    from sparkctl.errors import ConfigError
    from sparkctl.ops.engram import format_layout, layout_json, plan_pack

    st = state(ctx)
    out = st.output(json_flag)
    loaded = load_profile(profile, sets=sets).profile
    if checkpoint is None:
        raise ConfigError("--checkpoint DIR is required (the folder holding config.json and the safetensors files)")
    plan, note = plan_pack(loaded, st.inventory(), split_hosts(hosts), checkpoint)
    if note:
        out.info(note)
    if dry_run:
        if loaded.engram.mode != "disk":
            out.info(f"note: profile {loaded.name!r} keeps Engram in memory (engram.mode={loaded.engram.mode}); it does not read these shards")
        out.result(layout_json(plan), format_layout(plan))
        return
    raise ConfigError("packing to hosts is not available yet; use --dry-run")


def register(app: typer.Typer) -> None:
    """Add ``pack-engram`` to the top-level app (idempotent)."""
    if any(c.name == "pack-engram" for c in app.registered_commands):
        return
    app.command("pack-engram")(pack_engram)


def _main() -> None:  # pragma: no cover - used by the tests until cli/main.py registers us
    from sparkctl.cli import main

    register(main.app)
    main.run()


if __name__ == "__main__":
    _main()
