"""Entry points: ``vllm serve ...`` and ``python3 -m sglang.launch_server ...``, and one engine's lifetime.

Exit codes as the real processes: 2 for an argv the parser refuses, 1 for a start-up failure
(no checkpoint, missing Engram shards, a port taken, a rendezvous that never completes) and for a
job that breaks (a rank left), 0 after SIGTERM/SIGINT (``docker stop``). Log lines go to stdout
in the engines' ``LEVEL MM-DD HH:MM:SS [where] message`` shape, so ``docker logs`` reads like theirs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import List, Mapping, Optional

from . import __version__
from . import flags as F
from .model import DEFAULT_MAX_MODEL_LEN, ModelError, load_model, missing_engram_shards
from .rendezvous import Head, RendezvousError, Worker, nccl_net_ib
from .settings import EngineSettings, StartupError, settings_from_args
from .stopsignal import exit_on_stop

_print_lock = threading.Lock()


def log(level: str, message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    with _print_lock:
        sys.stdout.write(f"{level} {stamp} [standin] {message}\n")
        sys.stdout.flush()


def _exit_now(code: int) -> None:
    """End the process at once, whatever threads are doing (what a crashing engine does)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


class ApiOptions:
    """What the HTTP API needs from argv beyond ``EngineSettings``: API keys, auto tool choice, spec decode."""

    def __init__(self, api_keys=(), auto_tool_choice: bool = False, spec_tokens: int = 0):
        self.api_keys, self.auto_tool_choice, self.spec_tokens = list(api_keys), auto_tool_choice, spec_tokens

    @classmethod
    def from_args(cls, engine: str, namespace, env: Mapping[str, str]) -> "ApiOptions":
        from .auth import server_keys

        keys = server_keys(engine, F.value(namespace, engine, "--api-key"), env)
        auto = bool(F.value(namespace, engine, "--enable-auto-tool-choice", False))
        spec = 0
        if engine == "vllm":
            raw = F.value(namespace, engine, "--speculative-config")
            try:
                config = json.loads(raw) if raw else {}
            except ValueError:
                config = {}
            if isinstance(config, dict):
                spec = int(config.get("num_speculative_tokens") or 0)
        elif F.value(namespace, engine, "--speculative-algorithm"):
            block = F.int_value(namespace, engine, "--speculative-dspark-block-size", 0)
            window = F.int_value(namespace, engine, "--speculative-num-draft-tokens", 0)
            spec = block or max(0, window - 1) or 3  # the verify window is gamma + 1
        return cls(keys, auto, max(0, spec))


