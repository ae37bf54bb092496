"""The engine container's environment for one host: derived values, then the profile's ``env`` on top.

Derived values come from the inventory (the host's fabric interfaces, RDMA devices and fabric
address) and from the engine settings (Engram-on-disk switches, FlashInfer autotune). A profile
``env`` entry, or ``--env`` which lands in it, always wins over a derived value: the user may know
better than the inventory (e.g. ``NCCL_IB_HCA=^mlx5_1``).
"""

from __future__ import annotations

import re

from sparkctl import engines
from sparkctl.config.apikey import api_key_for
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError

API_KEY_VARIABLE = "VLLM_API_KEY"  # vLLM's; the one engine sparkctl passes a key to (engines/vllm.py)
# Characters that docker's --env-file and compose's env_file would read differently (quotes,
# interpolation, inline comments, escapes) or that would break the one-variable-per-line format.
_UNSAFE_VALUE = re.compile(r"[\s\"'`$#\\\x00-\x1f\x7f]")


def host_env(host) -> dict[str, str]:
    """Per-host values from the inventory; the interface/HCA ones only when the inventory names some."""
    env: dict[str, str] = {}
    if host.fabric_interfaces:
        interfaces = ",".join(host.fabric_interfaces)
        env["NCCL_SOCKET_IFNAME"] = interfaces
        env["GLOO_SOCKET_IFNAME"] = interfaces
        env["TP_SOCKET_IFNAME"] = interfaces
    if host.hcas:
        env["NCCL_IB_HCA"] = ",".join(host.hcas)
    return env


def engine_env(profile: Profile, host, spec=None) -> dict[str, str]:
    """Engine-specific derived values (``spec``: the engine's surface, which decides the autotune switch)."""
    return {**engines.get(profile.engine).env(profile, host, spec), **api_key_env(profile)}


def api_key_env(profile: Profile) -> dict[str, str]:
    """The API key for the engine, in the 0600 env file only (never argv, compose.yaml or launch.sh)."""
    key = api_key_for(profile)
    if key is None:
        return {}
    field = "serving.api_key_env" if profile.serving.api_key_env else "serving.api_key_file"
    return engines.get(profile.engine).api_key_env(key, field)


def without_api_key(env: dict[str, str]) -> dict[str, str]:
    """``env`` for files other than engine.env (mode 0600), which alone may hold the key."""
    return {name: value for name, value in env.items() if name != API_KEY_VARIABLE}


def container_env(profile: Profile, host, spec=None) -> dict[str, str]:
    """The whole environment for ``host``, sorted by name, every value checked for the env file."""
    env = {**host_env(host), **engine_env(profile, host, spec), **profile.env}
    for name, value in env.items():
        if _UNSAFE_VALUE.search(value):
            source = f"env.{name}" if name in profile.env else name
            raise ConfigError(
                f"value {value!r} contains whitespace, quotes, '$', '#', '\\' or control characters, which "
                "docker --env-file and compose env_file read differently",
                field=source,
            )
    return dict(sorted(env.items()))


def env_file_lines(env: dict[str, str]) -> list[str]:
    return [f"{name}={value}" for name, value in sorted(env.items())]
