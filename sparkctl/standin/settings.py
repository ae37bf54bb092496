"""What one engine process was asked to be, read from its parsed argv and its environment.

Both engines' options end up in one ``EngineSettings``; the SPARKCTL_STANDIN_* environment sets
the simulated timing and the stand-in's own knobs (``Knobs``). Validation that the real engine
does after parsing (world size, ranks, rendezvous address) raises ``StartupError``: logged, exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, Mapping, Optional

from . import flags as F
from .simulate import Timing


class StartupError(Exception):
    """The engine cannot start with this configuration (the process exits 1 after logging it)."""


@dataclass
class Knobs:
    """The stand-in's own settings (SPARKCTL_STANDIN_*), beyond the timing."""

    load_s: float = 0.0  # simulated weight loading before the rendezvous
    rendezvous_timeout_s: float = 600.0  # how long the head waits for workers / workers for the head
    peer_timeout_s: float = 10.0  # a silent peer is a dead peer
    heartbeat_s: float = 1.0
    gpus_per_node: int = 1
    engram_dir: str = "/engram"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Knobs":
        knobs = cls()
        for name, kind in (("load_s", float), ("rendezvous_timeout_s", float), ("peer_timeout_s", float),
                           ("heartbeat_s", float), ("gpus_per_node", int), ("engram_dir", str)):
            key = "SPARKCTL_STANDIN_" + name.upper()
            if key in env and env[key] != "":
                try:
                    setattr(knobs, name, kind(env[key]))
                except ValueError:
                    raise StartupError(f"{key}={env[key]!r} is not a valid {kind.__name__}") from None
        return knobs


@dataclass
class EngineSettings:
    engine: str  # vllm | sglang
    engine_version: str
    model_path: str
    served_model_name: str
    host: str
    port: int
    tp: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    headless: bool
    max_model_len: Optional[int]  # None: from the model's config.json
    max_num_seqs: int
    reasoning_parser: Optional[str]
    tool_call_parser: Optional[str]
    default_chat_template_kwargs: Dict[str, object]
    engram_disk: bool
    ray: bool = False  # vLLM --distributed-executor-backend ray: the ranks come from a Ray cluster
    timing: Timing = field(default_factory=Timing)
    knobs: Knobs = field(default_factory=Knobs)

    @property
    def is_head(self) -> bool:
        return self.node_rank == 0

    @property
    def serves_http(self) -> bool:
        return self.is_head and not self.headless

    @property
    def rank_label(self) -> str:
        return f"rank {self.node_rank} of {self.nnodes}"

    def to_json(self) -> dict:
        data = asdict(self)
        return data


def _json_option(namespace, engine: str, flag: str) -> Dict[str, object]:
    raw = F.value(namespace, engine, flag)
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        namespace._parser.error(f"argument {flag}: invalid loads value: {raw!r}")
    if not isinstance(parsed, dict):
        namespace._parser.error(f"argument {flag}: expected a JSON object, got {raw!r}")
    return parsed


