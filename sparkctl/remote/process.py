"""The transport over a local process: this machine itself, or a host through the system ssh client.

The same methods as the paramiko ``Connection`` (run, run_stream_in, run_stream_out, close), so a
caller streams ``docker save`` / ``docker load`` the same way whichever carries the bytes. Over
OpenSSH the client's exit status 255 (the connection itself failed) becomes a ``RemoteError``
with cause ``closed``, as a dropped paramiko channel does; any other status is the command's.
``close()`` kills every process still running (a stream that was detached or cancelled).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Callable, Iterable, Sequence

from sparkctl.remote import echo
from sparkctl.remote.openssh import SSH_FAILED, Route, client_argv
from sparkctl.remote.result import CommandResult, RemoteError

READ_SIZE = 1024 * 1024


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class ProcessTransport:
    """Runs argv lists as local processes; ``wrap`` turns an argv into the one actually started."""

    def __init__(self, name: str, wrap: Callable[[Sequence[str]], list[str]] | None = None,
                 env: dict | None = None, where: str | None = None):
        self.name = name
        self.where = where  # the address an ssh client connects to (None: this machine)
        self._wrap = wrap
        self._env = {**os.environ, **env} if env else None
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.changes = 0  # as a Connection's: commands that may have changed the host
        self.memo: dict | None = None  # facts are asked again each time (see Connection.memo)

    def __repr__(self) -> str:
        return f"ProcessTransport({self.name!r})"

    def connect(self) -> "ProcessTransport":
        return self

    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None,
            reads_only: bool = False) -> CommandResult:
        if not reads_only:
            self.changes += 1
        return self._exec(argv, [stdin] if stdin else None, None, None, timeout)

    def run_stream_in(self, argv: Sequence[str], chunks: Iterable[bytes], *, timeout: float | None = None,
                      on_progress: Callable[[int], None] | None = None) -> CommandResult:
        self.changes += 1
        return self._exec(argv, chunks, None, on_progress, timeout)

    def run_stream_out(self, argv: Sequence[str], sink: Callable[[bytes], None], *, timeout: float | None = None,
                       on_progress: Callable[[int], None] | None = None) -> CommandResult:
        self.changes += 1
        return self._exec(argv, None, sink, on_progress, timeout)

    def close(self) -> None:
        with self._lock:
            live = list(self._live)
        for proc in live:
            if proc.poll() is None:
                proc.kill()

    def _exec(self, argv, chunks, sink, on_progress, timeout) -> CommandResult:
        if self.where is not None:  # -v echoes what runs on hosts, not this machine's own commands
            echo.command(self.name, list(argv), stdin=chunks is not None)
        started = time.monotonic()
        proc = subprocess.Popen(self._wrap(argv) if self._wrap else list(argv),
                                stdin=subprocess.PIPE if chunks is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                start_new_session=True, env=self._env)
        with self._lock:
            self._live.add(proc)
        out = _Drain(proc.stdout, sink, None if chunks is not None else on_progress)
        err = _Drain(proc.stderr, None, None)
        try:
            sent = _feed(proc, chunks, on_progress if chunks is not None else None)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise RemoteError(self.name, "timeout", f"command did not finish within {timeout:g}s: {argv[0]}") from None
            out.join()
            err.join()
        finally:
            with self._lock:
                self._live.discard(proc)
            if proc.poll() is None:
                proc.kill()
        if out.error is not None:
            raise out.error
        stderr = err.text()
        if self.where is not None and code == SSH_FAILED:
            raise RemoteError(self.name, "closed", f"ssh to {self.where}: {last_line(stderr) or 'connection failed'}")
        return CommandResult(exit_code=code, stdout="" if sink else out.text(), stderr=stderr,
                             seconds=time.monotonic() - started, bytes_sent=sent, bytes_received=out.received)


def _feed(proc: subprocess.Popen, chunks, on_sent) -> int:
    """Write ``chunks`` to the process's stdin; stop quietly when it stops reading (its status says why)."""
    if chunks is None:
        return 0
    sent = 0
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                written = proc.stdin.write(view)
                view = view[written:]
                sent += written
            if on_sent is not None:
                on_sent(sent)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
    return sent


class _Drain(threading.Thread):
    """Reads one of a process's pipes to its end: into ``sink`` block by block, or kept."""

    def __init__(self, stream, sink, on_progress):
        super().__init__(daemon=True)
        self.stream, self.sink, self.on_progress = stream, sink, on_progress
        self.kept: list[bytes] = []
        self.received = 0
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        while True:
            block = self.stream.read(READ_SIZE)
            if not block:
                return
            self.received += len(block)
            if self.sink is None:
                self.kept.append(block)
            elif self.error is None:
                try:
                    self.sink(block)
                except BaseException as err:  # the caller's sink failed: reported after the process ends
                    self.error = err
            if self.on_progress is not None:
                self.on_progress(self.received)

    def text(self) -> str:
        return b"".join(self.kept).decode("utf-8", "replace")


def local(env: dict | None = None) -> ProcessTransport:
    """This machine as a host: argv run directly, no shell."""
    return ProcessTransport("local", env=env)


def over_openssh(route: Route, connect_timeout: float = 10.0) -> ProcessTransport:
    """``route``'s host through this machine's ssh client (the bulk streams)."""
    return ProcessTransport(route.name, wrap=lambda argv: client_argv(route, argv, connect_timeout), where=route.address)
