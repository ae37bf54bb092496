"""The single-box engine's container path as data (pure): ``docker run`` argv, compose file, env.

The single-box engine's README ("Container — compose or run.sh"): the API is published on
127.0.0.1 only, the checkpoint is mounted at ``/models`` and ``./results`` at ``/app/results``, and
three flags are not optional: ``--gpus all``, ``--ipc=host``, ``--ulimit memlock=-1``. There is no
``--memory``: on unified memory it caps GPU allocations too and the arena auto-sizer quietly
shrinks to fit it. The image's own entrypoint starts the server; the settings are the same
``.env`` as the native path, with the paths and the listen address as the container sees them.
"""

from __future__ import annotations

import yaml

from sparkctl.commands.native import engine_env, engine_folders
from sparkctl.errors import ConfigError

RESULTS_MOUNT = "/app/results"


def container_env(profile) -> dict[str, str]:
    env = engine_env(profile)
    env["MODEL_DIR"] = profile.container.model_mount
    env["HOST"] = "0.0.0.0"  # inside the container; the published port is what stays on loopback
    return env


def _mounts(profile) -> list[str]:
    mounts = [f"{profile.single_box.model_dir}:{profile.container.model_mount}:ro"]
    if profile.native is not None:
        mounts += [f"{folder}:{RESULTS_MOUNT}" for folder in engine_folders(profile.native.workdir)]
    return mounts


def _publish(profile) -> str:
    serving = profile.serving
    host = f"[{serving.host}]" if ":" in serving.host else serving.host
    return f"{host}:{serving.port}:{serving.port}"


def container_argv(profile, env_file: str) -> list[str]:
    c = profile.container
    if c.memory:
        raise ConfigError("the single-box engine runs without --memory: on unified memory it caps GPU allocations "
                          "and the arena shrinks to fit (remove it with --set container.memory=null)",
                          field="container.memory")
    argv = ["docker", "run", "-d", "--name", c.name, "--gpus", c.gpus or "all", "--ipc", c.ipc]
    for name, limit in c.ulimits.items():
        argv += ["--ulimit", f"{name}={limit.soft}:{limit.hard}"]
    argv += ["-p", _publish(profile), "--env-file", env_file]
    for mount in _mounts(profile):
        argv += ["-v", mount]
    argv += ["--label", f"sparkctl.profile={profile.name}", "--label", "sparkctl.rank=0"]
    return argv + [profile.image.tag]


def compose_text(profile, env_file_name: str) -> str:
    c = profile.container
    service = {
        "image": profile.image.tag,
        "container_name": c.name,
        "ipc": c.ipc,
        "ulimits": {name: {"soft": limit.soft, "hard": limit.hard} for name, limit in c.ulimits.items()},
        "ports": [_publish(profile)],
        "env_file": [env_file_name],
        "volumes": _mounts(profile),
        "labels": {"sparkctl.profile": profile.name, "sparkctl.rank": "0"},
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}},
    }
    header = (f"# The single-box engine of profile {profile.name} in a container (sparkctl render).\n"
              "# Loopback-only port, no memory limit (unified memory). Start it here: docker compose up -d\n")
    return header + yaml.safe_dump({"name": f"sparkctl-{profile.name}", "services": {"engine": service}},
                                   sort_keys=False, default_flow_style=False)
