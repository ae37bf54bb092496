"""What each stored surface carries (its tags, when it was read), kept beside the surfaces.

``surface.latest_for_tag`` runs on every render, and the surfaces folder keeps one document per
image ever read (60-90 KB each, hundreds after a while): reading them all cost every render
~0.2 s of CPU with ~750 files. The index (``index.json`` in the folder) keeps each file's tags
and read time against the file's identity (inode, size, modification time): an entry is trusted
only while its file is unchanged, and any other file is read as before. The index is rewritten
when an entry changed, atomically; a folder it cannot write is only read (the files stay the
truth, the index only saves reading them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sparkctl.fileio import atomic_write

INDEX_NAME = "index.json"
VERSION = 1


def entries(folder: Path, engine: str) -> list[tuple[Path, list[str], float]]:
    """(path, tags, read_at) of every stored surface of ``engine``, in the folder's listing order;
    a file that is not a readable surface has no tags."""
    suffix = f"-{engine}.json"
    index = _read_index(folder)
    found: list[tuple[Path, list[str], float]] = []
    listing = _listing(folder)
    changed = any(name not in listing for name in index)  # a file removed since: its entry drops out
    for name in listing:
        if not name.endswith(suffix):
            continue
        path = folder / name
        try:
            info = path.stat()
        except OSError:
            continue  # gone since the listing
        identity = [info.st_ino, info.st_size, info.st_mtime_ns]
        entry = index.get(name)
        if entry is None or entry.get("identity") != identity:
            read = _read_entry(path)
            if read is None:  # could not be read now (EMFILE, EACCES...): not remembered, asked again next time
                index.pop(name, None)
                changed = True
                continue
            entry = {"identity": identity, **read}
            index[name] = entry
            changed = True
        found.append((path, entry["tags"], entry["read_at"]))
    if changed:
        _write_index(folder, {name: entry for name, entry in index.items() if name in listing})
    return found


def _listing(folder: Path) -> dict[str, None]:
    """The folder's names in its listing order (a dict: ordered, and asked by name)."""
    try:
        with os.scandir(folder) as listing:
            return {item.name: None for item in listing}
    except OSError:
        return {}


def _read_entry(path: Path) -> dict | None:
    """The file's tags and read time (none when it is not a surface); None when it could not be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        doc = json.loads(text)
        tags = doc.get("tags", [])
        read_at = doc.get("read_at", 0)
    except (ValueError, AttributeError):
        return {"tags": [], "read_at": 0}
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        tags = []
    if not isinstance(read_at, (int, float)) or isinstance(read_at, bool):
        read_at = 0
    return {"tags": tags, "read_at": read_at}


def _read_index(folder: Path) -> dict:
    try:
        doc = json.loads((folder / INDEX_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("files"), dict):
        return {}
    return {name: entry for name, entry in doc["files"].items() if _well_formed(entry)}


def _well_formed(entry) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("identity"), list)
            and isinstance(entry.get("tags"), list) and isinstance(entry.get("read_at"), (int, float)))


def _write_index(folder: Path, files: dict) -> None:
    try:
        atomic_write(folder / INDEX_NAME, json.dumps({"version": VERSION, "files": files}, separators=(",", ":")), 0o644)
    except OSError:
        pass  # a folder this user cannot write: the next call reads the files again
