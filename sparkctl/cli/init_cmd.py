"""``sparkctl init``: write an inventory (asking each host over SSH) and the per-user defaults."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from sparkctl.cli.context import DRY_RUN_OPTION, JSON_OPTION, state
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION
from sparkctl.errors import ConfigError
from sparkctl.fileio import check_writable_folder

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


def init(
    ctx: typer.Context,
    hosts: Optional[str] = typer.Option(None, "--hosts", help="The boxes, head first: NAME=ADDRESS or ADDRESS, comma-separated (each is asked over SSH)."),
    profile: Optional[str] = typer.Option(None, "--default-profile", help="Save this profile as the default for later commands (their --profile)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the inventory (default: the per-user one, $XDG_CONFIG_HOME/sparkctl/inventory.yaml)."),
    example: bool = typer.Option(False, "--example", help="Write the commented example inventory (every field) instead of asking hosts."),
    cluster: str = typer.Option("spark", "--cluster", help="A name for the cluster."),
    user: Optional[str] = typer.Option(None, "--user", help="SSH user (default: ~/.ssh/config, then your user name)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="SSH port (default: ~/.ssh/config, then 22)."),
    identity_file: Optional[str] = typer.Option(None, "--identity-file", help="SSH private key (default: ~/.ssh/config, ssh-agent, ~/.ssh/id_*)."),
    known_hosts: Optional[str] = typer.Option(None, "--known-hosts", help="An extra known_hosts file for the hosts' keys."),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="Record unknown host keys (never changed ones)."),
    nvme_path: str = typer.Option("/mnt/nvme", "--nvme-path", help="The hosts' NVMe mount (checkpoint, Engram shards)."),
    model_dir: Optional[str] = typer.Option(None, "--model-dir", help="Where the checkpoint is on every host (default: NVME/models/DeepSeek-V4.1-Flash)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing inventory file."),
    connect_timeout: float = CONNECT_TIMEOUT_OPTION,
    dry_run: bool = DRY_RUN_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Write an inventory from --hosts (asking each host for its fabric ports and addresses) and make
    it, and --profile, the defaults later commands use without -i / --profile."""
    from sparkctl.config import userconfig
    st = state(ctx)
    output = st.output(json_flag)
    if not hosts and not example:
        if profile is None:
            raise ConfigError("give --hosts HOST1,HOST2,... (or --example, or --default-profile P to only set the "
                              "default profile)", field="--hosts")
        _save_profile_only(output, profile, dry_run)
        return
    target = Path(os.path.expanduser(str(out))) if out else userconfig.config_dir() / userconfig.INVENTORY_FILE
    _check_target(target)
    if target.exists() and not force and not dry_run:
        raise ConfigError(f"{target} exists; pass --force to replace it, or --out FILE", field="--out")
    if profile is not None:
        _check_profile(profile)
    if example:
        text, facts = _example_text(), []
    else:
        text, facts = _probe_and_render(hosts, cluster=cluster, user=user, port=port, identity_file=identity_file,
                                        known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys,
                                        nvme_path=nvme_path, model_dir=model_dir, connect_timeout=connect_timeout)
    _finish(output, target, text, facts, profile=profile, dry_run=dry_run, per_user=out is None)


def _probe_and_render(hosts: str, **choices) -> tuple[str, list]:
    from sparkctl.config.inventory import parse_inventory
    from sparkctl.config.yamlfile import parse_yaml_text
    from sparkctl.ops.init import SshChoice, parse_host_specs, probe_hosts
    from sparkctl.ops.init_render import render_inventory

    specs = parse_host_specs(hosts)
    expand = lambda p: os.path.abspath(os.path.expanduser(p)) if p else None  # noqa: E731 (absolute: the inventory wants it)
    ssh = SshChoice(user=choices["user"], port=choices["port"], identity_file=expand(choices["identity_file"]),
                    known_hosts=expand(choices["known_hosts"]))
    facts = probe_hosts(specs, ssh, connect_timeout=choices["connect_timeout"],
                        accept_new_host_keys=choices["accept_new_host_keys"])
    command = "sparkctl init " + " ".join(shlex.quote(a) for a in sys.argv[2:] if a not in ("--json",))
    text = render_inventory(facts, cluster=choices["cluster"], ssh=ssh, nvme_path=choices["nvme_path"],
                            paths=_paths(choices["nvme_path"], choices["model_dir"]), command=command.strip())
    parse_inventory(parse_yaml_text(text, "<init>"))  # what is written must load (never a half-right file)
    return text, facts


