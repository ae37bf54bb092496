"""The server-sent events of a streamed OpenAI-compatible answer, as both engines send them."""

from __future__ import annotations

from typing import Iterable, Iterator

DONE = "[DONE]"  # the last event's payload: the answer is complete


def data_payloads(lines: Iterable[str]) -> Iterator[str]:
    """Each ``data:`` line's payload in order (``DONE`` included: the caller stops there); other
    lines (comments, blank keep-alives, ``event:``) are skipped."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()
