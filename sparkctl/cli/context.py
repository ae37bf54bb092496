"""State shared by every command: the global options, and the helpers that load what they name."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import typer

from sparkctl.cli.completion_cmd import complete_hosts, complete_profiles
from sparkctl.output import Output

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


@dataclass
class AppState:
    inventory_option: str | None = None
    json_mode: bool = False
    verbose: bool = False
    _output: Output | None = field(default=None, repr=False)

    def output(self, json_flag: bool = False) -> Output:
        if self._output is None or (json_flag and not self._output.json_mode):
            self._output = Output(json_mode=self.json_mode or json_flag, verbose=self.verbose)
        return self._output

    def inventory(self):
        from sparkctl.config.inventory import load_inventory, resolve_inventory_path

        return load_inventory(resolve_inventory_path(self.inventory_option))


def connections(connect_timeout: float = 10.0, accept_new_host_keys: bool = False, *, remember_facts: bool = False):
    """This command's connections, one per host, closed when it ends (use it in a ``with``): the
    one place the CLI opens SSH; the steps it calls get these, not connections of their own.
    ``remember_facts``: each host's answers are kept while it is unchanged (``up``)."""
    from sparkctl.remote.pool import ConnectionPool

    return ConnectionPool(connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys,
                          remember_facts=remember_facts)


def echo_remote_commands() -> None:
    """``-v``: every remote command, per host, on stderr before it runs."""
    from sparkctl.remote.echo import echo_to

    echo_to(lambda line: print(line, file=sys.stderr, flush=True))


def log_ssh(path: str) -> None:
    """SPARKCTL_SSH_LOG: paramiko's own debug log (why did a connection drop?)."""
    from sparkctl.remote.debuglog import log_ssh_to

    log_ssh_to(path)


def state(ctx: typer.Context) -> AppState:
    return ctx.find_root().obj


def split_hosts(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _profile_or_default(value: str | None) -> str:
    """--profile, else the per-user default (`sparkctl init --default-profile P`, $SPARKCTL_PROFILE)."""
    if value:
        return value
    from sparkctl.config.userconfig import default_profile

    chosen = default_profile()
    if not chosen:
        raise typer.BadParameter("name a profile (see `sparkctl profiles`), or set a default once with "
                                 "`sparkctl init --default-profile P`", param_hint="'--profile'")
    return chosen


def _complete_profiles(incomplete: str) -> list[str]:
    return complete_profiles(incomplete)


def _complete_hosts(incomplete: str) -> list[str]:
    return complete_hosts(incomplete)


# Options shared by every verb that takes a profile.
PROFILE_OPTION = typer.Option(None, "--profile", "-p", callback=_profile_or_default, autocompletion=_complete_profiles,
                              help="Profile name (see `sparkctl profiles`; default: the one `sparkctl init --default-profile` saved).")
SET_OPTION = typer.Option([], "--set", help="Override a profile field by dotted path: KEY=VALUE (repeatable).")
ENV_OPTION = typer.Option([], "--env", help="Set an engine/NCCL environment variable: NAME=VALUE (repeatable).")
HOSTS_OPTION = typer.Option(None, "--hosts", autocompletion=_complete_hosts, help="Comma-separated host names (default: the head and the first TP-1 workers).")
JSON_OPTION = typer.Option(False, "--json", help="Print exactly one JSON document on stdout.")
DRY_RUN_OPTION = typer.Option(False, "--dry-run", help="Say what would change, and change nothing.")
YES_OPTION = typer.Option(False, "--yes", "-y", help="Do it without asking (needed without a terminal).")
