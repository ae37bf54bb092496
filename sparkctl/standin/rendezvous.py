"""The multi-node rendezvous over real TCP: the head waits for every rank, then the job lives as one.

Rank 0 listens on the rendezvous port (vLLM ``--master-port``, SGLang ``--dist-init-addr``'s port).
Each worker connects (retrying while the head is not up yet, as torch's TCPStore clients do),
sends one JSON line ``{"rank", "nnodes", "tp", "model"}`` and gets ``{"ok": true}`` or the reason
it was refused (wrong world size, a rank taken twice, the job already complete). When all
``nnodes - 1`` workers are in, the head sends ``{"event": "start"}`` and both sides exchange a
heartbeat line every ``heartbeat_s``.

From then on the connections are the job's lifeline, as NCCL communicators are: a worker whose
connection drops or goes silent for ``peer_timeout_s`` makes the head exit non-zero, and a head
that leaves makes every worker exit (0 after an orderly ``{"event": "shutdown"}``, 1 otherwise).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Callable, Dict, List, Optional

PROTOCOL = 1
Log = Callable[[str, str], None]  # (level, message)


class RendezvousError(Exception):
    pass


RDMA_DEVICE_DIR = "/dev/infiniband"


def nccl_net_ib(env, device_dir: str = RDMA_DEVICE_DIR) -> Optional[str]:
    """What NCCL's IB transport says at init when it has nothing to open, else None.

    With ``NCCL_IB_HCA`` set (the deployment asks for RDMA) and no verbs device visible in the
    container (``docker run`` without ``--device /dev/infiniband``), NCCL logs "NET/IB : No device
    found." and the job would crawl over sockets or fail; the stand-in refuses to serve instead,
    so a deployment that forgot the device fails on the sandbox too. ``NCCL_IB_DISABLE=1`` asks for
    sockets on purpose."""
    hcas = env.get("NCCL_IB_HCA", "")
    if not hcas or env.get("NCCL_IB_DISABLE", "0") == "1":
        return None
    try:
        verbs = [name for name in os.listdir(device_dir) if name.startswith("uverbs")]
    except OSError:
        verbs = []
    if verbs:
        return None
    return (f"NCCL INFO NET/IB : No device found. (NCCL_IB_HCA={hcas}: no {device_dir}/uverbs* in this container; "
            "pass the RDMA devices with --device /dev/infiniband)")


def _send(sock: socket.socket, lock: threading.Lock, doc: dict) -> None:
    data = (json.dumps(doc) + "\n").encode()
    with lock:
        sock.sendall(data)


class _Lines:
    """JSON lines from a socket, with a per-line timeout (None: EOF)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def read(self, timeout: Optional[float]) -> Optional[dict]:
        self.sock.settimeout(timeout)
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                return None
            self.buffer += chunk
            if len(self.buffer) > 1 << 16:
                raise RendezvousError("peer sent an over-long line")
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            doc = json.loads(line)
        except ValueError:
            raise RendezvousError("peer sent something that is not a rendezvous message") from None
        if not isinstance(doc, dict):
            raise RendezvousError("peer sent something that is not a rendezvous message")
        return doc


class _Peer:
    def __init__(self, rank: int, sock: socket.socket, lines: _Lines, address: str):
        self.rank, self.sock, self.lines, self.address = rank, sock, lines, address
        self.lock = threading.Lock()
        self.lost = False


