"""The one reporter of a run's events: a step looked, started or done, a note, a warning, bytes sent.

Every verb that runs steps tells its progress here, and nowhere else: the reporter records each
event (so the verb's ``--json`` document is built from what was reported, not from a second
bookkeeping) and renders it as it comes, on stderr (stdout stays for the one result):

* ``rich``: on a terminal, a step's status in colour, a transfer's bytes as a bar per host;
* ``plain``: a CI log or a pipe: ``== build`` when a step starts, ``build: changed: <reason>`` when
  it ends, notes as they are, a transfer's total, rate and hosts every few seconds, one unwrapped
  line each (logs are grepped);
* ``json``: one JSON object a line, every event, looks included (``SPARKCTL_EVENTS=json``), for a
  program following a long ``up``.

A step's look is recorded but drawn only as JSON lines: the plan is shown once, as a table, by the
verb. A transfer's progress (``sparkctl.transfer.Transfer``: images, checkpoints, Engram shards) is
recorded when it starts and ends; what it sends meanwhile is drawn, never kept (a 500 GB checkpoint
would pile up events). The reporter is thread-safe (setup's hosts report from their own threads).
An operation takes the run's reporter, never a callable for its lines.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from rich.markup import escape

EVENTS_ENV = "SPARKCTL_EVENTS"  # rich | plain | json: how the events are drawn (default: rich on a terminal)
STYLES = ("rich", "plain", "json")

# Kinds of events
LOOKED, STARTED, DONE, NOTE, WARNING, PROGRESS = "looked", "started", "done", "note", "warning", "progress"
RUNNING = "running"  # a progress event between its "started" and its "done": drawn, not recorded
WAITING = "waiting"  # an endpoint asked again (status waiting | ok), drawn, not recorded; "done" ends the wait
WAIT_LINE_EVERY_S = 15.0  # a log's line about a wait: one every this many seconds

_COLOURS = {"ok": "green", "changed": "yellow", "skipped": "dim", "failed": "bold red", "planned": "cyan"}


@dataclass(frozen=True)
class HostBytes:
    """One host's part of a transfer: bytes so far, of ``total`` (None: not known ahead)."""

    host: str
    sent: int
    total: Optional[int] = None
    label: str = ""  # what its bar is called (default: the host)

    def to_json(self) -> dict:
        return {"host": self.host, "bytes": self.sent, "total": self.total}


@dataclass(frozen=True)
class Event:
    kind: str  # looked | started | done | note | warning | progress | waiting
    step: Optional[str] = None  # the step; for a note or a warning, the part of the run it is about (a replica)
    host: Optional[str] = None  # None: the step is the run's, not one host's
    status: Optional[str] = None  # ok | changed | skipped | failed | planned; progress: started | running | done
    reason: str = ""
    seconds: float = 0.0  # a progress event: since the transfer started
    hosts: tuple[HostBytes, ...] = ()  # a progress event: each host's bytes (its step: what is done to them, "sent")

    def to_json(self) -> dict:
        doc = {"event": self.kind, "step": self.step, "host": self.host, "status": self.status, "reason": self.reason}
        if self.kind in (LOOKED, DONE, PROGRESS, WAITING):
            doc["seconds"] = round(self.seconds, 3)
        if self.kind == PROGRESS:
            doc["hosts"] = [h.to_json() for h in self.hosts]
            del doc["reason"]
        return {k: v for k, v in doc.items() if v is not None}


@dataclass
class StepRecord:
    """Where one step stands: the last thing reported of it (its look, or how it ended)."""

    name: str
    status: str = "planned"
    reason: str = ""
    seconds: float = 0.0
    host: Optional[str] = None

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "reason": self.reason, "seconds": round(self.seconds, 3)}


