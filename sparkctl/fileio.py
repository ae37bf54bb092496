"""Writing files so that nothing is ever half-written under its final name."""

from __future__ import annotations

import os
import stat
import tempfile

from sparkctl.errors import ConfigError


def check_writable_folder(existing: os.PathLike, needs: str, *, field: str) -> None:
    """The nearest place that exists above what is about to be written must be a folder this user can
    write in: ``{existing} is a file where {needs}``, or permission denied, as a ConfigError naming ``field``."""
    if not os.path.isdir(existing):
        raise ConfigError(f"{existing} is a file where {needs}", field=field)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write in {existing} (permission denied)", field=field)


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


# ---------------------------------------------------------------------------------------------
# Files the user names (known_hosts, identity_file, serving.api_key_file, ...)

SMALL_FILE_BYTES = 1024 * 1024  # a known_hosts, a private key or an API key file is far smaller


class UserFileError(ValueError):
    """A file the user named is not a regular file of bounded size; ``str()`` says why, without the path."""


def read_user_file(path: str | os.PathLike, max_bytes: int = SMALL_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; a FIFO, device, socket or folder, or a
    larger file, raise UserFileError at once (FileNotFoundError passes through), never a hang, never
    an unbounded read. The file is opened non-blocking (a FIFO without a writer cannot block the
    open) and judged by ``fstat`` of what was opened, so a swap after a check cannot fool it."""
    try:
        fd = os.open(os.path.expanduser(os.fspath(path)), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except IsADirectoryError:
        raise UserFileError("is a folder, not a file") from None
    except FileNotFoundError:
        raise
    except OSError as err:
        raise UserFileError(f"cannot be opened: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UserFileError("is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise UserFileError("is not a regular file (a pipe, device or socket)")
        if info.st_size > max_bytes:
            raise UserFileError(f"is {info.st_size:,} bytes, more than the {max_bytes:,} such a file may be")
        chunks, total = [], 0
        while total <= max_bytes:  # the size may have grown since fstat: never read past the cap
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise UserFileError(f"is more than the {max_bytes:,} bytes such a file may be")
        return b"".join(chunks)
    except OSError as err:
        raise UserFileError(f"cannot be read: {err.strerror or err}") from None
    finally:
        os.close(fd)


def check_user_file(path: str | os.PathLike, max_bytes: int = SMALL_FILE_BYTES, *, missing_ok: bool = True) -> None:
    """``read_user_file``'s checks, for a file read later (a missing one is fine when ``missing_ok``)."""
    try:
        read_user_file(path, max_bytes)
    except FileNotFoundError:
        if not missing_ok:
            raise UserFileError("does not exist") from None


def read_named_file(path: str | os.PathLike, *, field: str | None = None, max_bytes: int = SMALL_FILE_BYTES,
                    what: str = "file") -> str:
    """A file a setting or option names, as UTF-8 text: anything but a regular file of at most
    ``max_bytes`` is a ConfigError (exit 2) naming ``field`` and the path."""
    shown = os.path.expanduser(os.fspath(path))
    try:
        raw = read_user_file(shown, max_bytes)
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such {what}", field=field) from None
    except (UserFileError, ValueError) as err:  # ValueError: a NUL byte in the name
        raise ConfigError(f"{shown} {err}" if isinstance(err, UserFileError) else f"{shown!r}: not a valid path",
                          field=field) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{shown} is not UTF-8 text (byte {err.start})", field=field) from None
