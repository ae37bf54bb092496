"""The engine container's environment for one host: derived values, then the profile's ``env`` on top.

Derived values come from the inventory (the host's fabric interfaces, RDMA devices and fabric
address) and from the engine settings (Engram-on-disk switches, FlashInfer autotune). A profile
``env`` entry, or ``--env`` which lands in it, always wins over a derived value: the user may know
better than the inventory (e.g. ``NCCL_IB_HCA=^mlx5_1``).
"""

from __future__ import annotations

import re

from sparkctl.config.apikey import api_key_for
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError

# Characters that docker's --env-file and compose's env_file would read differently (quotes,
# interpolation, inline comments, escapes) or that would break the one-variable-per-line format.
API_KEY_VARIABLE = "VLLM_API_KEY"
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


# SGLang 0.5.23 keeps Engram tables in host memory with this switch; it has no disk mode of its own.
SGLANG_ENGRAM_HOST_TABLE = "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"


def engine_env(profile: Profile, host, spec=None) -> dict[str, str]:
    """Engine-specific derived values (``spec``: the engine's surface, which decides the autotune switch)."""
    env: dict[str, str] = {}
    if profile.engine == "vllm":
        from sparkctl.commands.vllm import autotune_off

        env["VLLM_HOST_IP"] = host.fabric_address  # the address vLLM advertises to the other ranks
        if profile.engram.mode == "disk":  # the TP4 vLLM report §5.3 (the patched image's Engram-on-disk)
            env["DSV41_ENGRAM_DISK"] = "1"
            env["DSV41_ENGRAM_DISK_THREADS"] = str(profile.engram.disk_threads)
            env["DSV41_ENGRAM_DISK_CHUNK"] = str(profile.engram.disk_chunk)
        if spec is not None:  # the TP8 vLLM report §5.1 / §10.5: avoids the autotune OOM spike
            env.update(autotune_off(profile, spec)[0])
    elif profile.engine == "sglang" and profile.engram.mode == "memory":
        env[SGLANG_ENGRAM_HOST_TABLE] = "1"
    elif profile.engine == "sglang":
        env.update(sglang_nvme_engram_env(profile))
    env.update(api_key_env(profile))
    return env


# The SGLang line's Engram-on-NVMe switches, as its source's launcher sets them on every rank
# (start.sh, .env.example): its overlay's row store reads each rank's packed shards
# (``engram-l{L}-r{RANK}of{TP}.bin``, ``sparkctl pack-engram``) from DSV41_PACKED_DIR, inside the
# container, where the engram dir is mounted; DSV41_SOURCE is the checkpoint it opens the tables
# of, and the stock host table stays off so the tables are never pinned in memory.
OFFLOAD_MODE, PACKED_DIR, ENGRAM_SOURCE = "OFFLOAD_MODE", "DSV41_PACKED_DIR", "DSV41_SOURCE"


def sglang_nvme_engram_env(profile: Profile) -> dict[str, str]:
    return {
        OFFLOAD_MODE: "nvme",  # the source's only mode on a Spark ("ram" pins ~189 GiB of tables)
        PACKED_DIR: profile.container.engram_mount,
        ENGRAM_SOURCE: profile.container.model_mount,
        SGLANG_ENGRAM_HOST_TABLE: "0",
        "DSV41_IO_THREADS": str(profile.engram.disk_threads),  # the source: a pool services the NVMe misses (96)
    }


def api_key_env(profile: Profile) -> dict[str, str]:
    """The API key for the engine, in the 0600 env file only (never argv, compose.yaml or launch.sh)."""
    key = api_key_for(profile)
    if key is None:
        return {}
    field = "serving.api_key_env" if profile.serving.api_key_env else "serving.api_key_file"
    if profile.engine == "sglang":
        # SGLang 0.5.23 reads no variable for it (its environ list has none): only --api-key, which
        # would put the key in the process list of the host and in the container's recorded command.
        raise ConfigError("SGLang takes its API key only as the --api-key option, which would show it in "
                          "`ps` and `docker inspect`; serve SGLang without a key behind an authenticating proxy",
                          field=field)
    if profile.engine != "vllm":
        raise ConfigError(f"sparkctl knows no API key setting of engine {profile.engine}", field=field)
    return {API_KEY_VARIABLE: key}  # vLLM's AuthenticationMiddleware guards /v1/* with it


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
