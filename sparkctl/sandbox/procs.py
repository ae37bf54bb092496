"""Processes of the sandbox: recorded PIDs, ownership checks, and stopping them.

A PID from a pidfile is only trusted when the process still belongs to the host it was recorded
for: it lives in that host's network namespace, or it carries the host's marker in its
environment (set on every process the sandbox launches). PIDs are recycled; names are never used.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Iterable

from sparkctl.images.orphan import descendants  # noqa: F401  (every live process below a PID: one reader of /proc)

# Every process the sandbox launches carries this variable, valued with its host's folder.
MARKER_ENV = "SPARKCTL_SANDBOX_HOST"


def read_pidfile(path: str) -> int | None:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isdigit() else None


def is_alive(pid: int) -> bool:
    """True for a running process; a zombie (exited, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state letter follows the last ')' (the command name may itself contain ')').
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def ns_inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino)


def process_ns(pid: int, kind: str) -> tuple[int, int] | None:
    return ns_inode(f"/proc/{pid}/ns/{kind}")


def has_marker(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            env = handle.read().split(b"\0")
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        return False
    return f"{MARKER_ENV}={marker}".encode() in env


def owned(pid: int | None, *, netns_path: str, marker: str) -> bool:
    """Is ``pid`` alive and one of this host's processes?"""
    if pid is None or pid <= 1 or not is_alive(pid):
        return False
    netns = ns_inode(netns_path)
    if netns is not None and process_ns(pid, "net") == netns:
        return True
    return has_marker(pid, marker)


def all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None


def process_name(pid: int) -> str | None:
    """The kernel's short command name (/proc/PID/comm), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None


def processes_in(namespaces: Iterable[tuple[str, tuple[int, int]]], marker: str | None = None) -> set[int]:
    """PIDs inside any of ``namespaces`` ((kind, inode) pairs), or carrying ``marker``, plus all
    their descendants (containers run in namespaces of their own, under a shim that is ours)."""
    wanted = [(kind, ino) for kind, ino in namespaces if ino is not None]
    me = os.getpid()
    found: set[int] = set()
    parents: dict[int, int | None] = {}
    for pid in all_pids():
        if pid == me:
            continue
        parents[pid] = parent_of(pid)
        if any(process_ns(pid, kind) == ino for kind, ino in wanted) or (marker and has_marker(pid, marker)):
            if is_alive(pid):
                found.add(pid)
    # Descendants: repeat until no new child joins (the tree is shallow).
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if pid not in found and parent in found and is_alive(pid):
                found.add(pid)
                changed = True
    return found


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until every PID has exited; returns those still alive at the deadline."""
    remaining = set(pids)
    deadline = time.monotonic() + timeout
    while remaining:
        remaining = {pid for pid in remaining if is_alive(pid)}
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return remaining


def terminate(pids: Iterable[int], grace: float) -> set[int]:
    """SIGTERM, wait ``grace`` seconds, SIGKILL what is left. Returns PIDs that even survived that."""
    targets = {pid for pid in pids if pid > 1}
    if not targets:
        return set()
    signal_pids(targets, signal.SIGTERM)
    left = wait_gone(targets, grace)
    if left:
        signal_pids(left, signal.SIGKILL)
        left = wait_gone(left, 5.0)
    return left
