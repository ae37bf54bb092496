"""A remote command line from an argv list (standard library only)."""

from __future__ import annotations

import os
import shlex
from typing import Sequence


def join_argv(argv: Sequence[str]) -> str:
    """The remote command line for ``argv``: every element shell-quoted, so it arrives verbatim."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a list of strings, not one string (the remote shell would split it)")
    parts = [os.fspath(part) if isinstance(part, os.PathLike) else part for part in argv]
    if not parts:
        raise ValueError("argv is empty")
    for part in parts:
        if not isinstance(part, str):
            raise TypeError(f"argv elements must be strings, got {type(part).__name__}: {part!r}")
    return " ".join(shlex.quote(part) for part in parts)
