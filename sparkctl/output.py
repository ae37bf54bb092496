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
            self._reporter = Reporter(console_renderer(self.console, style_for(self.console)))
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


class Transfer:
    """The one progress reporter for bytes going to hosts (images, checkpoints, Engram shards).

    On a terminal: a rich bar per host. Otherwise (a CI log, a pipe, ``--json``): a line on stderr
    every ``every`` seconds with the total, the rate and each host's bytes, and one at ``close``;
    ``note`` lines (a file done) are said only then, the bars already show them. Thread-safe:
    hosts report from their own threads. ``out`` None: silent (a dry run's plan).
    """

    def __init__(self, out, totals: dict[str, int | None], *, every: float = 5.0, labels: dict[str, str] | None = None,
                 verb: str = "sent"):
        import threading
        import time

        self.out, self.totals, self.every, self.verb = out, totals, every, verb
        self.sent = {name: 0 for name in totals}
        self._clock = time.monotonic
        self.started = self._last = self._clock()
        self._printed: dict | None = None
        self._lock = threading.Lock()
        self.bar = None
        if out is not None and not out.json_mode and out.console.is_terminal and totals:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn)

            self.bar = Progress(TextColumn("{task.description:<14}"), BarColumn(), TaskProgressColumn(),
                                DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeElapsedColumn(),
                                TimeRemainingColumn(), console=out.console, transient=False)
            self.tasks = {name: self.bar.add_task((labels or {}).get(name, name), total=total or None)
                          for name, total in totals.items()}
            self.bar.start()

    def update(self, name: str, sent: int) -> None:
        """``name`` has been sent ``sent`` bytes so far."""
        with self._lock:
            self._set(name, sent)

    def advance(self, name: str, nbytes: int) -> None:
        """``nbytes`` more for ``name`` (negative: bytes taken back, a resend)."""
        with self._lock:
            self._set(name, self.sent.get(name, 0) + nbytes)

    def _set(self, name: str, sent: int) -> None:
        if name not in self.sent:
            return
        self.sent[name] = sent
        if self.bar is not None:
            self.bar.update(self.tasks[name], completed=sent)
        else:
            self._line(final=False)

    def note(self, line: str) -> None:
        if self.out is not None and self.bar is None:
            self.out.console.print(line, soft_wrap=True, markup=False, highlight=False)

    def close(self) -> None:
        with self._lock:
            if self.bar is not None:
                self.bar.stop()
            else:
                self._line(final=True)

    def _line(self, *, final: bool) -> None:
        now = self._clock()
        if self.out is None or (not final and now - self._last < self.every) or self.sent == self._printed:
            return
        self._last, self._printed = now, dict(self.sent)
        from sparkctl.progress import describe

        known = [t for t in self.totals.values() if t]
        # done of total, percent, rate and time left (percent and ETA only when every total is known)
        overall = describe(sum(self.sent.values()), sum(known) if len(known) == len(self.totals) else None,
                           max(now - self.started, 1e-6))
        hosts = [f"{n} {size_text(b)}" + (f"/{size_text(self.totals[n])} ({100.0 * min(b, self.totals[n]) / self.totals[n]:.0f} %)"
                                          if self.totals[n] else "") for n, b in self.sent.items()]
        self.out.console.print(f"  {self.verb} {overall}: " + ", ".join(hosts), soft_wrap=True, markup=False, highlight=False)
