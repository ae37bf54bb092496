"""The deployment a client verb talks to (``bench``, ``smoke``, ``top``): named by --profile or by
--endpoint, the profile read with its --set/--env, and the endpoint found where it was deployed."""

from __future__ import annotations


def require_deployment(profile: str | None, endpoint: str | None) -> None:
    """A client verb needs to know whom to talk to: a profile, or an endpoint."""
    from sparkctl.errors import ConfigError

    if profile is None and endpoint is None:
        raise ConfigError("name the deployment: --profile P (or --endpoint URL)", field="--profile")


def served_profile(profile: str | None, sets, envs, *, api_key: str | None = None):
    """The profile (None without --profile) and the API key its endpoint expects (None: no key).
    ``api_key`` given (smoke's --api-key-env) wins: the profile's key is then not even read."""
    if profile is None:
        return None, api_key
    from sparkctl.config.apikey import api_key_for
    from sparkctl.config.profile import load_profile

    loaded = load_profile(profile, sets=sets, envs=envs).profile
    return loaded, api_key or api_key_for(loaded)


def find_deployed(inventory, loaded, connect_timeout: float):
    """Where ``loaded`` is served: (endpoint, served model name, what was deployed or None), asked of
    the inventory's hosts on connections of this command's own."""
    from sparkctl.cli.context import connections
    from sparkctl.ops.bench import find_target

    with connections(connect_timeout) as pool:
        return find_target(inventory, loaded, pool=pool)
