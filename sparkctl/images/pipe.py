"""A sink's bytes into a process's stdin (``ssh HOST docker load``), and a per-host rate limit.

Standard library only: ``sparkctl.images.relay`` runs this on the source host with its python3.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Callable

from sparkctl.images.fanout import SendResult, Sink, StreamAborted

SSH_FAILED = 255  # what the ssh client exits with when the connection itself failed


def pipe_into(argv: list[str], sink: Sink, on_sent: Callable[[int], None] | None, where: str) -> SendResult:
    """Run ``argv`` and stream ``sink.chunks()`` into its stdin; the exit status says how it went.
    ``where`` names the far end in messages (``ssh to 10.0.0.2: ...``)."""
    aborted = None
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=0, start_new_session=True)
    sink.on_abort(lambda: kill(proc))
    output: dict[str, bytes] = {}
    readers = [threading.Thread(target=drain, args=(stream, output, key), daemon=True)
               for key, stream in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    assert proc.stdin is not None
    try:
        for chunk in sink.chunks(on_sent):
            write_all(proc.stdin, chunk)
    except (BrokenPipeError, OSError):
        pass  # the command ended early: its exit status says why
    except StreamAborted as err:
        kill(proc)
        aborted = str(err)
    finally:
        code = finish(proc, readers)
    err = output.get("err", b"").decode("utf-8", "replace")
    if aborted is not None:
        return SendResult(False, aborted, "lagged")
    if code == 0:
        return SendResult(True)
    if code == SSH_FAILED:
        return SendResult(False, f"ssh to {where}: {last_line(err) or 'connection failed'}", "closed")
    return SendResult(False, f"docker load failed (exit {code}): "
                             f"{last_line(err) or last_line(output.get('out', b'').decode('utf-8', 'replace'))}")


def read_from(argv: list[str], what: str, chunk: int = 1024 * 1024, error: type[Exception] = RuntimeError):
    """Run ``argv`` and read its stdout in ``chunk``-sized blocks: (iterator, close). The iterator
    raises ``error("<what> failed (exit N): <its last stderr line>")`` after the last block when the
    command failed; ``close()`` kills it (a reader that stops early)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=0, start_new_session=True)
    errors: dict[str, bytes] = {}
    reader = threading.Thread(target=drain, args=(proc.stderr, errors, "err"), daemon=True)
    reader.start()

    def blocks():
        assert proc.stdout is not None
        while True:
            block = proc.stdout.read(chunk)
            if not block:
                break
            yield block
        code = proc.wait()
        reader.join()
        if code != 0:
            raise error(f"{what} failed (exit {code}): {last_line(errors.get('err', b'').decode('utf-8', 'replace'))}")

    return blocks(), lambda: kill(proc)


def finish(proc: subprocess.Popen, readers) -> int:
    """End of the input: close the process's stdin, wait for it and its output readers; its status."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    code = proc.wait()
    for reader in readers:
        reader.join()
    return code


def write_all(stream, data: bytes) -> None:
    """All of ``data`` into an unbuffered pipe (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[stream.write(view):]


def read_to_end(read) -> bytes:
    """Everything ``read(n)`` gives until it gives nothing (end of a pipe, a socket, a file)."""
    chunks = []
    while True:
        block = read(65536)
        if not block:
            return b"".join(chunks)
        chunks.append(block)


def drain(stream, output: dict, key: str) -> None:
    output[key] = read_to_end(stream.read)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class Rate:
    """Holds a host's stream to ``mb_per_s`` (decimal MB) on average: call it with the bytes sent so far."""

    def __init__(self, mb_per_s: float):
        self.rate = mb_per_s * 1e6
        self.started = time.monotonic()

    def __call__(self, sent: int) -> None:
        ahead = sent / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(ahead)
