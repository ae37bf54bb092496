"""``sparkctl up``: parse, call ``sparkctl.ops.up``, print."""

from __future__ import annotations

from typing import Optional

import typer

from sparkctl.cli.context import (ENV_OPTION, HOSTS_OPTION, JSON_OPTION, PROFILE_OPTION, SET_OPTION, YES_OPTION,
                                  connections, split_hosts, state)
from sparkctl.cli.serve_cmd import (ACCEPT_NEW, BREAK_LOCK, CONNECT_TIMEOUT, FORCE_BREAK_LOCK, _table,
                                    confirm_force_break)
from sparkctl.cli.setup_cmd import read_become_password
from sparkctl.cli.timeouts import HEALTH_TIMEOUT_OPTION
from sparkctl.errors import EXIT_FAILED, ConfigError

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


def up(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    hosts: Optional[str] = HOSTS_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    build_on: Optional[str] = typer.Option(None, "--build-on", help="Build the image on this inventory host (default: the head)."),
    context: Optional[str] = typer.Option(None, "--context", help="The image's build context folder (as `build --context`; default: the chain's `context`, or $SPARKCTL_BUILD_CONTEXT). See docs/images.md."),
    model_source: Optional[str] = typer.Option(
        None, "--model-source", help="The checkpoint step: hf:OWNER/NAME or a folder to check every host's copy "
        "against and repair from (see `sparkctl model sync`). Without it the step is skipped."),
    model_from: Optional[str] = typer.Option(None, "--model-from", help="The inventory host holding the --model-source folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (which steps will act, and why) and stop."),
    timeout: Optional[float] = HEALTH_TIMEOUT_OPTION,
    break_lock: bool = BREAK_LOCK,
    force_break_lock: bool = FORCE_BREAK_LOCK,
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    parallel: bool = typer.Option(False, "--parallel",
                                  help="replicas: restart every replica that must restart at once (faster; requests "
                                       "fail meanwhile) instead of one at a time drained out of the router."),
    no_setup: bool = typer.Option(False, "--no-setup", help="Refuse hosts that need `sparkctl setup` instead of running it first."),
    ask_become_pass: bool = typer.Option(False, "--ask-become-pass", "-K", help="The setup step's sudo password, read once from the terminal."),
    yes: bool = YES_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Converge the cluster to the profile: doctor, checkpoint, build, distribute, engram shards, serve, smoke.

    Each step is skipped when it is already true, so a second `up` changes nothing, and a failed one
    run again continues from where it stopped. Exit 0 when every step ends ok or changed.
    """
    from sparkctl.ops.up import UpOptions
    if force_break_lock and not dry_run:
        confirm_force_break(yes)
    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    _check_model_source(model_source, model_from)
    options = UpOptions(sets=tuple(sets), envs=tuple(envs), hosts=split_hosts(hosts), build_on=build_on,
                        health_timeout_s=timeout, break_lock=break_lock, force_break_lock=force_break_lock,
                        model_source=model_source, model_from=model_from, parallel=parallel, context=context,
                        no_setup=no_setup)
    with connections(connect_timeout, accept_new_host_keys, remember_facts=True) as pool:
        report = _converge(inventory, profile, options, pool, out, dry_run=dry_run, ask_become_pass=ask_become_pass)
    if report.message and out.json_mode:
        out.reporter.note(f"up refused: {report.message}")
    out.result(report.to_json(), format_plan(report) if dry_run else format_report(report))
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _converge(inventory, profile: str, options, pool, out, *, dry_run: bool, ask_become_pass: bool):
    """The plan (``--dry-run``: the answer; no lock, nothing changes), or the run: its steps' events on
    stderr as they come (``out.reporter``), the report folded from them."""
    from sparkctl.ops.hcas import resolve_up_hcas
    from sparkctl.ops.up import Up

    inventory = resolve_up_hcas(inventory, pool)  # `hcas: up`: the devices Up on each host, in NCCL_IB_HCA
    run = Up(inventory, profile, options, pool=pool, out=out, reporter=out.reporter)
    if dry_run:  # a step that cannot even look fails the plan
        plan = run.plan()
        plan.dry_run = True
        return plan
    run.become = read_become_password(ask_become_pass)
    return run.run(on_plan=lambda plan: out.reporter.note(format_plan(plan)))


def format_plan(report) -> str:
    from sparkctl.ops.up import CHECKS

    acting = [s for s in report.steps if s.status == "planned" and s.name not in CHECKS]
    head = (f"up {report.profile}: " + (f"{len(acting)} step(s) to act" if acting else "nothing to do, every step is already true"))
    return head + "\n" + "\n".join(f"  {s.name:<10} {_planned(s):<8}  {s.reason}" for s in report.steps)


def _planned(step) -> str:
    from sparkctl.ops.up import CHECKS

    if step.status != "planned":
        return step.status
    return "check" if step.name in CHECKS else "will act"


def format_report(report) -> str:
    if report.message:
        return f"up refused: {report.message}"
    rows = [("step", "status", "seconds", "reason")]
    rows += [(s.name, s.status, f"{s.seconds:.1f}", s.reason) for s in report.steps]
    changed = [s.name for s in report.steps if s.status == "changed"]
    summary = ("up: " + ("ok" if report.ok else "failed") + f" in {report.seconds:.1f} s; "
               + (f"changed: {', '.join(changed)}" if changed else "nothing changed"))
    return _table(rows) + "\n" + summary + (f"; endpoint {report.endpoint}" if report.ok else "")


def register(app: typer.Typer) -> None:
    app.command("up")(up)


def _check_model_source(model_source: Optional[str], model_from: Optional[str]) -> None:
    """A --model-source up cannot use is said before any host is asked (it was found at the checkpoint
    step, after setup and doctor had run on every host, exit 1)."""
    if not model_source:
        return
    import os

    from sparkctl.model.plan import parse_source

    try:
        source = parse_source(model_source)
    except ConfigError as err:
        raise ConfigError(err.detail, field="--model-source") from None
    if source.kind == "dir" and model_from is None and not os.path.isdir(source.path):
        raise ConfigError(f"no such folder on this machine: {source.path} (a folder on a host: --model-from HOST)",
                          field="--model-source")
