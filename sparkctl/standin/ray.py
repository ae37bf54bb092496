"""A stand-in for the parts of Ray a vLLM multi-node deployment touches (sandbox image only).

* ``ray start --head --port=P`` starts the cluster's control process (the "GCS") in the background
  on port P, records ``127.0.0.1:P`` in ``/tmp/ray/ray_current_cluster`` as Ray does, and returns
  (``--node-name`` names a node, as in Ray; the host name otherwise).
* ``ray start --address=HEAD:P --block`` joins a worker node (one GPU, as a GB10) and stays in the
  cluster while its connection lives; it exits 1 when the head goes away, 0 on SIGTERM.
* ``ray status`` prints the nodes.
* ``Driver`` is the engine's side (``vllm serve --distributed-executor-backend ray``): it waits
  until the cluster has the GPUs its tensor parallel size needs, then learns when a node leaves
  (the engine then exits, as vLLM does when a Ray worker dies).

Protocol: JSON lines over TCP. A node sends ``{"node": NAME, "gpus": 1}`` and gets ``{"ok": true}``;
EOF on its connection means it left. A driver sends ``{"driver": true, "gpus": N}`` and gets
``{"event": "ready", "nodes": [...]}`` once the cluster (the head counts as a node with its own
GPU) has N GPUs, then ``{"event": "node_left", "node": NAME}``. ``{"status": true}`` gets
``{"nodes": [...]}``. Standard library only, like the rest of the stand-in.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from .stopsignal import exit_on_stop

DEFAULT_PORT = 6379


def cluster_file() -> str:
    """Where ``ray start --head`` records the cluster's address (Ray's temp dir, $RAY_TMPDIR)."""
    return os.path.join(os.environ.get("RAY_TMPDIR") or "/tmp/ray", "ray_current_cluster")


def _log(message: str) -> None:
    sys.stderr.write(f"[ray] {message}\n")
    sys.stderr.flush()


def _send(sock: socket.socket, doc: dict) -> None:
    sock.sendall((json.dumps(doc) + "\n").encode())


def _lines(sock: socket.socket):
    """JSON documents from ``sock`` until EOF (or a connection error)."""
    buffer = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, _, buffer = buffer.partition(b"\n")
            try:
                yield json.loads(line)
            except ValueError:
                return


class Gcs:
    """The head's control process: who is in the cluster, and who wants to know."""

    def __init__(self, port: int, head_name: str, gpus_per_node: int = 1):
        self.port = port
        self.nodes: Dict[str, int] = {head_name: gpus_per_node}  # name -> GPUs
        self.drivers: List[tuple] = []  # (socket, GPUs wanted, ready sent)
        self.lock = threading.Lock()

    def gpus(self) -> int:
        return sum(self.nodes.values())

    def serve(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", self.port))
        listener.listen(64)
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _notify_ready(self) -> None:
        with self.lock:
            nodes = sorted(self.nodes)
            for index, (sock, wanted, sent) in enumerate(self.drivers):
                if not sent and self.gpus() >= wanted:
                    try:
                        _send(sock, {"event": "ready", "nodes": nodes})
                    except OSError:
                        continue
                    self.drivers[index] = (sock, wanted, True)

    def _client(self, conn: socket.socket) -> None:
        messages = _lines(conn)
        hello = next(messages, None)
        if not isinstance(hello, dict):
            conn.close()
            return
        if hello.get("status"):
            with self.lock:
                _send(conn, {"nodes": sorted(self.nodes)})
            conn.close()
        elif hello.get("driver"):
            with self.lock:
                self.drivers.append((conn, int(hello.get("gpus") or 1), False))
            self._notify_ready()
        elif hello.get("node"):
            name = str(hello["node"])
            with self.lock:
                if name in self.nodes:
                    _send(conn, {"ok": False, "error": f"a node named {name} is already in the cluster"})
                    conn.close()
                    return
                self.nodes[name] = int(hello.get("gpus") or 1)
            _send(conn, {"ok": True})
            _log(f"node {name} joined ({self.gpus()} GPU(s) in the cluster)")
            self._notify_ready()
            for _ in messages:  # heartbeats, if any, until EOF
                pass
            with self.lock:
                self.nodes.pop(name, None)
                for sock, _, _ in self.drivers:
                    try:
                        _send(sock, {"event": "node_left", "node": name})
                    except OSError:
                        pass
            _log(f"node {name} left")


def _connect(address: str, timeout_s: float) -> socket.socket:
    """Connect to ``HOST:PORT``, retrying while nothing listens yet (the head may start later)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=5)
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"no Ray cluster at {address} ({err})") from None
            time.sleep(0.5)


class Driver:
    """The engine's view of the cluster (``--distributed-executor-backend ray``)."""

    def __init__(self, gpus: int, on_lost: Callable[[str], None], address: Optional[str] = None, timeout_s: float = 600):
        self.gpus, self.on_lost, self.timeout_s = gpus, on_lost, timeout_s
        self.address = address or current_cluster()
        self.nodes: List[str] = []

    @property
    def nodes_connected(self) -> int:
        return len(self.nodes)

    def wait_ready(self) -> List[str]:
        """Block until the cluster has the GPUs; raises ConnectionError or TimeoutError."""
        sock = _connect(self.address, 10)
        sock.settimeout(None)
        _send(sock, {"driver": True, "gpus": self.gpus})
        messages = _lines(sock)
        ready = threading.Event()

        def read() -> None:
            for doc in messages:
                if doc.get("event") == "ready":
                    self.nodes = list(doc.get("nodes") or [])
                    ready.set()
                elif doc.get("event") == "node_left" and ready.is_set():
                    self.nodes = [n for n in self.nodes if n != doc.get("node")]
                    self.on_lost(str(doc.get("node")))
            if ready.is_set():
                self.on_lost("the Ray head (GCS)")

        threading.Thread(target=read, name="ray-driver", daemon=True).start()
        if not ready.wait(self.timeout_s):
            raise TimeoutError(f"the Ray cluster at {self.address} did not reach {self.gpus} GPU(s) "
                               f"within {self.timeout_s:g}s")
        return self.nodes


def current_cluster() -> str:
    """The address ``ray start --head`` recorded on this host, else $RAY_ADDRESS, else the default."""
    try:
        with open(cluster_file()) as handle:
            return handle.read().strip()
    except OSError:
        return os.environ.get("RAY_ADDRESS") or f"127.0.0.1:{DEFAULT_PORT}"


def _option(args: List[str], name: str) -> Optional[str]:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _start_head(port: int, name: str) -> int:
    argv = [sys.executable, "-m", f"{__package__}.ray", "_gcs", str(port), name]
    os.makedirs(os.path.dirname(cluster_file()), exist_ok=True)
    # Its own log, not our stdout/stderr: a caller reading them to the end must not wait on it.
    with open(os.path.join(os.path.dirname(cluster_file()), "gcs.log"), "ab") as log:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() >= deadline:
                _log(f"the head did not start on port {port}")
                return 1
            time.sleep(0.1)
    with open(cluster_file(), "w") as handle:
        handle.write(f"127.0.0.1:{port}\n")
    print("Ray runtime started.")
    print(f"To add another node to this Ray cluster, run\n  ray start --address='<this host>:{port}'")
    return 0


def _join(address: str, block: bool, name: str) -> int:
    try:
        sock = _connect(address, float(os.environ.get("SPARKCTL_STANDIN_RENDEZVOUS_TIMEOUT_S", "600")))
    except ConnectionError as err:
        _log(str(err))
        return 1
    sock.settimeout(None)
    _send(sock, {"node": name, "gpus": 1})
    messages = _lines(sock)
    answer = next(messages, None)
    if not isinstance(answer, dict) or not answer.get("ok"):
        _log(f"could not join {address}: {(answer or {}).get('error', 'no answer')}")
        return 1
    print(f"Ray runtime started: node {name} joined the cluster at {address}.", flush=True)
    if not block:
        return 0
    for _ in messages:  # SIGTERM: exit 0 (main's exit_on_stop)
        pass
    _log(f"the head at {address} went away")
    return 1


def main(args: List[str]) -> int:
    exit_on_stop()  # a worker waits up to the rendezvous timeout for its head: docker stop must end it meanwhile
    if args[:1] == ["_gcs"]:
        Gcs(int(args[1]), args[2]).serve()
        return 0
    if args[:1] == ["start"]:
        name = _option(args, "--node-name") or socket.gethostname()
        if "--head" in args:
            return _start_head(int(_option(args, "--port") or DEFAULT_PORT), name)
        address = _option(args, "--address")
        if not address:
            _log("ray start: give --head or --address=HEAD:PORT")
            return 2
        return _join(address.strip("'\""), "--block" in args, name)
    if args[:1] == ["status"]:
        try:
            sock = _connect(current_cluster(), 2)
        except ConnectionError as err:
            _log(str(err))
            return 1
        _send(sock, {"status": True})
        answer = next(_lines(sock), None) or {}
        print("Active:\n" + "".join(f" 1 node_{n}\n" for n in answer.get("nodes") or []), end="")
        return 0
    _log("usage: ray start --head [--port=P] | ray start --address=HEAD:P [--block] | ray status")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
