"""``vllm serve`` argv for one rank (vLLM's native multi-node launcher, or Ray).

Native (``distributed.launcher: native``): every rank runs ``vllm serve`` with ``--nnodes``,
``--node-rank`` and the head's ``--master-addr``/``--master-port``; ranks above 0 add
``--headless`` (they compute but serve no HTTP).

Ray: workers join the head's Ray cluster (``ray start --address=HEAD:PORT --block``); the head
starts Ray and then ``vllm serve --distributed-executor-backend ray``, as one ``bash -c`` line
built with shlex (``ray_head_line``: stoppable by SIGTERM while ``ray start`` runs).
"""

from __future__ import annotations

import shlex

from sparkctl.commands.engine_flags import EngineFlags, check_argv, engine_arg_tokens, format_value
from sparkctl.commands.ranks import RankInfo, core_flag_owners, host_port
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError

# Profile field -> vllm serve option.
CORE_FLAGS = {
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "block_size": "--block-size",
}

# Options sparkctl renders from the profile and the inventory; engine_args may not set them.
OWNED_FLAGS = {
    "--model": "the checkpoint is mounted at container.model_mount and passed as the positional model",
    "--served-model-name": "from serving.served_model_name",
    "--api-key": "from serving.api_key_env or api_key_file, through engine.env: a key in argv shows in `ps`",
    "--host": "from serving.host",
    "--port": "from serving.port",
    "--tensor-parallel-size": "from tensor_parallel",
    "--nnodes": "one node per rank",
    "--node-rank": "from the host's rank",
    "--master-addr": "the head's fabric address",
    "--master-port": "from distributed.master_port",
    "--headless": "added on worker ranks",
    **core_flag_owners(CORE_FLAGS),
}

BACKEND = "distributed-executor-backend"

# Turning FlashInfer autotune off (profile ``autotune: false``; the TP8 vLLM report §10.5's guard
# against the profiling OOM spike). The TP4 vLLM report's image reads a variable through its own vLLM branch;
# released vLLM does not read it (it warns "Unknown vLLM environment variable") and has a switch
# instead. What is rendered is whichever of these the engine in the image honours, in this order:
# vLLM 0.33.0 pairs --enable-x with --disable-x (its EnableDisableAction; --no-enable-x is still
# parsed but hidden), a plain BooleanOptionalAction parser has only --no-enable-x.
AUTOTUNE_ENV = "VLLM_FLASHINFER_AUTOTUNE"
AUTOTUNE_OFF_FLAGS = ("--disable-flashinfer-autotune", "--no-enable-flashinfer-autotune")


def autotune_off(profile: Profile, spec: EngineFlags) -> tuple[dict[str, str], list[str]]:
    """(env, options) that turn FlashInfer autotune off, or nothing when the profile keeps it on."""
    if profile.autotune:
        return {}, []
    if spec.envs is not None and AUTOTUNE_ENV in spec.envs:
        return {AUTOTUNE_ENV: "0"}, []
    for flag in AUTOTUNE_OFF_FLAGS:
        if flag in spec.flags:
            return {}, [flag]
    raise ConfigError(
        f"{spec.label} has no way to turn FlashInfer autotune off (no {AUTOTUNE_ENV} variable, no "
        f"{' or '.join(AUTOTUNE_OFF_FLAGS)}); set autotune: true or use an image that has one",
        field="autotune",
    )


def _backend_arg(profile: Profile) -> list[str]:
    """Which engine_args keys the launcher accounts for itself (and refuse the contradictory ones)."""
    value = profile.engine_args.get(BACKEND)
    if profile.distributed.launcher == "ray":
        if value not in (None, False, "ray"):
            raise ConfigError(
                f"distributed.launcher is ray, so sparkctl renders --{BACKEND} ray; this profile says {value!r}. "
                f"Remove it (e.g. --set engine_args.{BACKEND}=null)",
                field=f"engine_args.{BACKEND}",
            )
        return [BACKEND]
    if value == "ray":
        raise ConfigError(
            f"--{BACKEND} ray needs the Ray launcher: set distributed.launcher: ray (the native launcher uses mp)",
            field=f"engine_args.{BACKEND}",
        )
    return []


def serve_argv(profile: Profile, spec: EngineFlags, rank: RankInfo) -> list[str]:
    """``vllm serve`` for this rank, every option checked against ``spec``."""
    serving = profile.serving
    options = ["--served-model-name", serving.served_model_name, "--host", serving.host, "--port", str(serving.port)]
    owned = dict(OWNED_FLAGS)
    if profile.distributed.launcher == "ray":
        options += [f"--{BACKEND}", "ray", "--tensor-parallel-size", str(profile.tensor_parallel)]
        owned[f"--{BACKEND}"] = "distributed.launcher is ray"
    else:
        options += [
            "--tensor-parallel-size", str(profile.tensor_parallel),
            "--nnodes", str(rank.nnodes),
            "--node-rank", str(rank.rank),
            "--master-addr", rank.head_address,
            "--master-port", str(profile.distributed.master_port),
        ]
        if not rank.is_head:
            options.append("--headless")
    for field_name, flag in CORE_FLAGS.items():
        options += [flag, format_value(getattr(profile, field_name))]
    options += autotune_off(profile, spec)[1]
    skip = _backend_arg(profile)
    options += engine_arg_tokens(profile.engine_args, spec, owned=owned, skip=skip)
    check_argv(spec, options)
    return ["vllm", "serve", profile.container.model_mount, *options]


def engine_argv(profile: Profile, spec: EngineFlags, rank: RankInfo) -> list[str]:
    """What the container runs on this rank."""
    if profile.distributed.launcher != "ray":
        return serve_argv(profile, spec, rank)
    ray_port = profile.distributed.ray_port
    if not rank.is_head:
        serve_argv(profile, spec, rank)  # the same profile checks on every rank, even if workers only run Ray
        return ["ray", "start", f"--address={host_port(rank.head_address, ray_port)}", "--block"]
    start = ["ray", "start", "--head", f"--port={ray_port}"]
    return ["bash", "-c", ray_head_line(start, serve_argv(profile, spec, rank))]


# The head's shell is the container's PID 1, and PID 1 of a PID namespace never gets a signal it has
# no handler for: without a trap, `docker stop`'s SIGTERM during `ray start` is dropped and the stop
# waits out its grace period (then SIGKILL). A trapped signal stops the shell at once only while it
# is in `wait` (a foreground command would hold the trap until it ended), so `ray start` runs in the
# background and is waited for. The trap ends ray start and the shell with 143 (128 + SIGTERM): the
# container ends, and with it what ray start had begun. Then `exec`: vLLM is PID 1 with the same
# argv as before, and handles SIGTERM itself. POSIX sh (busybox in the stand-in image, bash on real ones).
RAY_HEAD_TRAP = "trap 'kill -TERM \"$ray\" 2>/dev/null; exit 143' TERM INT"


def ray_head_line(start: list[str], serve: list[str]) -> str:
    """The Ray head's shell line: ``ray start`` stoppable by SIGTERM, then ``exec vllm serve``
    (split on `` && exec `` by whoever wants the serve part)."""
    return (f"{RAY_HEAD_TRAP}; {shlex.join(start)} & ray=$!; wait \"$ray\" && trap - TERM INT"
            f" && exec {shlex.join(serve)}")
