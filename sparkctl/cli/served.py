"""The deployment a client verb talks to (``bench``, ``smoke``, ``top``): named by --profile or by
--endpoint, the profile read with its --set/--env, and the endpoint found where it was deployed."""

from __future__ import annotations

import os
from dataclasses import dataclass

import typer

from sparkctl.cli.context import ENV_OPTION, SET_OPTION, connections
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION
from sparkctl.errors import ConfigError

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


def require_deployment(profile: str | None, endpoint: str | None) -> None:
    """A client verb needs to know whom to talk to: a profile, or an endpoint."""
    if profile is None and endpoint is None:
        raise ConfigError("name the deployment: --profile P (or --endpoint URL)", field="--profile")
    if endpoint is not None:
        check_endpoint(endpoint)


API_KEY_ENV_OPTION = typer.Option(None, "--api-key-env",
                                  help="With --endpoint: the environment variable holding the API key (never the key itself).")


def key_from_env(api_key_env: str | None) -> str | None:
    """--api-key-env: the key held by that environment variable (the key itself is never an argument)."""
    if api_key_env is None:
        return None
    if not os.environ.get(api_key_env):
        raise ConfigError(f"environment variable {api_key_env} is not set (it holds the API key)", field="--api-key-env")
    return os.environ[api_key_env]


def check_endpoint(endpoint: str) -> None:
    """--endpoint is a base URL, http(s)://HOST[:PORT][/PATH]: anything else is the user's error
    (exit 2), said once, not a failed request per check or an "unexpected" error from the client."""
    from urllib.parse import urlsplit

    if "@" in endpoint.partition("://")[2].split("/", 1)[0]:  # USER:PASSWORD@: never echoed, not even when bad
        raise ConfigError("a URL with credentials (USER:PASSWORD@) is refused: they would be printed with the "
                          "endpoint; give the API key with --api-key-env", field="--endpoint")
    problem = None
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 -- a port that is not a number from 0 to 65535 raises here
    except ValueError as exc:
        problem = str(exc)
    else:
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problem = "expected a base URL such as http://HOST:PORT"
        elif any(ch.isspace() or not ch.isprintable() for ch in endpoint):
            problem = "it contains whitespace or control characters"
    if problem:
        raise ConfigError(f"{endpoint!r} is not an http(s) base URL ({problem})", field="--endpoint")


@dataclass
class ServedLookup:
    """How a client verb finds the deployment of a profile (an option group, see option_groups):
    the profile's overrides, and how long to wait for the hosts asked where it runs."""

    sets: list[str] = SET_OPTION
    envs: list[str] = ENV_OPTION
    connect_timeout: float = CONNECT_TIMEOUT_OPTION

    def profile(self, name: str | None, *, api_key: str | None = None):
        """The profile (None without --profile) and the API key its endpoint expects (None: no key).
        ``api_key`` given (smoke's --api-key-env) wins: the profile's key is then not even read."""
        if name is None:
            return None, api_key
        from sparkctl.config.apikey import api_key_for
        from sparkctl.config.profile import load_profile

        loaded = load_profile(name, sets=self.sets, envs=self.envs).profile
        return loaded, api_key or api_key_for(loaded)

    def connections(self):
        """This command's connections (a ``with``)."""
        return connections(self.connect_timeout)

    def find(self, inventory, loaded):
        """Where ``loaded`` is served: (endpoint, served model name, what was deployed or None),
        asked of the inventory's hosts."""
        from sparkctl.ops.bench import find_target

        with self.connections() as pool:
            return find_target(inventory, loaded, pool=pool)
