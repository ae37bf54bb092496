"""``sparkctl -v``: every remote command, per host, printed before it runs (as pyinfra and Kamal do).

Off unless the CLI turns it on (``echo_to``). Secret values (API keys, tokens, passwords given as
engine options) are masked with ``sparkctl.secrets``; content sent on stdin (file contents, image
streams) is never printed, only its presence.
"""

from __future__ import annotations

import shlex
import threading
from typing import Callable, Optional, Sequence

from sparkctl.secrets import mask_argv

_write: Optional[Callable[[str], None]] = None
_lock = threading.Lock()


def echo_to(write: Optional[Callable[[str], None]]) -> None:
    """Print every remote command with ``write`` from now on (None: stop)."""
    global _write
    _write = write


def masked(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of secret options masked, as the echo shows it."""
    return mask_argv(list(argv))


def command(host: str, argv: Sequence[str], *, stdin: bool = False) -> None:
    """Say that ``argv`` is about to run on ``host`` (when the echo is on)."""
    write = _write
    if write is None:
        return
    line = f"[{host}] $ {' '.join(shlex.quote(str(part)) for part in masked(argv))}"
    if stdin:
        line += "  (with input on stdin)"
    with _lock:
        write(line)