class Head:
    """Rank 0's side. ``wait_for_workers`` blocks until every rank is in; after ``start`` a rank that
    leaves calls ``on_lost(rank, why)`` (before it, the rank may simply join again)."""

    def __init__(self, *, port: int, nnodes: int, tp: int, model: str, log: Log, timeout_s: float,
                 on_lost: Callable[[int, str], None], heartbeat_s: float = 1.0, peer_timeout_s: float = 10.0,
                 bind: str = ""):
        self.port, self.nnodes, self.tp, self.model = port, nnodes, tp, model
        self.on_lost = on_lost
        self.log, self.timeout_s = log, timeout_s
        self.heartbeat_s, self.peer_timeout_s = heartbeat_s, peer_timeout_s
        self.bind = bind
        self.peers: Dict[int, _Peer] = {}
        self._lock = threading.Lock()
        self._complete = threading.Event()
        self._started = False
        self._stopping = False
        self.listener: Optional[socket.socket] = None
        self._deadline = 0.0

    @property
    def ranks_connected(self) -> int:
        with self._lock:
            return 1 + len(self.peers)

    def listen(self) -> None:
        listener = socket.socket(socket.AF_INET6 if ":" in self.bind else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.bind, self.port))
        except OSError as err:
            listener.close()
            raise RendezvousError(f"cannot listen on the rendezvous port {self.port}: {err.strerror or err} "
                                  "(another job's head still running?)") from None
        listener.listen(64)
        self.listener = listener
        self._deadline = time.monotonic() + self.timeout_s
        threading.Thread(target=self._accept_loop, name="rendezvous-accept", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                sock, addr = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(sock, addr[0]), daemon=True).start()

    def _handshake(self, sock: socket.socket, address: str) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines = _Lines(sock)
        lock = threading.Lock()
        try:
            hello = lines.read(self.peer_timeout_s)
        except (OSError, RendezvousError):
            sock.close()
            return
        if hello is None:
            sock.close()
            return
        rank = hello.get("rank")
        reason = None
        if hello.get("protocol") != PROTOCOL:
            reason = f"rendezvous protocol {hello.get('protocol')!r}, the head speaks {PROTOCOL}"
        elif hello.get("nnodes") != self.nnodes or hello.get("tp") != self.tp:
            reason = (f"rank {rank} was started for nnodes={hello.get('nnodes')} tp={hello.get('tp')}, "
                      f"the head for nnodes={self.nnodes} tp={self.tp}")
        elif not isinstance(rank, int) or not 1 <= rank < self.nnodes:
            reason = f"rank {rank!r} is not a worker rank of a {self.nnodes}-node job (1..{self.nnodes - 1})"
        with self._lock:
            if reason is None and self._started:
                reason = f"the job is complete and running; rank {rank} cannot join it"
            elif reason is None and rank in self.peers:
                reason = f"rank {rank} is already connected (from {self.peers[rank].address})"
            if reason is None:
                self.peers[rank] = _Peer(rank, sock, lines, address)
        if reason is not None:
            self.log("ERROR", f"refused a rank from {address}: {reason}")
            try:
                _send(sock, lock, {"ok": False, "error": reason})
            except OSError:
                pass
            sock.close()
            return
        peer = self.peers[rank]
        try:
            _send(sock, peer.lock, {"ok": True, "nnodes": self.nnodes})
        except OSError:
            with self._lock:
                self.peers.pop(rank, None)
            return
        self.log("INFO", f"rank {rank} joined from {address} ({self.ranks_connected}/{self.nnodes} ranks connected)")
        threading.Thread(target=self._watch, args=(peer,), name=f"watch-rank-{rank}", daemon=True).start()
        with self._lock:
            if len(self.peers) == self.nnodes - 1:
                self._complete.set()

    def wait_for_workers(self) -> None:
        deadline = self._deadline
        next_note = time.monotonic() + 10
        while not self._complete.wait(0.2):
            now = time.monotonic()
            if now >= deadline:
                raise RendezvousError(f"timed out after {self.timeout_s:g}s waiting for ranks {self.missing_ranks()} "
                                      f"({self.ranks_connected}/{self.nnodes} connected)")
            if now >= next_note:
                self.log("INFO", f"waiting for ranks {self.missing_ranks()} to join on port {self.port} "
                                 f"({self.ranks_connected}/{self.nnodes} connected)")
                next_note = now + 10

    def missing_ranks(self) -> List[int]:
        with self._lock:
            return [r for r in range(1, self.nnodes) if r not in self.peers]

    def start(self) -> bool:
        """Tell every worker the job starts; from now on a rank that leaves ends the job (``on_lost``).

        False when a rank left since ``wait_for_workers`` returned (wait again)."""
        with self._lock:
            if len(self.peers) != self.nnodes - 1:
                return False
            self._started = True
            peers = list(self.peers.values())
        for peer in peers:
            try:
                _send(peer.sock, peer.lock, {"event": "start"})
            except OSError as err:
                self._lost(peer, f"connection failed at start: {err}")
        return True

    def _lost(self, peer: _Peer, why: str) -> None:
        with self._lock:
            if self.peers.get(peer.rank) is not peer or peer.lost:
                return  # already handled
            peer.lost = True
            started = self._started
            if not started:
                del self.peers[peer.rank]
                self._complete.clear()
        try:
            peer.sock.close()
        except OSError:
            pass
        if self._stopping:
            return
        if started:
            self.on_lost(peer.rank, why)
        else:
            self.log("WARNING", f"rank {peer.rank} left before the job started ({why}); waiting for it again")

    def _watch(self, peer: _Peer) -> None:
        while True:
            try:
                doc = peer.lines.read(self.peer_timeout_s)
            except socket.timeout:
                why = f"no heartbeat for {self.peer_timeout_s:g}s"
                break
            except (OSError, RendezvousError) as err:
                why = f"connection error: {err}"
                break
            if doc is None:
                why = "connection closed"
                break
        self._lost(peer, why)

    def _heartbeat(self) -> None:
        while not self._stopping:
            with self._lock:
                peers = list(self.peers.values())
            for peer in peers:
                try:
                    _send(peer.sock, peer.lock, {"event": "heartbeat"})
                except OSError:
                    pass  # its watcher reports it
            time.sleep(self.heartbeat_s)

    def shutdown(self, orderly: bool = True) -> None:
        """Close the job: workers hear ``shutdown`` (orderly) or just lose the connection."""
        self._stopping = True
        with self._lock:
            peers = list(self.peers.values())
        for peer in peers:
            if orderly:
                try:
                    _send(peer.sock, peer.lock, {"event": "shutdown"})
                except OSError:
                    pass
            try:
                peer.sock.close()
            except OSError:
                pass
        if self.listener is not None:
            try:
                self.listener.close()
            except OSError:
                pass


