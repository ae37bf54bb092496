"""Asking before a destructive step: stop, --force-break-lock, sandbox down.

``-y/--yes`` answers for the user. Without it, a terminal is asked (on stderr, so ``--json``
keeps its one document on stdout); with no terminal to ask (a script, CI) the verb refuses
before touching anything rather than guess, naming -y.
"""

from __future__ import annotations

import sys

import typer

from sparkctl.errors import ConfigError, OperationFailed


def confirm(question: str, *, yes: bool, flag_hint: str = "-y/--yes") -> None:
    """Return when the user (or ``yes``) agreed; raise otherwise. Nothing has changed when it raises."""
    if yes:
        return
    if not _stdin_is_terminal():
        raise ConfigError(f"{question} — no terminal to ask: pass {flag_hint} to go ahead (or --dry-run to see what "
                          "it would do)", field="--yes")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise OperationFailed("not confirmed; nothing changed")


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except ValueError:  # closed
        return False


__all__ = ["confirm", "typer"]