class Engine:
    def __init__(self, settings: EngineSettings, env: Optional[Mapping[str, str]] = None,
                 api: Optional[ApiOptions] = None):
        self.settings = settings
        self.env = os.environ if env is None else env
        self.api = api or ApiOptions()
        self.head: Optional[Head] = None
        self.worker: Optional[Worker] = None
        self.ray = None  # ray.Driver with --distributed-executor-backend ray
        self.row_store = None  # the SGLang line's Engram rows on NVMe (overlay.start_engram)
        self._stopped = threading.Event()

    def _on_signal(self, signum, _frame) -> None:
        log("INFO", f"received {signal.Signals(signum).name}; shutting down")
        if self.head is not None:
            self.head.shutdown(orderly=True)
        if self.worker is not None:
            self.worker.leave()
        _exit_now(0)

    def _on_rank_lost(self, rank: int, why: str) -> None:
        log("ERROR", f"rank {rank} left the job ({why}); the NCCL communicator is broken, the engine exits")
        if self.head is not None:
            self.head.shutdown(orderly=False)
        _exit_now(1)

    def run(self) -> int:
        s = self.settings
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        log("INFO", f"stand-in {s.engine} {s.engine_version} (sparkctl stand-in {__version__}): {s.rank_label}, "
                    f"tp={s.tp}, model {s.model_path} served as {s.served_model_name!r}")
        try:
            model = load_model(s.model_path)
        except ModelError as err:
            log("ERROR", str(err))
            return 1
        max_model_len = s.max_model_len or model.max_position_embeddings or DEFAULT_MAX_MODEL_LEN
        if s.max_model_len and model.max_position_embeddings and s.max_model_len > model.max_position_embeddings:
            log("ERROR", f"User-specified max_model_len ({s.max_model_len}) is greater than the derived max_model_len "
                         f"(max_position_embeddings={model.max_position_embeddings} in the model's config.json)")
            return 1
        if s.engram_disk and not self._engram_shards_present(model):
            return 1
        if s.engine == "sglang":
            from .overlay import start_engram

            try:
                self.row_store = start_engram(self.env, s.model_path, s.node_rank, s.tp, log)
            except StartupError as err:
                log("ERROR", str(err))
                return 1
        if s.knobs.load_s > 0:
            log("INFO", f"loading weights ({s.knobs.load_s:g}s, simulated)")
            time.sleep(s.knobs.load_s)
        if s.nnodes > 1 or s.ray:
            refused = nccl_net_ib(self.env)
            if refused:
                log("INFO", refused)
                log("ERROR", "NCCL found no RDMA device for NCCL_IB_HCA; the engine does not start")
                return 1
        if s.nnodes > 1:
            code = self._rendezvous()
            if code is not None:
                return code
        if s.ray and s.tp > s.knobs.gpus_per_node:
            code = self._ray_cluster()
            if code is not None:
                return code
        if not s.serves_http:
            if self.worker is not None:
                code = self.worker.run()
                _exit_now(code)
            log("INFO", "headless: serving no API")
            self._stopped.wait()
            return 0
        return self._serve_http(max_model_len, model)

    def _engram_shards_present(self, model) -> bool:
        """Engram-on-disk (DSV41_ENGRAM_DISK=1): this rank's shards are in the engram dir (logged either way)."""
        s = self.settings
        if not model.engram_layers:
            log("WARNING", "DSV41_ENGRAM_DISK=1 but the model's config.json has no engram_layer_ids; nothing to read")
            return True
        missing = missing_engram_shards(s.knobs.engram_dir, model.engram_layers, s.node_rank, s.tp)
        if missing:
            log("ERROR", f"Engram-on-disk (DSV41_ENGRAM_DISK=1): rank {s.node_rank} of {s.tp} is missing "
                         f"{len(missing)} of {len(model.engram_layers)} shard(s) in {s.knobs.engram_dir}: "
                         + ", ".join(missing) + " (write them with `sparkctl pack-engram`)")
            return False
        log("INFO", f"Engram-on-disk: rank {s.node_rank} found its {len(model.engram_layers)} shard(s) "
                    f"in {s.knobs.engram_dir}")
        return True

    def _rendezvous(self) -> Optional[int]:
        s, k = self.settings, self.settings.knobs
        common = dict(nnodes=s.nnodes, tp=s.tp, model=s.served_model_name, log=log, timeout_s=k.rendezvous_timeout_s,
                      heartbeat_s=k.heartbeat_s, peer_timeout_s=k.peer_timeout_s)
        try:
            if s.is_head:
                self.head = Head(port=s.master_port, on_lost=self._on_rank_lost, **common)
                self.head.listen()
                log("INFO", f"rendezvous open on port {s.master_port}: waiting for {s.nnodes - 1} worker rank(s)")
                while True:
                    self.head.wait_for_workers()
                    if self.head.start():
                        break
                log("INFO", f"all {s.nnodes} ranks connected; the job starts")
            else:
                self.worker = Worker(head=s.master_addr, port=s.master_port, rank=s.node_rank, **common)
                self.worker.join()
                log("INFO", f"rank {s.node_rank}: the job started")
        except RendezvousError as err:
            log("ERROR", str(err))
            if self.head is not None:
                self.head.shutdown(orderly=False)
            return 1
        return None

    def _ranks_connected(self) -> int:
        if self.head is not None:
            return self.head.ranks_connected
        if self.ray is not None:
            return self.ray.nodes_connected
        return 1

    def _ray_cluster(self) -> Optional[int]:
        from .ray import Driver

        s = self.settings

        def lost(node: str) -> None:
            log("ERROR", f"Ray node {node} left the cluster; a tensor parallel worker is gone, the engine exits")
            _exit_now(1)

        self.ray = Driver(gpus=s.tp, on_lost=lost, timeout_s=s.knobs.rendezvous_timeout_s)
        log("INFO", f"connecting to the Ray cluster at {self.ray.address}: waiting for {s.tp} GPU(s)")
        try:
            nodes = self.ray.wait_ready()
        except (ConnectionError, TimeoutError) as err:
            log("ERROR", str(err))
            return 1
        log("INFO", f"Ray cluster ready: {len(nodes)} node(s) ({', '.join(nodes)}); the job starts")
        return None

    def _serve_http(self, max_model_len: int, model) -> int:
        from .server import EngineState, make_server

        s = self.settings
        state = EngineState(s, model, max_model_len, ranks_connected=self._ranks_connected, log=log,
                            api_keys=self.api.api_keys, auto_tool_choice=self.api.auto_tool_choice,
                            spec_tokens=self.api.spec_tokens)
        state.row_store = self.row_store
        try:
            server = make_server(state, s.host, s.port)
        except OSError as err:
            log("ERROR", f"[Errno {err.errno}] error while attempting to bind on address ({s.host!r}, {s.port}): "
                         f"{(err.strerror or str(err)).lower()}")
            if self.head is not None:
                self.head.shutdown(orderly=False)
            return 1
        name = "vLLM API server" if s.engine == "vllm" else "SGLang HTTP server"
        log("INFO", f"Starting {name} on http://{s.host}:{s.port} (max_model_len={max_model_len})")
        log("INFO", "Application startup complete.")
        server.serve_forever(poll_interval=0.2)
        return 0


def run_engine(engine: str, argv: List[str], env: Optional[Mapping[str, str]] = None) -> int:
    exit_on_stop()  # until Engine.run installs its orderly shutdown (flags and settings take a while under load)
    env = os.environ if env is None else env
    try:
        path = F.find_flags_file(engine)
        flags = F.load_flags(path)
    except F.FlagsError as err:
        log("ERROR", f"stand-in {engine}: {err}")
        return 1
    namespace = F.parse_engine_argv(engine, argv, flags)  # argparse: exit 2 on a refused argv
    try:
        settings = settings_from_args(engine, F.version_of(path, engine), namespace, env)
    except StartupError as err:
        log("ERROR", str(err))
        return 1
    return Engine(settings, env, ApiOptions.from_args(engine, namespace, env)).run()


def vllm_main(argv: Optional[List[str]] = None) -> int:
    """``vllm`` with its one sub-command the stand-in has: ``serve``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["--version"], ["-v"]):
        try:
            print(F.version_of(F.find_flags_file("vllm"), "vllm"))
        except F.FlagsError as err:
            log("ERROR", str(err))
            return 1
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: vllm [-h] [-v] {serve} ...")
        return 0 if argv else 2
    if argv[0] != "serve":
        sys.stderr.write("usage: vllm [-h] [-v] {serve} ...\n"
                         f"vllm: error: argument subparser: invalid choice: {argv[0]!r} (choose from 'serve')\n")
        return 2
    return run_engine("vllm", argv[1:])


def sglang_main(argv: Optional[List[str]] = None) -> int:
    """``python3 -m sglang.launch_server ...``."""
    return run_engine("sglang", sys.argv[1:] if argv is None else list(argv))