class Reporter:
    """Records every event and hands it to ``render`` (None: recorded only, a quiet run).

    ``live``: the renderer draws a transfer as it goes (bars on a terminal), so a transfer tells it
    every change; otherwise a transfer tells it every few seconds (``sparkctl.transfer``)."""

    def __init__(self, render: Optional[Callable[[Event], None]] = None):
        self.render = render
        self.live = bool(getattr(render, "live", False))
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        with self._lock:
            if not ((event.kind == PROGRESS and event.status == RUNNING) or (event.kind == WAITING and event.status != DONE)):
                self.events.append(event)
            if self.render is not None:
                self.render(event)

    def looked(self, step: str, status: str, reason: str, host: Optional[str] = None, seconds: float = 0.0) -> None:
        self.emit(Event(LOOKED, step, host, status, reason, seconds))

    def started(self, step: str, host: Optional[str] = None, reason: str = "") -> None:
        """``step`` begins; ``reason``: what it is about to do (a bench level's size), said after its name."""
        self.emit(Event(STARTED, step, host, reason=reason))

    def done(self, step: str, status: str, reason: str, seconds: float = 0.0, host: Optional[str] = None) -> None:
        self.emit(Event(DONE, step, host, status, reason, seconds))

    def note(self, message: str, about: Optional[str] = None) -> None:
        """A line of progress; ``about``: the part of the run it concerns (a replica), said before it."""
        self.emit(Event(NOTE, step=about, reason=message))

    def warning(self, message: str, about: Optional[str] = None) -> None:
        self.emit(Event(WARNING, step=about, reason=message))

    def waiting(self, what: str, detail: str, seconds: float, ok: bool = False) -> None:
        """``what`` (an endpoint) was asked again, ``seconds`` into the wait: ``detail`` is its answer."""
        self.emit(Event(WAITING, step=what, status="ok" if ok else WAITING, reason=detail, seconds=seconds))

    def waited(self, what: str) -> None:
        """The wait for ``what`` is over (a live line comes down)."""
        self.emit(Event(WAITING, step=what, status=DONE))

    def steps(self, names: Optional[list[str]] = None, host: Optional[str] = None) -> list[StepRecord]:
        """Each step of ``host`` as last reported, in ``names``' order (default: as first reported);
        a name never reported stands ``planned`` with no reason."""
        with self._lock:
            events = [e for e in self.events if e.kind in (LOOKED, DONE) and e.host == host]
        found: dict[str, StepRecord] = {}
        for e in events:
            found[e.step] = StepRecord(e.step, e.status, e.reason, e.seconds, host)
        order = names if names is not None else list(found)
        return [found.get(name) or StepRecord(name, host=host) for name in order]


def style_for(console) -> str:
    """The events' style: ``SPARKCTL_EVENTS`` when set to one of STYLES, else rich on a terminal, plain otherwise."""
    wanted = os.environ.get(EVENTS_ENV, "").strip().lower()
    if wanted in STYLES:
        return wanted
    return "rich" if console.is_terminal else "plain"


class ConsoleRenderer:
    """Draws events on ``console`` (stderr) in ``style``; with ``bars`` (and rich on a terminal) a
    transfer as a bar per host, else as a line every few seconds (one that says nothing new is left out)."""

    def __init__(self, console, style: str, bars: bool = True):
        self.console, self.style = console, style
        self.live = bars and style == "rich" and console.is_terminal
        self._bars = None  # (rich Progress, {host: task}) of the transfer being drawn
        self._drawn: dict[Optional[str], tuple] = {}  # per transfer: the bytes its last line said
        self._waits: dict[Optional[str], float] = {}  # per wait: when its next line in a log is due
        self._spinner = None  # a wait's live line on a terminal

    def __call__(self, event: Event) -> None:
        if self.style == "json":
            self.console.print(json.dumps(event.to_json()), soft_wrap=True, markup=False, highlight=False)
        elif event.kind == PROGRESS:
            self._bar(event) if self.live else self._progress_line(event)
        elif event.kind == WAITING:
            self._wait(event)
        else:
            line = plain_line(event) if self.style == "plain" else rich_line(event)
            if line is not None:
                self.console.print(line, soft_wrap=True, markup=self.style == "rich", highlight=False)

    def _progress_line(self, event: Event) -> None:
        if event.status == "started":
            return
        said = tuple((h.host, h.sent) for h in event.hosts)
        last = self._drawn.pop(event.step, None) if event.status == DONE else self._drawn.get(event.step)
        if last == said:
            return
        if event.status != DONE:
            self._drawn[event.step] = said
        self.console.print(progress_line(event), soft_wrap=True, markup=False, highlight=False)

    def _bar(self, event: Event) -> None:
        if event.status == "started" and event.hosts:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn)

            self._stop_bars()
            bars = Progress(TextColumn("{task.description:<14}"), BarColumn(), TaskProgressColumn(),
                            DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeElapsedColumn(),
                            TimeRemainingColumn(), console=self.console, transient=False)
            self._bars = (bars, {h.host: bars.add_task(h.label or h.host, total=h.total or None) for h in event.hosts})
            bars.start()
            return
        if self._bars is not None:
            bars, tasks = self._bars
            for h in event.hosts:
                if h.host in tasks:
                    bars.update(tasks[h.host], completed=h.sent)
        if event.status == DONE:
            self._stop_bars()

    def _wait(self, event: Event) -> None:
        """A live line on a terminal (rich); in a log a line every WAIT_LINE_EVERY_S while not answered."""
        if event.status == DONE:
            self._waits.pop(event.step, None)
            if self._spinner is not None:
                self._spinner.stop()
                self._spinner = None
            return
        text = f"waiting for {event.step}: {event.reason} ({event.seconds:.0f} s)"
        if self.style == "rich" and self.console.is_terminal:
            from rich.markup import escape

            if self._spinner is None:
                self._spinner = self.console.status(escape(text))
                self._spinner.start()
            else:
                self._spinner.update(escape(text))
        elif event.seconds >= self._waits.get(event.step, WAIT_LINE_EVERY_S) and event.status != "ok":
            self.console.print(text, soft_wrap=True, markup=False, highlight=False)
            self._waits[event.step] = event.seconds + WAIT_LINE_EVERY_S

    def _stop_bars(self) -> None:
        if self._bars is not None:
            self._bars[0].stop()
            self._bars = None