def settings_from_args(engine: str, version: str, namespace: argparse.Namespace,
                       env: Optional[Mapping[str, str]] = None) -> EngineSettings:
    """Turn a parsed argv (``flags.parse_engine_argv``) into settings; argv errors exit 2, the rest StartupError."""
    env = os.environ if env is None else env
    v = lambda flag, default=None: F.value(namespace, engine, flag, default)  # noqa: E731
    n = lambda flag, default: F.int_value(namespace, engine, flag, default)  # noqa: E731
    if engine == "vllm":
        model = namespace.model_tag
        if not model:
            raise StartupError("no model given: `vllm serve MODEL_DIR ...` (the stand-in has no default model)")
        tp = n("--tensor-parallel-size", 1)
        nnodes = n("--nnodes", 1)
        node_rank = n("--node-rank", 0)
        master_addr = v("--master-addr", "127.0.0.1")
        master_port = n("--master-port", 29501)
        headless = bool(v("--headless", False))
        host, port = v("--host") or "0.0.0.0", n("--port", 8000)
        max_model_len = n("--max-model-len", 0) or None
        max_num_seqs = n("--max-num-seqs", 256)
        kwargs_flag = "--default-chat-template-kwargs"
    else:
        model = v("--model-path")
        if not model:
            namespace._parser.error("the following arguments are required: --model-path")
        tp = n("--tp-size", 1)
        nnodes = n("--nnodes", 1)
        node_rank = n("--node-rank", 0)
        dist = v("--dist-init-addr")
        if nnodes > 1 and not dist:
            raise StartupError("--dist-init-addr is required when --nnodes > 1")
        master_addr, master_port = split_host_port(dist) if dist else ("127.0.0.1", 0)
        headless = node_rank > 0  # SGLang's non-zero ranks run schedulers only, no HTTP server
        host, port = v("--host") or "127.0.0.1", n("--port", 30000)
        max_model_len = n("--context-length", 0) or None
        max_num_seqs = n("--max-running-requests", 256)
        kwargs_flag = "--default-chat-template-kwargs" if F.dest_of("--default-chat-template-kwargs") in vars(namespace) else None
    if engine == "sglang":
        check_dspark_window(v("--speculative-dspark-block-size"), v("--speculative-num-draft-tokens"))
    served = v("--served-model-name") or model
    chat_kwargs = _json_option(namespace, engine, kwargs_flag) if kwargs_flag else {}
    settings = EngineSettings(
        engine=engine, engine_version=version, model_path=model, served_model_name=served,
        host=host, port=port, tp=tp, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
        master_port=master_port, headless=headless, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        reasoning_parser=v("--reasoning-parser"), tool_call_parser=v("--tool-call-parser"),
        default_chat_template_kwargs=chat_kwargs,
        engram_disk=env.get("DSV41_ENGRAM_DISK", "") == "1",
        ray=engine == "vllm" and v("--distributed-executor-backend") == "ray",
        timing=Timing.from_env(env), knobs=Knobs.from_env(env),
    )
    check_topology(settings)
    return settings


def split_host_port(text: str):
    """``HOST:PORT`` or ``[V6]:PORT``."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise StartupError(f"--dist-init-addr {text!r} is not HOST:PORT")
    return host, int(port)


def check_dspark_window(block_size, num_draft_tokens) -> None:
    """SGLang 0.5.23's DSpark rule (its speculative hook): the block size is gamma, the number of
    draft tokens the verify window gamma + 1; a pair that disagrees is refused at start."""
    if block_size is None or num_draft_tokens is None:
        return
    gamma = int(block_size)
    if int(num_draft_tokens) != gamma + 1:
        raise StartupError(f"DSpark speculative_num_draft_tokens must equal gamma + 1 (= {gamma + 1} for "
                           f"gamma={gamma}), but got speculative_num_draft_tokens={int(num_draft_tokens)}.")


def check_topology(s: EngineSettings) -> None:
    """What the real engines refuse after parsing: a world that does not add up."""
    if s.nnodes < 1:
        raise StartupError(f"--nnodes must be >= 1, got {s.nnodes}")
    if not 0 <= s.node_rank < s.nnodes:
        raise StartupError(f"--node-rank {s.node_rank} is outside 0..{s.nnodes - 1} (--nnodes {s.nnodes})")
    if s.ray:
        if s.nnodes != 1:
            raise StartupError("--nnodes is not used with --distributed-executor-backend ray (the Ray cluster has the nodes)")
        return  # the cluster's GPUs are counted when the engine starts (ray.Driver)
    world = s.nnodes * s.knobs.gpus_per_node
    if s.tp != world:
        raise StartupError(
            f"tensor parallel size {s.tp} does not match the world size: {s.nnodes} node(s) x "
            f"{s.knobs.gpus_per_node} GPU(s) per node = {world} rank(s)"
        )
    if s.engine == "vllm" and s.node_rank > 0 and not s.headless:
        raise StartupError(f"--node-rank {s.node_rank}: ranks above 0 run with --headless (only rank 0 serves the API)")
    if s.nnodes > 1 and not 1 <= s.master_port <= 65535:
        raise StartupError(f"rendezvous port {s.master_port} is not a TCP port")
    if not 1 <= s.port <= 65535:
        raise StartupError(f"--port {s.port} is not a TCP port")
