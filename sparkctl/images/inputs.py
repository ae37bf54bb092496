"""A layer's inputs: the files it copies, their content hash, and the build-context tar docker reads.

The hash of a layer covers exactly what decides its content: the rendered Dockerfile, the build
arguments, and every copied file's path, mode and bytes (sha256). ``layer_key`` adds the parent
image's ID, so a layer is rebuilt when anything below it changed. The same ``ContextFile`` list
writes the tar, so what is hashed is what docker sees: mtimes and owners are fixed (they would
otherwise change the hash of nothing and the image of something).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import stat
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable

HASH_VERSION = 1  # bump when the hashed fields change: every layer then rebuilds once
FIXED_MTIME = 946684800  # 2000-01-01: reproducible context tars (docker keeps these mtimes)
DOCKERFILE_NAME = "Dockerfile.sparkctl"
PLACED_DIR = "sparkctl.placed"  # in a patch/revert layer's context: its files laid out as under package_root
_READ = 1024 * 1024


class MissingInput(Exception):
    def __init__(self, path: str, reason: str = "not found"):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


@dataclass(frozen=True)
class ContextFile:
    arcname: str  # path inside the build context (or the rootfs)
    kind: str  # "file", "dir" or "symlink"
    mode: int  # normalized: 0o755 / 0o644 for files, 0o755 for folders (tmp-like folders keep 0o1777)
    size: int = 0
    source: str | None = None  # local file to read (kind "file")
    linkname: str = ""  # kind "symlink"
    data: bytes | None = None  # generated content (instead of source)
    digest: str = ""  # sha256 of the content (kind "file")

    def record(self) -> list:
        """What the hash sees of this entry."""
        if self.kind == "file":
            return [self.arcname, "file", oct(self.mode), self.size, self.digest]
        if self.kind == "symlink":
            return [self.arcname, "symlink", self.linkname]
        return [self.arcname, "dir", oct(self.mode)]


_digest_cache: dict[tuple, str] = {}


def file_digest(path: str) -> str:
    """sha256 of a file's bytes (remembered per path, size and mtime for this process)."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
    cached = _digest_cache.get(key)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            block = handle.read(_READ)
            if not block:
                break
            h.update(block)
    _digest_cache[key] = digest = h.hexdigest()
    return digest


def _file_mode(st_mode: int) -> int:
    return 0o755 if st_mode & 0o111 else 0o644


def _excluded(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def _entry(path: str, arcname: str) -> ContextFile:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ContextFile(arcname=arcname, kind="symlink", mode=0o777, linkname=os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        mode = 0o1777 if st.st_mode & stat.S_ISVTX else 0o755
        return ContextFile(arcname=arcname, kind="dir", mode=mode)
    if stat.S_ISREG(st.st_mode):
        return ContextFile(arcname=arcname, kind="file", mode=_file_mode(st.st_mode), size=st.st_size, source=path,
                           digest=file_digest(path))
    raise MissingInput(arcname, "is neither a file, a folder nor a symlink")


def collect(root: Path, relative: str, exclude: Iterable[str] = (), *, arc_prefix: str | None = None) -> list[ContextFile]:
    """The entries of ``root/relative`` (a file, or a folder when ``relative`` ends with '/'), sorted.

    ``arc_prefix`` places them elsewhere in the tar (default: at ``relative``). Raises MissingInput.
    """
    exclude = list(exclude)
    want_dir = relative.endswith("/")
    rel = relative.strip("/")
    path = root / rel
    prefix = (arc_prefix if arc_prefix is not None else rel).strip("/")
    if not os.path.lexists(path):
        return _raise_missing(relative)
    if want_dir:
        if not path.is_dir():
            raise MissingInput(relative, "is not a folder")
        out: list[ContextFile] = []
        if prefix:
            out.append(ContextFile(arcname=prefix, kind="dir", mode=0o755))
        for current, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not _excluded(d, exclude))
            base = os.path.relpath(current, path)
            for name in sorted(dirs) + sorted(f for f in files if not _excluded(f, exclude)):
                inner = name if base == "." else f"{base}/{name}"
                out.append(_entry(os.path.join(current, name), f"{prefix}/{inner}" if prefix else inner))
        return sorted(out, key=lambda e: e.arcname)
    if path.is_dir() and not path.is_symlink():
        raise MissingInput(relative, "is a folder (write it with a trailing '/' to copy its contents)")
    return [_entry(str(path), prefix)]


def _raise_missing(relative: str):
    raise MissingInput(relative)


def canonical(data) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def inputs_hash(dockerfile: str, args: dict[str, str], files: Iterable[ContextFile], extra: dict | None = None) -> str:
    """sha256 over the rendered Dockerfile, the build arguments and every input's path, mode and content."""
    record = {
        "v": HASH_VERSION,
        "dockerfile": dockerfile,
        "args": dict(sorted(args.items())),
        "files": [f.record() for f in files],
    }
    if extra:
        record["extra"] = extra
    return hashlib.sha256(canonical(record)).hexdigest()


def layer_key(inputs: str, parent_id: str) -> str:
    """The label value a built layer carries: its inputs hash bound to the exact parent image."""
    return hashlib.sha256(f"{inputs}\n{parent_id}".encode()).hexdigest()


def _tarinfo(entry: ContextFile) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.arcname)
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, entry.linkname
    else:
        info.type, info.size = tarfile.REGTYPE, entry.size
    return info


