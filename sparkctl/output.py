"""One object decides how results reach the user: JSON on stdout, or text for humans on stderr/stdout."""

from __future__ import annotations

import json
import sys
from typing import Any

from sparkctl.reporter import Event, Reporter, StepRecord, console_renderer, style_for  # noqa: F401  (the one reporter)


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` with its whitespace runs (newlines too) made single spaces; cut to ``limit`` with "..."."""
    text = " ".join(text.split())
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


class Output:
    def __init__(self, json_mode: bool = False, verbose: bool = False):
        self.json_mode, self.verbose = json_mode, verbose
        self._console = None
        self._reporter: Reporter | None = None

    @property
    def console(self):
        """A rich console on stderr (stdout stays clean for JSON and for piping)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
        return self._console

    @property
    def reporter(self) -> Reporter:
        """This command's one reporter of events (steps, notes, warnings), drawn on stderr."""
        if self._reporter is None:
            # a transfer's bars only when stderr is all there is to watch (not with --json)
            self._reporter = Reporter(console_renderer(self.console, style_for(self.console), bars=not self.json_mode))
        return self._reporter

    def info(self, message: str) -> None:
        """Progress and notes: always stderr."""
        self.console.print(message)

    def debug(self, message: str) -> None:
        if self.verbose:
            self.console.print(f"[dim]{message}[/dim]")

    def result(self, data: Any, human: str | None = None) -> None:
        """The command's one result: a JSON document with --json, else the human text on stdout."""
        if self.json_mode:
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
        elif human is not None:
            sys.stdout.write(human if human.endswith("\n") else human + "\n")
        sys.stdout.flush()


def size_text(n: float) -> str:
    """Bytes for people: B, KiB, MiB, GiB, TiB (binary units, one decimal)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
