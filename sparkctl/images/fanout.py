"""One reader, many writers: a ``docker save`` stream read once and sent to every host at the same time.

Each host has its own byte-bounded queue and its own sending thread, so a host never sees another
host's bytes out of order and a slow host only ever delays the reader, never corrupts anyone. A host
that keeps the reader waiting too long (one wait longer than ``stall_timeout``, or more than
``lag_fraction`` of the time so far) is detached: its stream is aborted (its sender's abort hooks run,
e.g. killing its ssh process) and it is reported as ``lagged`` so the caller can retry it alone with
a read of its own. A host whose sender fails simply stops receiving; the others go on.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from sparkctl.images.archive import SaveStreamParser, Segment

DEFAULT_QUEUE_BYTES = 64 * 1024 * 1024


class StreamAborted(Exception):
    """Raised by ``Sink.chunks()`` when the stream was cut for this host: what it got is incomplete."""


class ByteQueue:
    """A FIFO of byte chunks holding at most ``max_bytes`` (one larger chunk is let in when empty)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._closed = False  # no more puts: the reader finished
        self._aborted = False
        self._cond = threading.Condition()

    def put(self, data: bytes, timeout: float | None) -> bool:
        """False when the queue stayed full for ``timeout`` seconds (or was aborted)."""
        with self._cond:
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._size and self._size + len(data) > self.max_bytes and not self._aborted:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            if self._aborted:
                return False
            self._items.append(data)
            self._size += len(data)
            self._cond.notify_all()
            return True

    def get(self) -> bytes | None:
        """The next chunk; None at the end (closed and drained) or once aborted."""
        with self._cond:
            while not self._items and not self._closed and not self._aborted:
                self._cond.wait()
            if self._aborted or not self._items:
                return None
            data = self._items.popleft()
            self._size -= len(data)
            self._cond.notify_all()
            return data

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
            self._items.clear()
            self._size = 0
            self._cond.notify_all()

    @property
    def size(self) -> int:
        return self._size


@dataclass
class SendResult:
    ok: bool
    error: str | None = None
    cause: str | None = None


@dataclass
class Sink:
    """One host's end of the stream."""

    name: str
    present: frozenset[str] = frozenset()  # chain IDs the host has: their layer tars are left out
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    queue: ByteQueue = field(init=False)
    state: str = "open"  # open -> done | failed | lagged
    error: str | None = None
    cause: str | None = None
    bytes_sent: int = 0  # handed to the transport by the sender thread
    bytes_skipped: int = 0  # left out (layers the host has)
    blocked: float = 0.0  # seconds the reader waited on this host's full queue
    started: float = 0.0
    finished: float = 0.0
    _abort_hooks: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.queue = ByteQueue(self.queue_bytes)

    def wants(self, segment: Segment) -> bool:
        return not segment.layers or not segment.layers <= self.present

    def on_abort(self, hook: Callable[[], None]) -> None:
        """Register what stops this host's transport at once (kill a process, close a connection)."""
        with self._lock:
            aborted = self.state == "lagged" or self.queue._aborted
            if not aborted:
                self._abort_hooks.append(hook)
        if aborted:
            hook()

    def abort(self) -> None:
        self.queue.abort()
        with self._lock:
            hooks, self._abort_hooks = self._abort_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # the transport may already be gone
                pass

    def chunks(self, on_sent: Callable[[int], None] | None = None) -> Iterator[bytes]:
        """What the sender thread streams: ends at the archive's end; raises StreamAborted when cut."""
        while True:
            data = self.queue.get()
            if data is None:
                if self.queue._aborted:
                    raise StreamAborted(self.error or "the stream was cut")
                return
            yield data
            self.bytes_sent += len(data)
            if on_sent is not None:
                on_sent(self.bytes_sent)


Send = Callable[[Sink], SendResult]


@dataclass
class RoundResult:
    sinks: dict[str, Sink]
    source_bytes: int
    seconds: float
    source_error: str | None = None


