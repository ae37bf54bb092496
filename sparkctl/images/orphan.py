"""A host agent (distribute's relay, model sync's sender) must not outlive the sparkctl command that
started it. Its stdout is the SSH channel back to that command: when a write there fails (Ctrl-C or
kill of the command, a dropped connection), nobody is left to read the answer, so the agent removes
its temporary folders, ends the processes it started (docker save, the ssh pipes to other hosts,
which ends their docker load) and exits.

Standard library only: shipped inside the agents' zip (``relay_zip``), pack-engram's host program too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys

_FOLDERS: list[str] = []
ORPHAN_EXIT = 3


def remove_when_orphaned(folder: str) -> None:
    _FOLDERS.append(folder)


def _shipped_folder() -> str | None:
    """The folder the agent itself was shipped to (``/tmp/sparkctl-relay.XXXXXX/relay.pyz``)."""
    folder = os.path.dirname(os.path.abspath(sys.argv[0] if sys.argv and sys.argv[0] else ""))
    return folder if os.path.basename(folder).startswith("sparkctl-") and folder.startswith("/tmp/") else None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def remove_shipped_folder() -> None:
    """Remove the folder this agent was shipped to (a one-shot agent, at its end)."""
    folder = _shipped_folder()
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def controller_gone(code: int = ORPHAN_EXIT) -> None:
    """Clean up and exit at once (other threads included) with ``code``."""
    remove_shipped_folder()
    for folder in _FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    os._exit(code)


def emit(doc: dict, out=None) -> None:
    """One JSON line to the command that started us; if it is gone, so are we."""
    out = out or sys.stdout
    try:
        out.write(json.dumps(doc) + "\n")
        out.flush()
    except (BrokenPipeError, ConnectionResetError, ValueError):  # ValueError: the stream was closed here
        controller_gone()
