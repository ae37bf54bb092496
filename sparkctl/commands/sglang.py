"""``python3 -m sglang.launch_server`` argv for one rank (SGLang's own multi-node rendezvous).

Every rank runs the same launcher with ``--nnodes``, ``--node-rank`` and ``--dist-init-addr
HEAD:PORT``. SGLang 0.5.23 spells tensor parallelism ``--tp-size`` (``--tp`` does not exist). The
profile's vLLM-named core fields map onto SGLang's options (CORE_FLAGS).
"""

from __future__ import annotations

from sparkctl.commands.engine_flags import EngineFlags, check_argv, engine_arg_tokens, format_value
from sparkctl.commands.ranks import RankInfo, core_flag_owners, host_port
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError

# Profile field -> launch_server option.
CORE_FLAGS = {
    "gpu_memory_utilization": "--mem-fraction-static",
    "max_model_len": "--context-length",
    "max_num_seqs": "--max-running-requests",
    "max_num_batched_tokens": "--chunked-prefill-size",
    "block_size": "--page-size",
}

OWNED_FLAGS = {
    "--model-path": "the checkpoint is mounted at container.model_mount",
    "--model": "the checkpoint is mounted at container.model_mount",
    "--served-model-name": "from serving.served_model_name",
    "--api-key": "from serving.api_key_env or api_key_file, through engine.env: a key in argv shows in `ps`",
    "--host": "from serving.host",
    "--port": "from serving.port",
    "--tp-size": "from tensor_parallel",
    "--tensor-parallel-size": "from tensor_parallel",
    "--nnodes": "one node per rank",
    "--node-rank": "from the host's rank",
    "--dist-init-addr": "the head's fabric address and distributed.master_port",
    **core_flag_owners(CORE_FLAGS),
}


# SGLang 0.5.23 keeps Engram tables in host memory with this switch; it has no disk mode of its own.
SGLANG_ENGRAM_HOST_TABLE = "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"

# The SGLang line's Engram-on-NVMe switches, as its source's launcher sets them on every rank
# (start.sh, .env.example): its overlay's row store reads each rank's packed shards
# (``engram-l{L}-r{RANK}of{TP}.bin``, ``sparkctl pack-engram``) from DSV41_PACKED_DIR, inside the
# container, where the engram dir is mounted; DSV41_SOURCE is the checkpoint it opens the tables
# of, and the stock host table stays off so the tables are never pinned in memory.
OFFLOAD_MODE, PACKED_DIR, ENGRAM_SOURCE = "OFFLOAD_MODE", "DSV41_PACKED_DIR", "DSV41_SOURCE"


def check_engram(profile: Profile, spec: EngineFlags) -> None:
    """Stock SGLang keeps Engram tables in host memory (its host table); Engram on NVMe is the
    SGLang line's overlay (its row store reading packed shards), switched by OFFLOAD_MODE and
    DSV41_PACKED_DIR. A profile saying ``disk`` on an image whose surface lacks those switches
    would get variables nothing reads and the tables would not be where the memory plan assumed."""
    if profile.engram.mode != "disk":
        return
    # the image's overlay switches (read from its adapters, or the chain's list) or its engine's own
    if {OFFLOAD_MODE, PACKED_DIR} <= spec.switches | (spec.envs or frozenset()):
        return
    raise ConfigError(
        f"{spec.label} has no Engram-on-NVMe mode: its surface lacks the overlay switches {OFFLOAD_MODE} and "
        f"{PACKED_DIR} (the sglang-dsv41 image's row store); stock SGLang keeps the tables in host memory (its host "
        "table, SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE): use an image of the sglang-dsv41 chain or set engram.mode: memory",
        field="engram.mode",
    )


def check_dspark_window(profile: Profile) -> None:
    """SGLang's DSpark: --speculative-dspark-block-size is gamma (tokens drafted), and
    --speculative-num-draft-tokens is the verify window, gamma + 1; SGLang refuses any other pair."""
    args = profile.engine_args
    gamma, window = args.get("speculative-dspark-block-size"), args.get("speculative-num-draft-tokens")
    if isinstance(gamma, int) and isinstance(window, int) and window != gamma + 1:
        raise ConfigError(
            f"SGLang's DSpark speculative_num_draft_tokens must equal gamma + 1 (= {gamma + 1} for gamma={gamma}), "
            f"got {window}: --speculative-num-draft-tokens is the verify window, not the tokens drafted",
            field="engine_args.speculative-num-draft-tokens",
        )


def check_allocator(profile: Profile) -> None:
    """PyTorch's expandable segments made every prefill of more than 64 query tokens return NaN
    logits on GB10 with this model (the SGLang line's source, .env.example): refuse it."""
    value = profile.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    options = {k.strip(): v.strip() for k, _, v in (part.partition(":") for part in value.split(","))}
    if options.get("expandable_segments", "").lower() == "true":
        raise ConfigError(
            "expandable_segments:True makes every SGLang prefill of more than 64 query tokens return NaN logits "
            "on GB10 (garbage text, then a scheduler crash; bisected by the SGLang line's source): use "
            "expandable_segments:False", field="env.PYTORCH_CUDA_ALLOC_CONF")


# The routed experts' intermediate width (2304) is split over TP / EP ranks; b12x_next (the tp4
# image's MoE, DSV41_MOE_B12X_NEXT=1) cannot run the 288-wide slice TP8 / EP1 gives (the SGLang
# line's source refuses that pair); EP2 gives 576, the shape it runs at TP4 / EP1.
EXPERT_WIDTH = 2304
B12X_NEXT_MIN_WIDTH = 576


def check_expert_slice(profile: Profile) -> None:
    if str(profile.env.get("DSV41_MOE_B12X_NEXT", "0")).strip().lower() in ("", "0", "off", "false"):
        return
    ep = profile.engine_args.get("ep-size") or profile.engine_args.get("expert-parallel-size") or 1
    width = EXPERT_WIDTH * int(ep) // profile.tensor_parallel
    if width < B12X_NEXT_MIN_WIDTH:
        raise ConfigError(f"DSV41_MOE_B12X_NEXT=1 at TP{profile.tensor_parallel} / EP{ep} gives every rank a "
                          f"{width}-wide expert slice, which b12x_next cannot run: use ep-size "
                          f"{profile.tensor_parallel * B12X_NEXT_MIN_WIDTH // EXPERT_WIDTH} or more",
                          field="engine_args.ep-size")


def engine_argv(profile: Profile, spec: EngineFlags, rank: RankInfo) -> list[str]:
    if profile.distributed.launcher != "native":
        raise ConfigError("SGLang has its own multi-node launcher; only 'native' is supported", field="distributed.launcher")
    check_engram(profile, spec)
    check_allocator(profile)
    check_expert_slice(profile)
    check_dspark_window(profile)
    serving = profile.serving
    options = [
        "--model-path", profile.container.model_mount,
        "--served-model-name", serving.served_model_name,
        "--host", serving.host,
        "--port", str(serving.port),
        "--tp-size", str(profile.tensor_parallel),
        "--nnodes", str(rank.nnodes),
        "--node-rank", str(rank.rank),
        "--dist-init-addr", host_port(rank.head_address, profile.distributed.master_port),
    ]
    for field_name, flag in CORE_FLAGS.items():
        options += [flag, format_value(getattr(profile, field_name))]
    options += engine_arg_tokens(profile.engine_args, spec, owned=OWNED_FLAGS)
    check_argv(spec, options)
    return ["python3", "-m", "sglang.launch_server", *options]
