"""A stream-out sink for remote programs that report as JSON lines (the image relay, the checkpoint agent)."""

from __future__ import annotations

import json
from typing import Callable


class JsonLines:
    """Cuts a remote program's stdout into JSON documents as they arrive (a line may come in pieces)."""

    def __init__(self, on_doc: Callable[[dict], None]):
        self.on_doc, self.pending = on_doc, b""

    def __call__(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            if line.strip():
                self.on_doc(json.loads(line))
