"""``sparkctl render``: per host, the env file, docker run argv, engine argv and compose file of a profile."""

from __future__ import annotations

import os
import shlex
from typing import Optional

import typer

from sparkctl.cli.context import (ENV_OPTION, HOSTS_OPTION, JSON_OPTION, PROFILE_OPTION, SET_OPTION, connections,
                                  split_hosts, state)
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION
from sparkctl.errors import ConfigError

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


def render(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    out: Optional[str] = typer.Option(
        None, "--out", "-o", metavar="DIR", help="Write the files under DIR: DIR/<host>/... and DIR/recipe.yaml."
    ),
    hosts: Optional[str] = HOSTS_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    ask_hosts: bool = typer.Option(False, "--ask-hosts", help="Ask each `hcas: up` host which RDMA devices are Up "
                                   "(read-only) and render them into its NCCL_IB_HCA. Without it render asks no host."),
    offline: bool = typer.Option(False, "--offline", hidden=True, help="Ask no host (the default; kept for "
                                 "scripts written when render asked by default)."),
    connect_timeout: float = CONNECT_TIMEOUT_OPTION,
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys",
                                              help="Record unknown host keys (never changed ones)."),
    json_flag: bool = JSON_OPTION,
) -> None:
    """Render what every host runs: environment, `docker run`, engine command, compose file, sparkrun recipe.

    Nothing is started, and no host is asked: without --out a summary is printed; with --out the
    files are written. Hosts whose inventory says `hcas: up` get their NCCL_IB_HCA only with
    --ask-hosts (serve and up set it when they start).
    """
    from sparkctl.config.profile import load_profile
    from sparkctl.ops.hcas import render_notes
    from sparkctl.ops.render import render as render_plan

    st = state(ctx)
    output = st.output(json_flag)
    if ask_hosts and offline:
        raise ConfigError("--ask-hosts asks the hosts, --offline says not to: pass one", field="--ask-hosts")
    loaded = load_profile(profile, sets=sets, envs=envs).profile
    inventory, missed = _with_up_hcas(st.inventory(), ask_hosts, connect_timeout, accept_new_host_keys)
    if loaded.replicas > 1:
        from sparkctl.ops.replicas import split_replicas

        used = {name for replica in split_replicas(loaded, inventory.hosts, split_hosts(hosts), sets)[0]
                for name in replica.hosts}  # the notes name only the hosts the replicas run on
        for note in render_notes([h for h in inventory.hosts if h.name in used], missed, asked=ask_hosts):
            output.console.print(f"note: {note}", soft_wrap=True, markup=False)
        _render_replicas(output, inventory, loaded, profile, sets, envs, split_hosts(hosts), out)
        return
    plan, written = render_plan(inventory, profile, sets=sets, envs=envs, wanted_hosts=split_hosts(hosts), out_dir=out)
    rendered = {h.name for h in plan.hosts}
    plan.notes[:0] = render_notes([h for h in inventory.hosts if h.name in rendered], missed, asked=ask_hosts)
    for note in plan.notes:  # stderr, unwrapped: CI logs keep one line per message
        output.console.print(f"note: {note}", soft_wrap=True, markup=False)
    if out is not None and not output.json_mode:
        output.console.print(f"wrote {len(written)} files under {out}", soft_wrap=True, markup=False)
    output.result(plan.to_json(written), format_summary(plan, written))


def _with_up_hcas(inventory, ask_hosts: bool, connect_timeout: float, accept_new: bool):
    """With --ask-hosts, `hcas: up` resolved as serve resolves it (the devices Up on each host now),
    and the hosts that could not be asked (host -> why); else the inventory as it is."""
    from sparkctl.ops.hcas import ask_up_hcas

    if not ask_hosts or not any(h.hcas_up for h in inventory.hosts):
        return inventory, {}
    with connections(connect_timeout, accept_new) as pool:
        return ask_up_hcas(inventory, pool)


def _render_replicas(output, inventory, loaded, profile: str, sets, envs, hosts, out: Optional[str]) -> None:
    """Every replica rendered as its own deployment (files under DIR/replica-N/), then the router's command."""
    from sparkctl.commands import router as R
    from sparkctl.ops.render import check_out_named, check_render_out, render as render_plan, write_render
    from sparkctl.ops.replicas import split_replicas

    if out is not None:
        check_out_named(out)
    replicas, note = split_replicas(loaded, inventory.hosts, hosts, sets)
    # every replica planned and every place checked before a file is written: nothing half-written
    plans = [render_plan(inventory, profile, sets=list(replica.sets), envs=envs, wanted_hosts=list(replica.hosts))[0]
             for replica in replicas]
    wheres = [os.path.join(out, f"replica-{replica.index + 1}") if out is not None else None for replica in replicas]
    for plan, where in zip(plans, wheres):
        if where is not None:
            check_render_out(plan, where)
    docs, parts = [], []
    for replica, plan, where in zip(replicas, plans, wheres):
        written = write_render(plan, where) if where is not None else {}
        docs.append({"replica": replica.index + 1, "hosts": list(replica.hosts), "render": plan.to_json(written)})
        parts.append(f"== {replica.name}: {', '.join(replica.hosts)} (head {replica.head})\n"
                     + format_summary(plan, written))
    router_argv = R.docker_run_argv(loaded, inventory.model.paths.state_dir)
    parts.append(f"== router on {replicas[0].head}: {' '.join(router_argv[:router_argv.index('-c')])} -c LAUNCHER "
                 + " ".join(R.router_args(loaded.router)))
    if note:
        output.console.print(f"note: {note}", soft_wrap=True, markup=False)
    output.result({"profile": loaded.name, "replicas": docs, "router": {"host": replicas[0].head, "argv": router_argv}},
                  "\n\n".join(parts))


def format_summary(plan, written: dict[str, str]) -> str:
    """Environment shared by all hosts once, then per host: its own variables, docker run, engine command."""
    from sparkctl.commands.sparkrun import shared_env
    from sparkctl.secrets import mask_argv, mask_env

    shared, _ = shared_env([mask_env(h.env) for h in plan.hosts])
    lines = [f"profile {plan.profile} ({plan.engine}), {len(plan.hosts)} hosts", "", "env (every host):"]
    lines += [f"  {name}={value}" for name, value in shared.items()]
    for host in plan.hosts:
        own = {name: value for name, value in mask_env(host.env).items() if name not in shared}
        docker_part = mask_argv(host.docker_argv[: len(host.docker_argv) - len(host.engine_argv)])
        lines += ["", f"{host.name}  rank {host.rank} ({host.role})"]
        if own:
            lines += ["  env:"] + [f"    {name}={value}" for name, value in own.items()]
        if host.docker_argv:
            lines += ["  docker (the engine command follows the image):", f"    {shlex.join(docker_part)}"]
        if host.engine_argv:
            lines += ["  engine:" if host.docker_argv else "  engine (a process on the host, no container):",
                      f"    {shlex.join(mask_argv(host.engine_argv))}"]
    if written:
        lines += ["", "files:"] + [f"  {path}" for path in written.values()]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    app.command("render")(render)
