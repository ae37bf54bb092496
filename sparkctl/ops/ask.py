"""The one fact runner: ask a host a question (a ``sparkctl.commands.facts.Fact``) and get its typed answer.

Every verb asks this way (serve, status, stop, logs, lock, init, up, doctor):

- a connection that drops while asking (``RemoteError`` cause ``closed``) is asked once more on a
  fresh one (the Connection reconnects); any other ``RemoteError`` is raised as it is;
- a command that fails is ``FactFailed`` naming the host and the command's last stderr line --
  never a "no" -- unless that stderr says the thing asked about is absent (``Fact.absent_when``),
  then the answer is ``parse("")``; an answer the parser cannot read is ``FactFailed`` too;
- in a run that keeps answers (its pool's ``remember_facts``: ``up``), each host's answers are
  kept on its connection while nothing but facts runs there (the commands' answers: two facts read
  from one command share one run of it): a verb changes a host with other
  commands, which makes the host's kept answers stale, so ``up`` asks each question once per
  state of the host. Other verbs ask every time (``status --watch`` polls).
"""

from __future__ import annotations

import threading

from sparkctl.commands.facts import Fact
from sparkctl.commands.probes import ProbeError
from sparkctl.errors import OperationFailed
from sparkctl.remote.result import RemoteError

ASK_TIMEOUT_S = 60.0
NOT_FOUND = 127  # the shell's "command not found"
_memo_lock = threading.Lock()


class FactFailed(OperationFailed, RuntimeError):
    """The host answered with a failure (or with something unreadable). ``reason`` is that answer."""

    def __init__(self, host: str, fact: Fact, reason: str):
        self.host, self.fact, self.reason = host, fact, reason
        super().__init__(f"{host}: cannot {fact.what}: {reason}")


def _host(conn) -> str:
    return getattr(conn, "name", None) or "host"


def _run(conn, argv: list[str], timeout: float):
    # A transport that counts its changes also takes reads_only: a fact changes nothing.
    options = {"reads_only": True} if hasattr(conn, "changes") else {}
    for attempt in (1, 2):
        try:
            return conn.run(argv, timeout=timeout, **options)
        except RemoteError as err:
            # A connection that dropped mid-question says nothing about the host's answer: ask once
            # more on a fresh connection (run() reconnects).
            if err.cause != "closed" or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _answer(conn, fact: Fact, argv: list[str], result):
    if result.exit_code != 0:
        if fact.means_absent(result.stderr):
            return fact.parse("")
        if result.exit_code == NOT_FOUND:
            raise FactFailed(_host(conn), fact, f"{argv[0]}: command not found")
        lines = (result.stderr.strip() or result.stdout.strip() or f"exit {result.exit_code}").splitlines()
        raise FactFailed(_host(conn), fact, lines[-1][:200])
    try:
        return fact.parse(result.stdout)
    except (ProbeError, ValueError) as err:
        raise FactFailed(_host(conn), fact, str(err)) from None


def ask(conn, fact: Fact, *args, timeout: float = ASK_TIMEOUT_S, fresh: bool = False):
    """``fact``'s answer on ``conn``'s host (kept for the run while the host is unchanged, unless ``fresh``)."""
    argv = fact.argv(*args)
    before = getattr(conn, "changes", None)
    memo = getattr(conn, "memo", None)
    # The command's answer is kept, not the fact's: two facts read from one command (an image's ID
    # and its whole document) cost one run of it.
    key = tuple(argv)
    if memo is not None and not fresh:
        with _memo_lock:
            kept = memo.get(key)
        if kept is not None and kept[0] == before:
            return _answer(conn, fact, argv, kept[1])
    result = _run(conn, argv, timeout)
    value = _answer(conn, fact, argv, result)  # a failure is raised here, and never kept
    if memo is not None and conn.changes == before:  # nothing that may change the host ran meanwhile
        with _memo_lock:
            memo[key] = (conn.changes, result)
    return value