def stream_to_all(source: Iterable[bytes], diff_ids: list[str], sinks: list[Sink], send: Send, *,
                  stall_timeout: float = 30.0, lag_fraction: float = 0.5, lag_grace: float = 10.0,
                  close_source: Callable[[], None] | None = None) -> RoundResult:
    """Read ``source`` once; every sink gets the archive minus the layers it has, through ``send``.

    ``send(sink)`` runs in the sink's own thread and must consume ``sink.chunks()``.
    """
    started = time.monotonic()
    parser = SaveStreamParser(diff_ids)
    threads = [_start_sender(sink, send) for sink in sinks]
    source_error = None
    try:
        source_error = _feed_all(source, parser, sinks, started, stall_timeout, lag_fraction, lag_grace)
    except Exception as err:
        source_error = f"reading the image failed: {' '.join(str(err).split()) or type(err).__name__}"
    finally:
        if close_source is not None:
            try:
                close_source()
            except Exception:
                pass
    for sink in sinks:
        if source_error and sink.state == "open":
            with sink._lock:
                sink.state, sink.error, sink.cause = "failed", source_error, "source"
            sink.abort()
        else:
            sink.queue.close()
    for thread in threads:
        thread.join()
    return RoundResult({s.name: s for s in sinks}, parser.total, time.monotonic() - started, source_error)


def _start_sender(sink: Sink, send: Send) -> threading.Thread:
    """``send(sink)`` in the sink's own thread; how it ended lands in the sink's state."""
    sink.started = time.monotonic()

    def run() -> None:
        try:
            result = send(sink)
        except Exception as err:  # a sender bug or transport error must not take the others down
            result = SendResult(False, " ".join(str(err).split()) or type(err).__name__)
        with sink._lock:
            if sink.state == "open":
                if result.ok and not sink.queue._aborted:
                    sink.state = "done"
                else:
                    sink.state = "failed"
                    sink.error, sink.cause = result.error or "the transfer stopped", result.cause
        sink.finished = time.monotonic()
        sink.queue.abort()  # the reader must not wait on a queue nobody drains

    thread = threading.Thread(target=run, name=f"sparkctl-send-{sink.name}", daemon=True)
    thread.start()
    return thread


def _feed_all(source, parser, sinks: list[Sink], started: float, stall_timeout: float, lag_fraction: float,
              lag_grace: float) -> str | None:
    """Every chunk of ``source`` to the sinks still open (a laggard is detached); the source's error, if any."""
    open_sinks = list(sinks)
    for chunk in source:
        segments = parser.feed(chunk)
        for sink in list(open_sinks):
            if sink.state != "open" or not _deliver(sink, segments, started, stall_timeout, lag_fraction, lag_grace):
                open_sinks.remove(sink)
        if not open_sinks:
            return None
    if not parser.ended:
        return "the docker save stream ended before the end of the archive"
    return None


def _deliver(sink: Sink, segments, started: float, stall_timeout: float, lag_fraction: float, lag_grace: float) -> bool:
    """The segments this sink lacks into its queue; False once it is no longer open (detached, failed)."""
    for segment in segments:
        if not sink.wants(segment):
            sink.bytes_skipped += len(segment.data)
            continue
        waited_from = time.monotonic()
        delivered = sink.queue.put(segment.data, stall_timeout)
        waited = time.monotonic() - waited_from
        sink.blocked += waited
        elapsed = time.monotonic() - started
        lagging = not delivered or (elapsed > lag_grace and sink.blocked > lag_fraction * elapsed)
        if lagging and sink.state == "open":
            _detach(sink, waited, elapsed)
        if sink.state != "open":
            return False
    return True


def _detach(sink: Sink, waited: float, elapsed: float) -> None:
    with sink._lock:
        if sink.state != "open":
            return
        sink.state = "lagged"
        sink.error = (f"fell behind the shared stream (kept it waiting {sink.blocked:.1f}s of {elapsed:.1f}s); "
                      "detached so the other hosts go on")
        sink.cause = "lagged"
    sink.abort()
