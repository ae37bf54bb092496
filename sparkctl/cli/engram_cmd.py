"""``sparkctl pack-engram`` and ``sparkctl sandbox make-checkpoint``: parse, call ``sparkctl.ops.engram``, print."""

from __future__ import annotations

import os
from typing import Optional

import typer

from sparkctl.cli.answer import finish
from sparkctl.cli.context import (ENV_OPTION, HOSTS_OPTION, JSON_OPTION, PROFILE_OPTION, SET_OPTION, connections,
                                  split_hosts, state)
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION
from sparkctl.errors import ConfigError, OperationFailed

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


def pack_engram(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    checkpoint: Optional[str] = typer.Option(
        None, "--checkpoint", "-c",
        help="Checkpoint folder (config.json, model.safetensors.index.json, *.safetensors). "
        "With --source on-hosts: the folder on the hosts (default: the inventory's paths.model_dir).",
    ),
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    hosts: Optional[str] = HOSTS_OPTION,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the layout (rows and bytes per rank and host) and stop."),
    verify: bool = typer.Option(False, "--verify", help="Only re-hash the shards on the hosts and report per host and rank."),
    source: Optional[str] = typer.Option(
        None, "--source",
        help="local: read the checkpoint here and stream each rank's rows to its host. "
        "on-hosts: every host already has the checkpoint (after `model sync`) and cuts its own shards (no bytes over "
        "the network). Default: local with --checkpoint, else on-hosts.",
    ),
    full_check: bool = typer.Option(
        False, "--full-check",
        help="With --source on-hosts: compare every host's copy by a sha256 of all Engram tensor bytes "
        "(reads the tables once per host) instead of size, header and 1 MiB of samples.",
    ),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="Record unknown host keys (never changed ones)."),
    timeout: float = CONNECT_TIMEOUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Cut the Engram tables into per-rank shards and write them to each host's engram dir (resumable)."""
    from sparkctl.config.profile import load_profile
    from sparkctl.ops import engram as ops
    from sparkctl.ops.engram_pack import pack, verify as verify_shards

    st = state(ctx)
    out = st.output(json_flag)
    source = _source(source, checkpoint, full_check)
    loaded = load_profile(profile, sets=sets, envs=envs).profile
    inventory = st.inventory()
    with connections(timeout, accept_new_host_keys) as pool:  # each host connected when first asked something
        plan, problems = _plan(out, loaded, inventory, split_hosts(hosts), checkpoint,
                               pool if source == "on-hosts" else None, full_check=full_check)
        if dry_run:
            _answer_layout(out, loaded, plan, problems)
            return
        if verify:
            report = verify_shards(plan, inventory, pool=pool, out=out)
        else:
            _require_disk_mode(loaded)
            report = pack(plan, inventory, on_hosts=source == "on-hosts", out=out, problems=problems, pool=pool)
    finish(out, report.to_json(), ops.format_report(report), report.ok)


def _source(source: str | None, checkpoint: str | None, full_check: bool) -> str:
    """--source, checked; by default on-hosts (after `model sync` every host holds the checkpoint:
    the usual case), local when --checkpoint names a folder here."""
    if source is None:
        source = "local" if checkpoint else "on-hosts"
    if source not in ("local", "on-hosts"):
        raise ConfigError(f"must be 'local' or 'on-hosts', got {source!r}", field="--source")
    if full_check and source != "on-hosts":
        raise ConfigError("compares the hosts' copies: it goes with --source on-hosts", field="--full-check")
    return source


def _plan(out, loaded, inventory, hosts, checkpoint: str | None, pool, *, full_check: bool):
    """The layout and, on the hosts (``pool`` given), each host's problem with its copy; its note said."""
    from sparkctl.ops import engram as ops

    if pool is not None:
        plan, note, problems = ops.plan_pack_on_hosts(loaded, inventory, hosts, checkpoint, pool, full_check=full_check)
    elif checkpoint is None:
        raise ConfigError("--source local reads the checkpoint here: give --checkpoint DIR (the folder holding "
                          "config.json and the safetensors files); after `sparkctl model sync` the hosts hold "
                          "it already: --source on-hosts", field="--checkpoint")
    else:
        (plan, note), problems = ops.plan_pack(loaded, inventory, hosts, checkpoint), None
    if note:
        out.info(note)
    return plan, problems


def _answer_layout(out, loaded, plan, problems) -> None:
    """--dry-run: the layout is the answer (with what would stop the shards from being used)."""
    from sparkctl.ops import engram as ops

    if loaded.engram.mode != "disk":
        out.info(f"note: profile {loaded.name!r} keeps Engram in memory (engram.mode={loaded.engram.mode}); it does not read these shards")
    for problem in (problems or {}).values():
        out.info(f"warning: {problem}")
    out.result(ops.layout_json(plan), ops.format_layout(plan))


