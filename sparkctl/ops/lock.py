"""The deploy lock: one context manager every changing verb (serve, stop, up) runs under.

``with deploy_lock(inventory, pool, verb="serve", what="serve tp4 on a, b") as held:`` takes the
lock on the inventory's head (``<paths.state_dir>/deploy.lock``, an atomic rename: see
``sparkctl.commands.lock``), runs the block, then, success or not, appends one audit line
(``held.audit_fields``, filled in by the block) and releases the lock if it is still ours.

The lock records its holder's process: the control machine's name, the pid, the process's start
time and the machine's boot ID. A later run on the same machine can therefore tell a live holder
from a dead one (a reused pid has another start time; a reboot another boot ID). ``--break-lock``
removes a lock only when its holder is known to be dead; a live one, or one taken from another
machine (whose processes cannot be seen from here), needs ``--force-break-lock``, said loudly.
"""

from __future__ import annotations

import os
import secrets
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator, Optional

from sparkctl.commands import facts
from sparkctl.commands.lock import (
    LOCK_HELD,
    audit_argv,
    audit_line,
    audit_log,
    lock_argv,
    lock_dir,
    parse_lock_info,
    unlock_argv,
    break_lock_argv,
    NOT_HOLDER,
)
from sparkctl.ops.steps import STEP_TIMEOUT_S, ask, check_result, utc_now
from sparkctl.reporter import Reporter

LIVE, DEAD, UNKNOWN = "live", "dead", "unknown"


class LockRefused(Exception):
    """The lock could not be taken (held, or the head could not be asked): one line saying why."""


