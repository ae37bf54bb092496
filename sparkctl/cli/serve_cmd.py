"""``sparkctl serve`` / ``status`` / ``logs`` / ``stop``: parse what the four verbs share, then hand
over to the CLI half of the profile's launcher (``front``: ``cli/containers_cmd``, ``cli/native_cmd``),
which calls its operations and prints."""

from __future__ import annotations

from functools import partial
from importlib import import_module
from typing import Optional

import typer

from sparkctl import launchers
from sparkctl.cli.answer import finish, table as _table
from sparkctl.cli.context import ENV_OPTION, JSON_OPTION, PROFILE_OPTION, SET_OPTION, split_hosts, state
from sparkctl.cli.confirm import confirm
from sparkctl.cli.option_groups import DeploymentChoice, with_option_groups
from sparkctl.cli.context import YES_OPTION
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION, GRACE_OPTION, HEALTH_TIMEOUT_OPTION
from sparkctl.errors import ConfigError

ACCEPT_NEW = typer.Option(False, "--accept-new-host-keys", help="Record unknown host keys (never changed ones).")
CONNECT_TIMEOUT = CONNECT_TIMEOUT_OPTION
BREAK_LOCK = typer.Option(False, "--break-lock", help="Remove a deploy lock whose run is gone (never a live one), then go on.")
FORCE_BREAK_LOCK = typer.Option(False, "--force-break-lock",
                                help="Remove the deploy lock whoever holds it, even a run that may be alive. Dangerous.")


def _pool(timeout: float, accept_new: bool):
    from sparkctl.cli.context import connections

    return connections(timeout, accept_new)


def _hosts_for(inventory, wanted: list[str] | None):
    return inventory.pick(wanted)


def front(profile):
    """The CLI half of the profile's launcher (``cli/containers_cmd``, ``cli/native_cmd``): it runs and prints
    serve, status, logs and stop; each verb here parses what they share and hands over."""
    return import_module(launchers.of(profile).cli_module)


# ---------------------------------------------------------------------------------------------- serve


