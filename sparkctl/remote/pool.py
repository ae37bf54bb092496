"""Many hosts at once: one Connection per host, kept for the whole run, and a bounded fan-out.

``fan_out`` never stops at the first failure: every host gets its HostResult (in input order),
and a host that cannot be reached is a failed result carrying its cause, not an exception.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, Iterator, TypeVar

from sparkctl.remote.connection import Connection
from sparkctl.remote.result import HostResult, RemoteError
from sparkctl.remote.target import SSHTarget

T = TypeVar("T")


class ConnectionPool:
    def __init__(self, *, connect_timeout: float = 10.0, accept_new_host_keys: bool = False,
                 ssh_config_path: str | None = None, remember_facts: bool = False):
        self.connect_timeout = connect_timeout
        self.remember_facts = remember_facts  # keep each host's fact answers while it is unchanged (up)
        self.accept_new_host_keys = accept_new_host_keys
        self.ssh_config_path = ssh_config_path
        self._connections: dict[SSHTarget, Connection] = {}
        self._lock = threading.Lock()

    def get(self, target: SSHTarget) -> Connection:
        """The pool's Connection for ``target`` (created on first request, not yet connected)."""
        with self._lock:
            connection = self._connections.get(target)
            if connection is None:
                connection = Connection(target, connect_timeout=self.connect_timeout,
                                        accept_new_host_keys=self.accept_new_host_keys,
                                        ssh_config_path=self.ssh_config_path)
                if self.remember_facts:
                    connection.memo = {}
                self._connections[target] = connection
            return connection

    def close_all(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
            self._connections.clear()
        for connection in connections:
            connection.close()

    def __enter__(self) -> "ConnectionPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close_all()


@contextlib.contextmanager
def run_pool(pool: "ConnectionPool | None" = None, *, connect_timeout: float = 10.0,
             accept_new_host_keys: bool = False) -> Iterator["ConnectionPool"]:
    """The run's pool when the caller has one (``up`` keeps one connection per host for all its
    steps), else a new one closed at the end: the one place a verb gets its connections."""
    if pool is not None:
        yield pool
        return
    with ConnectionPool(connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys) as own:
        yield own


def connect(target: SSHTarget, *, connect_timeout: float = 10.0, accept_new_host_keys: bool = False) -> Connection:
    """One connected Connection outside any pool (the caller closes it): a single-host verb."""
    return Connection(target, connect_timeout=connect_timeout, accept_new_host_keys=accept_new_host_keys).connect()


def _on_host(target: SSHTarget, fn: Callable[[Connection], T], pool: ConnectionPool) -> HostResult[T]:
    """``fn`` on ``target``'s connection, its failure a failed HostResult naming the host."""
    def connected() -> T:
        connection = pool.get(target)
        connection.connect()
        return fn(connection)
    return host_result(target.name, connected)


def host_result(name: str, fn: Callable[[], T]) -> HostResult[T]:
    """``fn()``'s value as host ``name``'s result; its failure a failed HostResult naming the host
    (a ``RemoteError``: with its cause), never an exception: the other hosts carry on."""
    started = time.monotonic()
    try:
        value = fn()
    except RemoteError as err:
        return HostResult(name=name, ok=False, value=None, error=str(err), cause=err.cause,
                          seconds=time.monotonic() - started)
    except Exception as err:  # the step itself failed; the other hosts carry on
        message = " ".join(str(err).split()) or type(err).__name__  # one line
        if not message.startswith(f"{name}:"):  # (a host "c" and "cannot ...": not named yet)
            message = f"{name}: {message}"
        return HostResult(name=name, ok=False, value=None, error=message, cause=None,
                          seconds=time.monotonic() - started)
    return HostResult(name=name, ok=True, value=value, error=None, cause=None, seconds=time.monotonic() - started)


def fan_out(targets: list[SSHTarget], fn: Callable[[Connection], T], *, pool: ConnectionPool,
            max_workers: int = 16) -> list[HostResult[T]]:
    """Run ``fn(connection)`` for every target in parallel (at most ``max_workers`` at a time)."""
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(targets))), thread_name_prefix="sparkctl-host") as ex:
        return list(ex.map(lambda target: _on_host(target, fn, pool), targets))


def fan_out_as_done(targets: list[SSHTarget], fn: Callable[[Connection], T], *, pool: ConnectionPool,
                    max_workers: int = 16) -> Iterator[HostResult[T]]:
    """``fan_out``'s results in the order the hosts answer, each as soon as it is known: a caller that
    has what it needs stops reading, and does not wait for the slower hosts (their work ends on its
    own, in the background; what has not started is cancelled)."""
    if not targets:
        return
    ex = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(targets))), thread_name_prefix="sparkctl-host")
    try:
        futures = [ex.submit(_on_host, target, fn, pool) for target in targets]
        for future in as_completed(futures):
            yield future.result()
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
