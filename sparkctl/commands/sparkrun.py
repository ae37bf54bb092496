"""A sparkrun recipe equivalent to a render (the shape of the TP4 vLLM report §5.1's deepseek-v41-flash-tp4.yaml).

The recipe's ``command`` is derived from the head's rendered engine argv, not rebuilt from the
profile, so it cannot disagree with what sparkctl itself would run: the per-rank options (which
sparkrun supplies) are dropped and every value the profile sets becomes a ``{placeholder}`` backed
by ``defaults``, so ``sparkrun run ... -o max_model_len=N`` works as users expect.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from sparkctl import engines
from sparkctl.commands.docker import HF_CACHE_MOUNT, RESTART_POLICY, ContainerSpec
from sparkctl.commands.engine_flags import format_value
from sparkctl.commands.shell import option_groups
from sparkctl.config.profile import Profile


@dataclass(frozen=True)
class RecipeHost:
    name: str
    address: str  # the management address: what sparkrun's --hosts takes (the TP4 vLLM report §5.4)
    rank: int


def _defaults(profile: Profile) -> tuple[dict[str, Any], dict[str, str]]:
    """(sparkrun defaults, option -> defaults key) for every value the profile decides."""
    engine = engines.get(profile.engine)
    defaults: dict[str, Any] = {
        "host": profile.serving.host,
        "port": profile.serving.port,
        "served_model_name": profile.serving.served_model_name,
        "tensor_parallel": profile.tensor_parallel,
    }
    keys = {"--host": "host", "--port": "port", "--served-model-name": "served_model_name",
            engine.tp_flag: "tensor_parallel"}
    for field_name, flag in engine.core_flags.items():
        defaults[field_name] = getattr(profile, field_name)
        keys[flag] = field_name
    for flag, (name, value) in engine.recipe_defaults(profile).items():
        defaults[name] = value
        keys[flag] = name
    for key, value in profile.engine_args.items():
        if isinstance(value, bool) or value is None:
            continue  # switches stay literal in the command
        name = key.replace("-", "_")
        if name in defaults:
            continue
        defaults[name] = format_value(value) if isinstance(value, (dict, list)) else value
        keys[f"--{key}"] = name
    return defaults, keys


def _placeholder(key: str, actual: str) -> str:
    """``{key}``, single-quoted when the value it stands for needs shell quoting."""
    if shlex.quote(actual) == actual:
        return "{" + key + "}"
    return "'{" + key + "}'"


def command_lines(profile: Profile, head_serve_argv: list[str], keys: dict[str, str]) -> list[str]:
    """The recipe's ``command:`` block, one option per line, from the head's engine argv."""
    skip = engines.get(profile.engine).rank_options  # options that differ per rank: sparkrun adds them
    groups = option_groups(head_serve_argv)
    # The checkpoint stays at sparkctl's in-container path: the recipe mounts it there read-only
    # (executor_config.volumes), which sparkrun's own identity mount of `model:` is not.
    lines = [shlex.join(groups[0])]
    for group in groups[1:]:
        flag, values = group[0], group[1:]
        if flag in skip:
            continue
        if values and flag in keys and "'" not in values[0]:
            lines.append(f"{flag} {_placeholder(keys[flag], values[0])}")
        else:
            lines.append(shlex.join(group))
    continued = [lines[0]] + ["    " + line for line in lines[1:]]
    return [line + " \\" for line in continued[:-1]] + continued[-1:]


def shared_env(envs: list[dict[str, str]]) -> tuple[dict[str, str], list[str]]:
    """Variables every host has with the same value, and the names that differ (left to sparkrun)."""
    names = sorted(set().union(*envs)) if envs else []
    same = {n: envs[0][n] for n in names if all(n in e and e[n] == envs[0][n] for e in envs)}
    return same, [n for n in names if n not in same]


def recipe_context(
    profile: Profile,
    *,
    profile_file: str,
    model_dir: str,
    hosts: list[RecipeHost],
    head_serve_argv: list[str],
    envs: list[dict[str, str]],
    container: ContainerSpec,
) -> dict[str, Any]:
    engine = engines.get(profile.engine)
    defaults, keys = _defaults(profile)
    env, per_host = shared_env(envs)
    model_mounts = [m for m in container.mounts if m.target == profile.container.model_mount]
    return {
        "master_port": profile.distributed.master_port,
        "rank_port_option": engine.rank_port_option,
        "model_mount": profile.container.model_mount,
        # sparkrun mounts its own Hugging Face cache; every other mount (the checkpoint included,
        # read-only at sparkctl's path) goes to executor_config.volumes as sparkctl's -v value
        "sparkrun_mounts": [m for m in container.mounts if m.target != HF_CACHE_MOUNT],
        "profile": profile.name,
        "profile_file": profile_file,
        "description": profile.description or profile.name,
        "model": model_dir,
        "runtime": engine.name,
        "runtime_version": profile.engine_version,
        "image": profile.image.tag,
        "nodes": profile.tensor_parallel,
        "defaults": list(defaults.items()),
        "env": env,
        "env_per_host": per_host,
        "command_lines": command_lines(profile, head_serve_argv, keys),
        "hosts": hosts,
        "container": container,
        "rank_args": engine.rank_args(profile),
        "restart_policy": RESTART_POLICY,
        "model_read_only": any(m.read_only for m in model_mounts),
    }