def write_tar(entries: Iterable[ContextFile], fileobj: BinaryIO) -> int:
    """Write ``entries`` as a tar to ``fileobj``; returns the bytes written. A file that changed size
    since it was hashed is an error: the image would not match its label."""
    start = fileobj.tell() if fileobj.seekable() else 0
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = _tarinfo(entry)
            if entry.kind != "file":
                tar.addfile(info)
            elif entry.data is not None:
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                assert entry.source is not None
                with open(entry.source, "rb") as handle:
                    if os.fstat(handle.fileno()).st_size != entry.size:
                        raise MissingInput(entry.arcname, "changed while building; run the build again")
                    tar.addfile(info, handle)
    return (fileobj.tell() - start) if fileobj.seekable() else 0


def label_instruction(labels: dict[str, str]) -> str:
    """One Dockerfile ``LABEL`` instruction carrying every label, keys sorted.

    Not ``docker build --label``: the classic builder turns each of those into a LABEL step of its
    own (an intermediate container created and committed per label). Keys and values are quoted;
    a backslash, a quote and ``$`` (LABEL expands variables) are escaped so the value is kept as is."""
    def quoted(text: str) -> str:
        if any(ch in text for ch in "\n\r\0"):
            raise ValueError(f"a label cannot hold a line break or NUL: {text!r}")
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'

    return "LABEL " + " ".join(f"{quoted(key)}={quoted(value)}" for key, value in sorted(labels.items())) + "\n"


def generated(arcname: str, data: bytes, mode: int = 0o644) -> ContextFile:
    return ContextFile(arcname=arcname, kind="file", mode=mode, size=len(data), data=data,
                       digest=hashlib.sha256(data).hexdigest())


def chain_ids(diff_ids: list[str]) -> list[str]:
    """Docker's layer chain IDs: the first is the diff ID, each next is sha256("<parent chain> <diff>")."""
    out: list[str] = []
    for diff in diff_ids:
        out.append(diff if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {diff}".encode()).hexdigest())
    return out


def is_static_elf(path: str) -> bool:
    """True when ``path`` is an ELF executable without a program interpreter (statically linked)."""
    with open(path, "rb") as handle:
        header = handle.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF":
            return False
        is64, little = header[4] == 2, header[5] == 1
        end = "<" if little else ">"
        if is64:
            phoff, = struct.unpack(end + "Q", header[32:40])
            phentsize, phnum = struct.unpack(end + "HH", header[54:58])
        else:
            phoff, = struct.unpack(end + "I", header[28:32])
            phentsize, phnum = struct.unpack(end + "HH", header[42:46])
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    for index in range(phnum):
        p_type, = struct.unpack(end + "I", table[index * phentsize:index * phentsize + 4])
        if p_type == 3:  # PT_INTERP: needs a dynamic loader the image would not have
            return False
    return True
