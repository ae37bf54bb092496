"""How far a long transfer or read is, said the same way everywhere: done of total, percent, rate
and the time left (at the rate so far). The reporter's progress lines use it (``sparkctl.transfer``
counts the bytes: images, checkpoints hashed and sent, Engram shards)."""

from __future__ import annotations

from typing import Optional


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
