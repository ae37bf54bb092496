"""Writing files so that nothing is ever half-written under its final name."""

from __future__ import annotations

import os
import tempfile


def atomic_write(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> None:
    """Temp file in the same folder, fsync, chmod, rename, fsync the folder: a reader sees the old
    content or the new one, never a torn file, and the rename survives a crash."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
