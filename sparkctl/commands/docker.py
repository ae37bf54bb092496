"""The engine container of one host, as data (``ContainerSpec``) and as a ``docker run`` argv.

One spec feeds both the ``docker run`` argv and the compose file (templates/compose.yaml.j2), so
the two cannot drift apart. The environment reaches the container through ``--env-file`` (one
file per host, the same file compose's ``env_file`` reads) rather than ``-e`` pairs: the argv
stays short and readable, and values never appear in ``ps`` output.

Where things live on a host (``/var/lib/sparkctl/<profile>/``) is decided here too: a render's
``<out>/<host>/`` directory is exactly that directory's content.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError

REMOTE_ROOT = "/var/lib/sparkctl"
ENV_FILE_NAME = "engine.env"
COMPOSE_FILE_NAME = "compose.yaml"
LAUNCH_FILE_NAME = "launch.sh"
HF_CACHE_MOUNT = "/root/.cache/huggingface"
# The RDMA verbs devices (uverbsN, rdma_cm): NCCL inside the container opens them for NCCL_IB_HCA.
# Without them it finds "No device found" and falls back to sockets. Passed as the folder, as
# sparkrun does, so every HCA's uverbs node is there whatever its number on this host.
RDMA_DEVICE_DIR = "/dev/infiniband"


def remote_profile_dir(profile_name: str, state_dir: str = REMOTE_ROOT) -> str:
    """The directory on every host that holds a profile's engine.env, compose.yaml and launch.sh
    (``state_dir`` is the inventory's ``paths.state_dir``)."""
    return f"{state_dir}/{profile_name}"


def remote_env_file(profile_name: str, state_dir: str = REMOTE_ROOT) -> str:
    return f"{remote_profile_dir(profile_name, state_dir)}/{ENV_FILE_NAME}"


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False

    @property
    def docker_value(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class UlimitSpec:
    name: str
    soft: int
    hard: int


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    network: str
    ipc: str
    gpus: str | None
    ulimits: tuple[UlimitSpec, ...]
    cap_add: tuple[str, ...]
    memory: str | None
    shm_size: str | None
    env_file: str  # path on the host
    mounts: tuple[Mount, ...]
    labels: tuple[tuple[str, str], ...]
    command: tuple[str, ...]
    devices: tuple[str, ...] = ()  # host paths passed with --device (compose: devices:)


def rdma_devices(host, env: dict[str, str] | None = None) -> tuple[str, ...]:
    """The devices NCCL's IB transport needs inside the container: when the inventory names HCAs
    (or says ``hcas: up``) or the environment sets NCCL_IB_HCA, unless NCCL_IB_DISABLE=1 asks for sockets."""
    env = env or {}
    if env.get("NCCL_IB_DISABLE") == "1":
        return ()
    wanted = host.hcas or getattr(host, "hcas_up", False) or env.get("NCCL_IB_HCA")
    return (RDMA_DEVICE_DIR,) if wanted else ()


def container_spec(profile: Profile, paths, rank: int, command: list[str], devices: tuple[str, ...] = ()) -> ContainerSpec:
    """The container for ``rank`` from the profile's ``container`` section and the inventory's ``paths``."""
    c = profile.container
    # None or "" both mean "no GPU request": a child profile cannot override an inherited value with
    # null (extends treats null as "drop the key", which brings the default "all" back).
    gpus = c.gpus or None
    gpu_request(gpus)  # refuse a value compose could not express before either file is written
    mounts = [Mount(paths.model_dir, c.model_mount, read_only=True)]
    if profile.engram.mode == "disk":
        mounts.append(Mount(paths.engram_dir, c.engram_mount))
    mounts.append(Mount(paths.hf_cache, HF_CACHE_MOUNT))
    return ContainerSpec(
        name=c.name,
        image=profile.image.tag,
        network=c.network,
        ipc=c.ipc,
        gpus=gpus,
        ulimits=tuple(UlimitSpec(name, limit.soft, limit.hard) for name, limit in c.ulimits.items()),
        cap_add=tuple(c.cap_add),
        memory=c.memory,
        shm_size=c.shm_size,
        env_file=remote_env_file(profile.name, paths.state_dir),
        mounts=tuple(mounts),
        labels=(("sparkctl.profile", profile.name), ("sparkctl.rank", str(rank))),
        command=tuple(command),
        devices=tuple(devices),
    )


# A rank that fails (exit != 0) is restarted; a rank stopped on purpose (sparkctl stop, docker stop or
# kill) is not. That suits a multi-rank job: a restarted worker retries the rendezvous until the head
# listens; a head that restarts waits for every rank, and the workers still in the old job exit non-zero
# when it goes (their communicator is broken), so they restart and join the new one. A job a peer
# left cleanly (exit 0) stays down. Docker backs off between restarts (up to a minute).
RESTART_POLICY = "on-failure"


def docker_run_argv(spec: ContainerSpec) -> list[str]:
    argv = ["docker", "run", "-d", "--restart", RESTART_POLICY, "--name", spec.name, "--network", spec.network,
            "--ipc", spec.ipc]
    if spec.gpus is not None:
        argv += ["--gpus", spec.gpus]
    for limit in spec.ulimits:
        argv += ["--ulimit", f"{limit.name}={limit.soft}:{limit.hard}"]
    for cap in spec.cap_add:
        argv += ["--cap-add", cap]
    for device in spec.devices:
        argv += ["--device", device]
    if spec.memory:
        argv += ["--memory", spec.memory]
    if spec.shm_size:
        argv += ["--shm-size", spec.shm_size]
    argv += ["--env-file", spec.env_file]
    for mount in spec.mounts:
        argv += ["-v", mount.docker_value]
    for key, value in spec.labels:
        argv += ["--label", f"{key}={value}"]
    return argv + [spec.image, *spec.command]


def bind_sources(docker_argv: list[str]) -> list[str]:
    """The host folders a ``docker run`` argv bind-mounts (each ``-v SOURCE:TARGET[:ro]``)."""
    return [value.split(":", 1)[0] for option, value in zip(docker_argv, docker_argv[1:]) if option == "-v"]


def make_bind_sources_argv(paths: list[str]) -> list[str]:
    """As the login user: every bind-mounted folder exists before ``docker run``. Docker would create a
    missing one as root, and the user (and ``setup``'s next look) could no longer write it."""
    return ["mkdir", "-p", "--", *paths]


_DEVICE_IDS = re.compile(r"^\"?device=([A-Za-z0-9-]+(,[A-Za-z0-9-]+)*)\"?\Z")


def gpu_request(gpus: str | None) -> dict | None:
    """``--gpus`` as compose's ``deploy.resources.reservations.devices[0]`` (None: no GPU request)."""
    if gpus is None:
        return None
    if gpus == "all":
        return {"count": "all"}
    if gpus.isdigit():
        return {"count": int(gpus)}
    match = _DEVICE_IDS.match(gpus)
    if match:
        return {"device_ids": match.group(1).split(",")}
    raise ConfigError(
        f"{gpus!r}: use 'all', a GPU count, or 'device=ID[,ID...]' (the forms both docker run and compose accept)",
        field="container.gpus",
    )


def tag_argv(image: str, ref: str) -> list[str]:
    """Give ``image`` (an ID or another tag) the name ``ref`` on the host."""
    return ["docker", "tag", image, ref]


# ---------------------------------------------------------------- images: what a host has, load, save

IMAGE_STORE_FORMAT = '{"id":{{json .Id}},"tags":{{json .RepoTags}},"digests":{{json .RepoDigests}},"layers":{{json .RootFS.Layers}}}'
IMAGES_MARK = "@@sparkctl-images@@"
FREE_MARK = "@@sparkctl-free-kib@@"
# One docker info answers whether the engine is there, where it keeps its layers and everything else
# it says (docker 20.10 exits 0 with its daemon down, the reason in ServerErrors; 25+ exits 1 with it
# on stderr): "R <root dir>" then the info as JSON, or "E <the engine's errors>". The template never
# reads a field of an engine that did not answer (20.10 fails on those and hides the reason).
INFO_FORMAT = '{{if .ServerErrors}}E {{join .ServerErrors "; "}}{{else}}R {{.DockerRootDir}}{{println}}{{json .}}{{end}}'
# In a script: $info (JSON) and $root from `docker info --format INFO_FORMAT` (its output in $out),
# or the engine's errors on stderr and exit 3.
SPLIT_INFO = ('case $out in "R "*) ;; *) printf "%s\\n" "${out#E }" >&2; exit 3;; esac; '
              'nl="\n"; root=${out%%"$nl"*}; root=${root#R }; info=${out#*"$nl"}; ')
# One round trip: the engine's info, the free space where it keeps its layers (docker load writes
# there: a full disk must refuse the host before the stream, not after it), then every image's ID,
# tags, digests and layers (one JSON per line). A docker that fails fails the script (never "no images").
_IMAGE_STORE_SCRIPT = (
    'set -eu; out=$(docker info --format "$1") || exit 3; ' + SPLIT_INFO + 'printf "%s\\n" "$info"; '
    'free=$(df -Pk -- "$root" 2>/dev/null | awk "NR==2 {print \\$4}") || free=""; '
    'echo "' + FREE_MARK + ' ${free:-unknown}"; echo "' + IMAGES_MARK + '"; '
    'listed=$(docker image ls -aq --no-trunc); ids=$(printf "%s\\n" $listed | sort -u); '
    # an image removed between the listing and this inspect is not an error: it is simply not there
    'if [ -n "$ids" ]; then docker image inspect --format "$2" $ids 2>/dev/null || true; fi'
)


def image_store_argv() -> list[str]:
    """The Docker engine's info, its free space and every image (distribute's one question a host)."""
    return ["sh", "-c", _IMAGE_STORE_SCRIPT, "sh", INFO_FORMAT, IMAGE_STORE_FORMAT]


LOAD_ARGV = ["docker", "load"]  # an image stream on stdin


def save_argv(ref: str) -> list[str]:
    """``ref`` as an image stream on stdout."""
    return ["docker", "save", ref]


def upload_to_temp_argv() -> list[str]:
    """stdin into a new temporary file, its path on stdout (a build context, before the build streams back)."""
    return ["sh", "-c", 'f=$(mktemp /tmp/sparkctl-context.XXXXXX) && cat > "$f" && echo "$f"']


def from_file_then_remove_argv(path: str, argv: list[str]) -> list[str]:
    """``argv -`` with ``path`` on its stdin, the file removed after it whatever happened (its exit code kept)."""
    script = 'f=$1; shift; "$@" - < "$f" 2>&1; rc=$?; rm -f "$f"; exit $rc'
    return ["sh", "-c", script, "sh", path, *argv]
