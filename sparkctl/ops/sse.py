"""Server-sent events as the OpenAI-compatible engines stream them: ``data: JSON`` lines, ended by
``data: [DONE]``. bench and smoke read their streams through this one reader."""

from __future__ import annotations

from typing import Iterable, Iterator


class DataEvents:
    """The payloads of the ``data:`` lines of ``lines``, up to ``data: [DONE]``; ``done`` says
    whether the stream ended with it (a stream cut short has no [DONE])."""

    def __init__(self, lines: Iterable[str]):
        self.lines = lines
        self.done = False

    def __iter__(self) -> Iterator[str]:
        for line in self.lines:
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                self.done = True
                return
            yield payload