class Worker:
    """A rank above 0: ``join`` blocks until the head starts the job; ``run`` until it ends."""

    def __init__(self, *, head: str, port: int, rank: int, nnodes: int, tp: int, model: str, log: Log,
                 timeout_s: float, heartbeat_s: float = 1.0, peer_timeout_s: float = 10.0):
        self.head, self.port, self.rank, self.nnodes, self.tp, self.model = head, port, rank, nnodes, tp, model
        self.log, self.timeout_s = log, timeout_s
        self.heartbeat_s, self.peer_timeout_s = heartbeat_s, peer_timeout_s
        self.sock: Optional[socket.socket] = None
        self.lines: Optional[_Lines] = None
        self._lock = threading.Lock()
        self._stopping = False

    def join(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        where = f"{self.head}:{self.port}"
        self.log("INFO", f"rank {self.rank}: connecting to the head at {where}")
        next_note = time.monotonic() + 10
        last_error = ""
        while True:
            try:
                sock = socket.create_connection((self.head, self.port), timeout=min(5.0, self.timeout_s))
                break
            except OSError as err:
                last_error = err.strerror or str(err)
            now = time.monotonic()
            if now >= deadline:
                raise RendezvousError(f"the head at {where} did not answer within {self.timeout_s:g}s ({last_error})")
            if now >= next_note:
                self.log("INFO", f"rank {self.rank}: still waiting for the head at {where} ({last_error})")
                next_note = now + 10
            time.sleep(0.5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.lines = sock, _Lines(sock)
        _send(sock, self._lock, {"protocol": PROTOCOL, "rank": self.rank, "nnodes": self.nnodes, "tp": self.tp,
                                 "model": self.model, "host": socket.gethostname()})
        try:
            answer = self.lines.read(max(1.0, deadline - time.monotonic()))
        except (OSError, RendezvousError) as err:
            raise RendezvousError(f"the head at {where} dropped the handshake: {err}") from None
        if answer is None:
            raise RendezvousError(f"the head at {where} closed the connection during the handshake")
        if not answer.get("ok"):
            raise RendezvousError(f"the head at {where} refused rank {self.rank}: {answer.get('error')}")
        self.log("INFO", f"rank {self.rank}: joined the head at {where}; waiting for the other ranks")
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        while True:
            try:
                doc = self.lines.read(self.peer_timeout_s)
            except (OSError, RendezvousError) as err:
                raise RendezvousError(f"lost the head at {where} before the job started: {err}") from None
            if doc is None:
                raise RendezvousError(f"the head at {where} closed the connection before the job started")
            if doc.get("event") == "start":
                return
            if doc.get("event") == "shutdown":
                raise RendezvousError("the head shut down before the job started")

    def run(self) -> int:
        """Until the job ends. Returns the exit code: 0 after an orderly shutdown, 1 otherwise."""
        while True:
            try:
                doc = self.lines.read(self.peer_timeout_s)
            except socket.timeout:
                self.log("ERROR", f"rank {self.rank}: no heartbeat from the head for {self.peer_timeout_s:g}s; "
                                  "the job is gone, exiting")
                return 1
            except ConnectionResetError:
                # A head process that died with a heartbeat unread by its kernel sends a reset, not a
                # close: the same event for this rank (which one arrives is a race).
                doc = None
            except (OSError, RendezvousError) as err:
                if self._stopping:
                    return 0
                self.log("ERROR", f"rank {self.rank}: lost the connection to the head ({err}); exiting")
                return 1
            if doc is None:
                if self._stopping:
                    return 0
                self.log("ERROR", f"rank {self.rank}: the head closed the connection (head process gone); exiting")
                return 1
            if doc.get("event") == "shutdown":
                self.log("INFO", f"rank {self.rank}: the head shut the job down; exiting")
                return 0

    def _heartbeat(self) -> None:
        while not self._stopping:
            try:
                _send(self.sock, self._lock, {"event": "heartbeat", "rank": self.rank})
            except OSError:
                return
            time.sleep(self.heartbeat_s)

    def leave(self) -> None:
        self._stopping = True
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
