"""How far a long transfer or read is, said the same way everywhere: done of total, percent, rate
and the time left (at the rate so far). Used by model sync (hashing and sending), pack-engram and
distribute for their lines on stderr."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def describe(done: float, total: Optional[float], elapsed: float) -> str:
    """``12.3 GiB of 510.0 GiB (2.4 %), 1.2 GiB/s, ETA 6m50s`` (no ETA before there is a rate)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    text = size(done)
    if total:
        text += f" of {size(total)} ({100.0 * min(done, total) / total:.1f} %)"
    text += f", {size(rate)}/s"
    if total and rate > 0 and done < total:
        text += f", ETA {duration((total - done) / rate)}"
    elif total and done >= total:
        text += f", done in {duration(elapsed)}"
    return text


class Meter:
    """A byte count that several threads add to, said at most every ``every`` seconds through ``say``."""

    def __init__(self, what: str, total: Optional[float], say: Callable[[str], None], every: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.total, self.say, self.every, self.clock = what, total, say, every, clock
        self.done = 0
        self.started = self._last = clock()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = self.clock()
            if now - self._last < self.every:
                return
            self._last = now
            line = f"  {self.what}: {describe(self.done, self.total, now - self.started)}"
        self.say(line)

    def finish(self) -> None:
        self.say(f"  {self.what}: {describe(self.done, self.total or self.done, self.clock() - self.started)}")