def _paths(nvme_path: str, model_dir: str | None) -> dict[str, str]:
    """The data folders, on the NVMe (the defaults of the inventory's `paths`, moved with --nvme-path)."""
    nvme = nvme_path.rstrip("/") or "/"
    return {"model_dir": model_dir or f"{nvme}/models/DeepSeek-V4.1-Flash", "engram_dir": f"{nvme}/engram",
            "hf_cache": f"{nvme}/hf-cache", "state_dir": "/var/lib/sparkctl"}


def _example_text() -> str:
    from sparkctl.resources import example_inventory

    return example_inventory().read_text(encoding="utf-8")


def _check_profile(profile: str) -> None:
    from sparkctl.config.profile import load_profile

    load_profile(profile)  # an unknown name fails here, with its "did you mean"


def _save_profile_only(output, profile: str, dry_run: bool) -> None:
    from sparkctl.config import userconfig

    _check_profile(profile)
    path = userconfig.config_dir() / userconfig.CONFIG_FILE
    if not dry_run:
        userconfig.write_config(profile=profile)
    output.result({"ok": True, "dry_run": dry_run, "config": str(path), "profile": profile},
                  f"{'would set' if dry_run else 'set'} the default profile to {profile} ({path})")


def _check_target(target: Path) -> None:
    """The inventory goes where a regular file can be written, asked before any host is: --force
    replaces a file, never a device, pipe, socket or folder (a rename over /dev/full replaced the
    device node), and a missing or unwritable folder is the user's --out, not an unexpected error."""
    try:
        if target.exists() and not target.is_file():
            raise ConfigError(f"{target} is not a regular file (a folder, device, pipe or socket); name a file",
                              field="--out")
        existing = next(p for p in [target.parent, *target.parent.absolute().parents] if p.exists())
    except OSError as err:
        raise ConfigError(f"cannot look at {target}: {err.strerror or err}", field="--out") from None
    check_writable_folder(existing, f"the folder of {target.name} must be", field="--out")


def _finish(output, target: Path, text: str, facts: list, *, profile, dry_run: bool, per_user: bool) -> None:
    from sparkctl.config import userconfig

    unreached = [f for f in facts if f.error]
    config_path = userconfig.config_dir() / userconfig.CONFIG_FILE
    if not dry_run and not unreached:  # an inventory missing a host's answers is not written
        try:
            userconfig.write_atomically(target, text)
        except OSError as err:
            raise ConfigError(f"cannot write {target}: {err.strerror or err}", field="--out") from None
        if profile is not None or not per_user:
            userconfig.write_config(profile=profile, inventory=None if per_user else str(target.resolve()))
    document = {"ok": not unreached, "dry_run": dry_run, "written": not dry_run and not unreached, "inventory": str(target), "config": str(config_path),
                "profile": profile, "hosts": [f.to_json() for f in facts]}
    if output.json_mode:
        output.result(document)
    else:
        if dry_run:
            sys.stdout.write(text)
        for host in facts:
            output.info(f"{host.name} ({host.spec.address}): " + (
                f"not reached: {host.error}" if host.error else
                f"fabric {','.join(host.interfaces) or '-'}, hcas {','.join(host.hcas) or '-'}, "
                f"addresses {','.join(host.fabric_addresses) or '-'}"))
        verb = "would write" if dry_run else ("did not write" if unreached else "wrote")
        output.info(f"{verb} {target}" + (f"; default profile {profile}" if profile and not unreached else ""))
        if unreached:
            output.info("every host must answer: fix the SSH settings (--user, --identity-file, --known-hosts) and run init again")
        elif not dry_run:
            output.info("next: `sparkctl inventory check`, then `sparkctl doctor`" + (
                "" if per_user else f" (this inventory is now the default: {config_path})"))
    if unreached:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("init")(init)