def console_renderer(console, style: str, bars: bool = True) -> ConsoleRenderer:
    """Draw events on ``console`` (stderr) in ``style`` (``bars``: a transfer as bars when on a terminal)."""
    return ConsoleRenderer(console, style, bars)


def progress_line(event: Event) -> str:
    """A transfer's line in a log: ``  sent 5.0 MiB of 8.0 MiB (62.5 %), 1.2 MiB/s, ETA 3s: a 2.0 MiB/4.0 MiB (50 %), ...``."""
    from sparkctl.progress import describe, size

    totals = [h.total for h in event.hosts]
    # done of total, percent, rate and time left (percent and ETA only when every total is known)
    overall = describe(sum(h.sent for h in event.hosts), sum(totals) if all(totals) else None, max(event.seconds, 1e-6))
    hosts = [f"{h.host} {size(h.sent)}" + (f"/{size(h.total)} ({100.0 * min(h.sent, h.total) / h.total:.0f} %)"
                                          if h.total else "") for h in event.hosts]
    return f"  {event.step} {overall}: " + ", ".join(hosts)


def _who(event: Event) -> str:
    return f"{event.host}: {event.step}" if event.host else str(event.step)


def _about(event: Event) -> str:
    """A note's or warning's part of the run, as its line starts (``r1: ``), or nothing."""
    return f"{event.step}: " if event.step else ""


def plain_line(event: Event) -> Optional[str]:
    """The line a log gets for ``event`` (None: a look, which the verb's plan shows)."""
    if event.kind == STARTED:
        return f"== {_who(event)}" + (f": {event.reason}" if event.reason else "")
    if event.kind == DONE:
        return f"{_who(event)}: {event.status}: {event.reason}"
    if event.kind == WARNING:
        return f"{_about(event)}warning: {event.reason}"
    if event.kind == NOTE:
        return _about(event) + event.reason
    return None


def rich_line(event: Event) -> Optional[str]:
    """The same, in rich markup (the event's words escaped: a reason may hold brackets)."""
    if event.kind == STARTED:
        return f"[bold]== {escape(_who(event))}[/bold]" + (f": {escape(event.reason)}" if event.reason else "")
    if event.kind == DONE:
        colour = _COLOURS.get(event.status or "", "")
        status = f"[{colour}]{event.status}[/{colour}]" if colour else escape(str(event.status))
        return f"{escape(_who(event))}: {status}: {escape(event.reason)} [dim]({event.seconds:.1f} s)[/dim]"
    if event.kind == WARNING:
        return f"{escape(_about(event))}[yellow]warning:[/yellow] {escape(event.reason)}"
    if event.kind == NOTE:
        return escape(_about(event) + event.reason)
    return None
