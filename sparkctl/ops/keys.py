"""Single keys from the terminal while a live view refreshes (``q`` quits ``top``).

The terminal is put in cbreak mode (keys arrive one by one, without Enter; Ctrl-C still
interrupts) only while the view runs, and always restored. Without a terminal on stdin there are
no keys: ``wait`` is a plain sleep.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from contextlib import contextmanager
from typing import Iterator, Optional


class Keys:
    def __init__(self, fd: Optional[int]):
        self.fd = fd

    def wait(self, seconds: float) -> Optional[str]:
        """Sleep up to ``seconds``; the key pressed meanwhile (then at once), else None."""
        if self.fd is None:
            time.sleep(max(0.0, seconds))
            return None
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
            if ready:
                data = os.read(self.fd, 1)
                return data.decode("utf-8", "replace") if data else None
            if left <= 0:
                return None


@contextmanager
def single_keys(stream=None) -> Iterator[Keys]:
    stream = stream if stream is not None else sys.stdin
    try:
        fd = stream.fileno()
        interactive = os.isatty(fd)
    except (AttributeError, ValueError, OSError):
        fd, interactive = None, False
    if not interactive:
        yield Keys(None)
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield Keys(fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