def _require_disk_mode(loaded) -> None:
    if loaded.engram.mode != "disk":
        raise ConfigError(f"profile {loaded.name!r} keeps Engram in memory (engram.mode={loaded.engram.mode}); "
                          "pack-engram is for engram.mode=disk (--set engram.mode=disk)", field="engram.mode")


def make_checkpoint(
    ctx: typer.Context,
    directory: Optional[str] = typer.Argument(None, help="Folder to write (created if missing)."),
    sandbox: Optional[str] = typer.Option(None, "--sandbox", help="Instead of DIRECTORY: write it on every host of this sandbox, at the inventory's model_dir."),
    vocab: int = typer.Option(1000, "--vocab", min=2, max=10_000_000, help="engram_vocab_size: bucket sizes are the primes above it."),
    layers: str = typer.Option("1,14", "--layers", help="engram_layer_ids, comma-separated."),
    heads: int = typer.Option(12, "--heads", min=1, max=1024, help="engram_n_heads (per n-gram order)."),
    max_ngram: int = typer.Option(3, "--max-ngram", min=2, max=64, help="engram_max_ngram_size (orders 2..N)."),
    head_dim: int = typer.Option(64, "--head-dim", min=32, max=8192, help="engram_head_dim: bytes per fp8 row (multiple of 32)."),
    files: int = typer.Option(3, "--files", min=2, max=64, help="Number of safetensors files to spread the tensors over."),
    seed: int = typer.Option(0, "--seed", help="Content seed (same seed, same bytes)."),
    top_level: bool = typer.Option(False, "--top-level", help="Put the Engram keys at the top of config.json instead of under text_config."),
    table_files: bool = typer.Option(False, "--table-files", help="Each Engram table (weight and scale) in a file "
                                     "of its own, as in the real checkpoint (what `model sync --without-engram-tables` leaves out)."),
    json_flag: bool = JSON_OPTION,
) -> None:
    """Write a small synthetic checkpoint (config.json, safetensors files, index) with real Engram tables."""
    from sparkctl.engram import checkpoint_maker
    try:
        layer_ids = tuple(int(part) for part in layers.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"expects comma-separated layer numbers, got {layers!r}", field="--layers") from None
    if (directory is None) == (sandbox is None):
        raise ConfigError("give either DIRECTORY or --sandbox NAME", field="make-checkpoint")
    targets = [directory] if directory else _sandbox_model_dirs(sandbox)
    for target in targets:  # a file (or a dangling link) where the folder should be: say so, before writing anything
        if os.path.lexists(target) and not os.path.isdir(target):
            raise ConfigError("exists and is not a folder; give a new or existing folder", field=target)
    try:
        for target in targets:
            made = checkpoint_maker.make_checkpoint(
            target, vocab_size=vocab, layer_ids=layer_ids, max_ngram_size=max_ngram, n_heads=heads,
            head_dim=head_dim, files=files, seed=seed, nested=not top_level, table_files=table_files,
            )
            if sandbox:  # on a host the checkpoint is the login user's, as if it had copied it there
                from sparkctl.sandbox.hostetc import give_to_user

                give_to_user(target)
    except ValueError as err:
        raise ConfigError(str(err), field=getattr(err, "option", None)) from None  # ShapeError names its option
    except OSError as err:  # no permission, disk full, read-only file system
        raise OperationFailed(f"cannot write the checkpoint under {err.filename or targets[0]}: "
                              f"{err.strerror or err}") from None
    out = state(ctx).output(json_flag)
    rows = ", ".join(f"layer {k}: {v} rows" for k, v in made.rows.items())
    where = made.path if len(targets) == 1 else f"{len(targets)} sandbox hosts ({', '.join(targets)})"
    out.result({**made.to_json(), "paths": targets}, f"wrote {where}: {len(made.files)} safetensors files, {made.total_bytes} bytes of tensors; {rows}")


def _sandbox_model_dirs(name: str) -> list[str]:
    """Each sandbox host's model_dir as seen from this machine (its private /mnt/nvme is a folder here)."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.sandbox import cluster

    layout = cluster.load(name)
    inventory = load_inventory(layout.inventory)
    model_dir = inventory.model.paths.model_dir
    out = []
    for view in inventory.hosts:
        relative = os.path.relpath(model_dir, view.nvme_path)
        if relative.startswith(".."):
            raise ConfigError(f"{model_dir} is not under the host's nvme_path {view.nvme_path}", field="paths.model_dir")
        out.append(os.path.join(layout.host(view.name).nvme_dir, relative))
    return out


def register_sandbox(sandbox_app: typer.Typer) -> None:
    """Add ``make-checkpoint`` to the ``sandbox`` group (idempotent)."""
    if any(c.name == "make-checkpoint" for c in sandbox_app.registered_commands):
        return
    sandbox_app.command("make-checkpoint")(make_checkpoint)


def register(app: typer.Typer) -> None:
    """Add ``pack-engram`` to the top-level app (idempotent)."""
    if any(c.name == "pack-engram" for c in app.registered_commands):
        return
    app.command("pack-engram")(pack_engram)