@with_option_groups
def serve(
    ctx: typer.Context,
    deployment: DeploymentChoice,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (files, containers, lock, health check) and stop."),
    timeout: Optional[float] = HEALTH_TIMEOUT_OPTION,
    break_lock: bool = BREAK_LOCK,
    force_break_lock: bool = FORCE_BREAK_LOCK,
    log_tail: int = typer.Option(40, "--log-tail", min=0, max=10000, help="Lines of each host's container log printed when the start fails."),
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    parallel: bool = typer.Option(False, "--parallel",
                                  help="replicas: restart every replica at once (faster; requests fail meanwhile) "
                                       "instead of one at a time out of the router."),
    replica: Optional[str] = typer.Option(None, "--replica", help="replicas: only these (comma-separated numbers, from 1)."),
    yes: bool = YES_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Start the profile's engine on every host and wait until its OpenAI endpoint serves the model.

    With `replicas: N` every replica is served (one at a time, drained out of the router, once the
    router serves; --parallel: all at once) and the router in front of them is started.

    Files go to <paths.state_dir>/<profile>/ on each host (default /var/lib/sparkctl), under a deploy lock on the head; old
    containers of the profile are replaced. On failure each host's container log tail is printed.
    """
    if force_break_lock and not dry_run:
        confirm_force_break(yes)
    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    loaded = deployment.load()
    if replica is not None and loaded.profile.replicas <= 1:
        # not ignored: a serve meant for one replica must not replace the whole deployment
        raise ConfigError(f"profile {deployment.profile} has no replicas to pick from (replicas: {loaded.profile.replicas})",
                          field="--replica")
    locks = {"break_lock": break_lock, "force_break_lock": force_break_lock}
    pool_factory = partial(_pool, connect_timeout, accept_new_host_keys)
    front(loaded.profile).serve(out, inventory, loaded, deployment, dry_run=dry_run, timeout=timeout, log_tail=log_tail,
                                parallel=parallel, replica=replica, locks=locks, pool_factory=pool_factory)


# ---------------------------------------------------------------------------------------------- status


@with_option_groups
def status(
    ctx: typer.Context,
    deployment: DeploymentChoice,
    watch: Optional[float] = typer.Option(None, "--watch", min=1.0, max=86400, help="Ask again every N seconds and print what changed, until Ctrl-C (exit: the last answer's)."),
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Per host the profile's container and its state, then the head's /health and model list, and
    what drifted since the serve: a new image under the tag, other arguments or environment than the
    profile renders now (with the serve's --set, then the --set/--env given here).

    Exit 0 only when every host of the deployment runs its container, all of them images of the
    same content, and the endpoint serves the model (drift alone is reported, not failed).
    """
    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    loaded = deployment.load()
    chosen = _hosts_for(inventory, deployment.wanted_hosts)
    pool_factory = partial(_pool, connect_timeout, accept_new_host_keys)
    front(loaded.profile).status(out, inventory, chosen, loaded, deployment, watch=watch, pool_factory=pool_factory)


# ---------------------------------------------------------------------------------------------- logs


def logs(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    host: Optional[str] = typer.Option(None, "--host", help="Only this host (default: every host of the deployment)."),
    tail: int = typer.Option(100, "--tail", "-n", min=0, max=1_000_000, help="Lines from the end of each log (0: all)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines (Ctrl-C stops)."),
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    json_flag: bool = JSON_OPTION,
) -> None:
    """The engine containers' logs (docker logs), host by host or followed together."""
    from sparkctl.config.profile import load_profile
    from sparkctl.errors import ConfigError

    st = state(ctx)
    out = st.output(json_flag)
    if follow and out.json_mode:
        raise ConfigError("--follow streams text; it has no --json form", field="--follow")
    inventory = st.inventory()
    loaded = load_profile(profile, sets=sets, envs=envs)  # a bad profile is a usage error, not "no containers"
    chosen = _hosts_for(inventory, [host] if host else None)
    wanted_tail = tail if tail > 0 else None
    pool_factory = partial(_pool, connect_timeout, accept_new_host_keys)
    front(loaded.profile).logs(out, inventory, chosen, loaded, sets=sets, tail=wanted_tail, follow=follow,
                               pool_factory=pool_factory)


# ---------------------------------------------------------------------------------------------- stop


def stop(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated host names (default: every inventory host)."),
    break_lock: bool = BREAK_LOCK,
    force_break_lock: bool = FORCE_BREAK_LOCK,
    timeout: int = GRACE_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    accept_new_host_keys: bool = ACCEPT_NEW,
    connect_timeout: float = CONNECT_TIMEOUT,
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be stopped on each host; stop nothing."),
    yes: bool = YES_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Stop and remove the profile's containers on every host (the head first). Safe to repeat.
    Asks first (-y/--yes answers; without a terminal it refuses unless -y is given)."""
    from sparkctl.config.profile import load_profile

    st = state(ctx)
    out = st.output(json_flag)
    inventory = st.inventory()
    loaded = load_profile(profile, sets=sets, envs=envs)
    chosen = _hosts_for(inventory, split_hosts(hosts))
    if dry_run:
        _stop_dry_run(out, inventory, chosen, loaded, pool_factory=lambda: _pool(connect_timeout, accept_new_host_keys))
        return
    if force_break_lock:
        confirm_force_break(yes)
    confirm(f"stop profile {profile} on {', '.join(h.name for h in chosen)} (its engines stop serving)?", yes=yes)
    front(loaded.profile).stop(out, inventory, chosen, loaded, every_host=not hosts, break_lock=break_lock,
                               force_break_lock=force_break_lock, grace_s=timeout,
                               pool_factory=lambda: _pool(connect_timeout, accept_new_host_keys))


def confirm_force_break(yes: bool) -> None:
    confirm("--force-break-lock removes the deploy lock even when the run holding it may still be alive "
            "(two runs may then change the hosts at once); go on?", yes=yes)


def _stop_dry_run(out, inventory, chosen, loaded, *, pool_factory) -> None:
    """What stop would remove on each host, read without the lock and without changing anything."""
    with pool_factory() as pool:
        plan = launchers.of(loaded.profile).plan_stop(inventory, chosen, loaded, pool=pool)
    rows = [("host", "would stop")]
    for h in plan["hosts"]:
        rows.append((h["name"], ", ".join(h["would_stop"]) or ("nothing" if h["ok"] else f"unreachable: {h['error']}")))
    router = f"\nrouter: {plan['router']}" if plan.get("router") else ""
    finish(out, plan, _table(rows) + router + "\n(dry run: nothing stopped)", plan["ok"])


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``status``, ``logs`` and ``stop`` to the top-level app."""
    for name, fn in (("serve", serve), ("status", status), ("logs", logs), ("stop", stop)):
        app.command(name)(fn)