def who_am_i() -> str:
    import getpass

    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers): still say something
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# ---------------------------------------------------------------------------------------------
# The holder's process, and whether it still runs


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def boot_id() -> Optional[str]:
    text = _read("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def process_start(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None when it is gone."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ")".
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def this_process() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": process_start(os.getpid()), "boot": boot_id()}


def holder_state(info: dict) -> tuple[str, str]:
    """(LIVE | DEAD | UNKNOWN, why) for the process that took the lock ``info`` describes."""
    holder = info.get("holder") if isinstance(info.get("holder"), dict) else {}
    host, pid = holder.get("host"), holder.get("pid")
    if not host or not isinstance(pid, int):
        return UNKNOWN, "the lock does not say which process holds it"
    if host != socket.gethostname():
        return UNKNOWN, f"it was taken from another machine ({host}), whose processes cannot be seen from here"
    if holder.get("boot") and boot_id() and holder["boot"] != boot_id():
        return DEAD, f"{host} has restarted since"
    if not os.path.exists("/proc/self/stat"):  # no /proc (macOS): the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return DEAD, f"process {pid} on {host} is gone"
        except PermissionError:
            pass
        return LIVE, f"process {pid} on {host} still runs"
    started = process_start(pid)
    if started is None:
        return DEAD, f"process {pid} on {host} is gone"
    if holder.get("started") and started != holder["started"]:
        return DEAD, f"process {pid} on {host} is gone (the pid now belongs to another process)"
    return LIVE, f"process {pid} on {host} still runs"


def describe_lock(info: dict, host: str, path: str) -> str:
    if not info:
        return f"the deploy lock {host}:{path} is held (being taken right now, no details yet)"
    age = ""
    try:
        taken = datetime.strptime(info.get("when", ""), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        seconds = int((datetime.now(timezone.utc) - taken).total_seconds())
        age = f", {seconds // 3600}h{seconds % 3600 // 60:02d}m ago" if seconds >= 3600 else f", {seconds // 60}m{seconds % 60:02d}s ago"
    except ValueError:
        pass
    return (f"the deploy lock {host}:{path} is held by {info.get('who', '?')} since {info.get('when', '?')}{age} "
            f"({info.get('what', '?')})")


# ---------------------------------------------------------------------------------------------
# Taking, breaking, releasing


@dataclass
class Held:
    """The lock, while the block runs. The block fills ``audit_fields`` for the audit line."""

    host: str
    path: str
    who: str
    token: str
    broken: Optional[dict] = None  # the details of a lock this run removed
    audit_fields: dict = field(default_factory=dict)
    audit: Optional[str] = None  # the audit line, once written


def _break(conn, host: str, path: str, *, force: bool, reporter: Reporter) -> Optional[dict]:
    """Remove the current lock if allowed; its details (None when there was none). Raises LockRefused."""
    info = ask(conn, facts.LOCK, path)
    if info is None:
        return None
    state, why = holder_state(info)
    described = describe_lock(info, host, path)
    if not force and state != DEAD:
        if state == LIVE:
            raise LockRefused(f"{described}; not breaking it: {why} (wait for it, or stop that run)")
        raise LockRefused(f"{described}; cannot tell whether its run is alive: {why}; if you are sure it is gone, "
                          "pass --force-break-lock")
    if force:
        reporter.note(f"FORCE-BREAKING the deploy lock ({state}: {why}): {described}")
    else:
        reporter.note(f"breaking a stale deploy lock ({why}): {described}")
    # Remove exactly that lock (its token), not one another run took meanwhile.
    token = info.get("token")
    argv = unlock_argv(token, path) if token else break_lock_argv(path)
    check_result(conn.run(argv, timeout=STEP_TIMEOUT_S), "remove the deploy lock")
    return info


def provably_gone(info: dict) -> bool:
    """The lock's holder ran on this very machine, since its last boot, and is gone: nothing can still
    be working under that lock, so it may be released without asking. (A lock from another machine,
    or from before a reboot — which a clone of this machine under the same name could also look like —
    still needs --break-lock.)"""
    holder = info.get("holder") if isinstance(info.get("holder"), dict) else {}
    same_boot = bool(holder.get("boot")) and holder.get("boot") == boot_id()
    return same_boot and holder_state(info)[0] == DEAD


def _take(conn, host: str, path: str, info: dict, reporter: Reporter) -> None:
    result = conn.run(lock_argv(info, path), timeout=STEP_TIMEOUT_S)
    if result.exit_code == LOCK_HELD:
        current = parse_lock_info(result.stdout) or {}
        if current and provably_gone(current):
            reporter.note(f"releasing a stale deploy lock: {describe_lock(current, host, path)}; {holder_state(current)[1]} "
                "(it ran on this machine since its last boot)")
            token = current.get("token")
            check_result(conn.run(unlock_argv(token, path) if token else break_lock_argv(path), timeout=STEP_TIMEOUT_S),
                         "release the stale deploy lock")
            result = conn.run(lock_argv(info, path), timeout=STEP_TIMEOUT_S)  # once: a live run may have taken it meanwhile
            if result.exit_code != LOCK_HELD:
                check_result(result, "take the deploy lock")
                return
            current = parse_lock_info(result.stdout) or {}
        state, why = holder_state(current) if current else (UNKNOWN, "")
        hint = ("wait for it to finish (--break-lock refuses a live lock)" if state == LIVE else
                "pass --break-lock if that run is gone" if state == DEAD else
                "wait for it to finish, or pass --break-lock if that run is gone")
        raise LockRefused(describe_lock(current, host, path) + (f" ({why})" if why else "") + f"; {hint}")
    check_result(result, "take the deploy lock")


@contextmanager
def deploy_lock(inventory, pool, *, verb: str, what: str, who: str | None = None, break_lock: bool = False,
                force_break: bool = False, reporter: Optional[Reporter] = None) -> Iterator[Held]:
    """Hold the deploy lock for the block; raises ``LockRefused`` (before the block) when it cannot.
    Its notes and warnings go to ``reporter`` (None: recorded only)."""
    from sparkctl.remote.result import RemoteError

    reporter = reporter or Reporter()

    host = inventory.head.name
    state_dir = inventory.model.paths.state_dir
    path = lock_dir(state_dir)
    conn = pool.get(inventory.ssh_target(inventory.head))
    who = who or who_am_i()
    held = Held(host, path, who, secrets.token_hex(8))
    reporter.note(f"deploy lock on {host} ({path})")
    try:
        if break_lock or force_break:
            held.broken = _break(conn, host, path, force=force_break, reporter=reporter)
        _take(conn, host, path, {"who": who, "when": utc_now(), "what": what, "token": held.token,
                                 "holder": this_process()}, reporter)
    except (RemoteError, RuntimeError) as err:
        raise LockRefused(f"cannot take the deploy lock on {host}: {err}") from None
    try:
        yield held
    finally:
        line = audit_line(utc_now(), who, verb, held.audit_fields)
        try:
            if conn.run(audit_argv(line, audit_log(state_dir)), timeout=STEP_TIMEOUT_S).ok:
                held.audit = line
            released = conn.run(unlock_argv(held.token, path), timeout=STEP_TIMEOUT_S)
            if not released.ok and released.exit_code != NOT_HOLDER:  # (not ours any more: broken by force)
                reporter.warning(f"could not release the deploy lock on {host}:{path}: "
                    f"{' '.join((released.stderr or '').split())[:200] or f'exit {released.exit_code}'}")
        except (RemoteError, OSError) as err:
            reporter.warning(f"could not write the audit line or release the lock on {host}: {err}")


@dataclass
class LockStatus:
    """A held lock as ``status`` reports it."""

    host: str
    path: str
    info: dict
    state: str
    why: str

    def describe(self) -> str:
        return f"{describe_lock(self.info, self.host, self.path)}; holder {self.state}: {self.why}"

    def to_json(self) -> dict:
        return {"host": self.host, "path": self.path, "who": self.info.get("who"), "when": self.info.get("when"),
                "what": self.info.get("what"), "holder": self.state, "why": self.why}


def current_lock(inventory, pool) -> Optional[LockStatus]:
    """The deploy lock if one is held (None when free). Raises RemoteError/RuntimeError when the head cannot be asked."""
    path = lock_dir(inventory.model.paths.state_dir)
    info = ask(pool.get(inventory.ssh_target(inventory.head)), facts.LOCK, path)
    if info is None:
        return None
    state, why = holder_state(info) if info else (UNKNOWN, "no details yet (being taken)")
    return LockStatus(inventory.head.name, path, info, state, why)
