"""The one reporter of a run's events: a step looked, started or done, a note, a warning.

Every verb that runs steps tells its progress here, and nowhere else: the reporter records each
event (so the verb's ``--json`` document is built from what was reported, not from a second
bookkeeping) and renders it as it comes, on stderr (stdout stays for the one result):

* ``rich``: on a terminal, a step's status in colour;
* ``plain``: a CI log or a pipe: ``== build`` when a step starts, ``build: changed: <reason>`` when
  it ends, notes as they are, one unwrapped line each (logs are grepped);
* ``json``: one JSON object a line, every event, looks included (``SPARKCTL_EVENTS=json``), for a
  program following a long ``up``.

A step's look is recorded but drawn only as JSON lines: the plan is shown once, as a table, by the
verb. The reporter is thread-safe (setup's hosts report from their own threads) and is a ``say``
callable: ``reporter("message")`` is a note, for the code that still takes one.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Callable, Optional

EVENTS_ENV = "SPARKCTL_EVENTS"  # rich | plain | json: how the events are drawn (default: rich on a terminal)
STYLES = ("rich", "plain", "json")

# Kinds of events
LOOKED, STARTED, DONE, NOTE, WARNING = "looked", "started", "done", "note", "warning"

_COLOURS = {"ok": "green", "changed": "yellow", "skipped": "dim", "failed": "bold red", "planned": "cyan"}


@dataclass(frozen=True)
class Event:
    kind: str  # looked | started | done | note | warning
    step: Optional[str] = None  # the step; for a note or a warning, the part of the run it is about (a replica)
    host: Optional[str] = None  # None: the step is the run's, not one host's
    status: Optional[str] = None  # ok | changed | skipped | failed | planned
    reason: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        doc = {"event": self.kind, "step": self.step, "host": self.host, "status": self.status, "reason": self.reason}
        if self.kind in (LOOKED, DONE):
            doc["seconds"] = round(self.seconds, 3)
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
    """Records every event and hands it to ``render`` (None: recorded only, a quiet run)."""

    def __init__(self, render: Optional[Callable[[Event], None]] = None):
        self.render = render
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)
            if self.render is not None:
                self.render(event)

    def looked(self, step: str, status: str, reason: str, host: Optional[str] = None, seconds: float = 0.0) -> None:
        self.emit(Event(LOOKED, step, host, status, reason, seconds))

    def started(self, step: str, host: Optional[str] = None) -> None:
        self.emit(Event(STARTED, step, host))

    def done(self, step: str, status: str, reason: str, seconds: float = 0.0, host: Optional[str] = None) -> None:
        self.emit(Event(DONE, step, host, status, reason, seconds))

    def note(self, message: str, about: Optional[str] = None) -> None:
        """A line of progress; ``about``: the part of the run it concerns (a replica), said before it."""
        self.emit(Event(NOTE, step=about, reason=message))

    def warning(self, message: str, about: Optional[str] = None) -> None:
        self.emit(Event(WARNING, step=about, reason=message))

    __call__ = note  # a Say: the code that takes a callable for its lines

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


def lines_to(say: Callable[[str], None]) -> Reporter:
    """A reporter whose events go to ``say`` as a log's lines: for a caller that still hands over a
    callable for its lines instead of its reporter."""

    def draw(event: Event) -> None:
        line = plain_line(event)
        if line is not None:
            say(line)

    return Reporter(draw)


def style_for(console) -> str:
    """The events' style: ``SPARKCTL_EVENTS`` when set to one of STYLES, else rich on a terminal, plain otherwise."""
    wanted = os.environ.get(EVENTS_ENV, "").strip().lower()
    if wanted in STYLES:
        return wanted
    return "rich" if console.is_terminal else "plain"


def console_renderer(console, style: str) -> Callable[[Event], None]:
    """Draw events on ``console`` (stderr) in ``style``."""
    if style == "json":
        return lambda e: console.print(json.dumps(e.to_json()), soft_wrap=True, markup=False, highlight=False)

    def draw(event: Event) -> None:
        line = plain_line(event) if style == "plain" else rich_line(event)
        if line is not None:
            console.print(line, soft_wrap=True, markup=style == "rich", highlight=False)

    return draw


def _who(event: Event) -> str:
    return f"{event.host}: {event.step}" if event.host else str(event.step)


def _about(event: Event) -> str:
    """A note's or warning's part of the run, as its line starts (``r1: ``), or nothing."""
    return f"{event.step}: " if event.step else ""


def plain_line(event: Event) -> Optional[str]:
    """The line a log gets for ``event`` (None: a look, which the verb's plan shows)."""
    if event.kind == STARTED:
        return f"== {_who(event)}"
    if event.kind == DONE:
        return f"{_who(event)}: {event.status}: {event.reason}"
    if event.kind == WARNING:
        return f"{_about(event)}warning: {event.reason}"
    if event.kind == NOTE:
        return _about(event) + event.reason
    return None


def rich_line(event: Event) -> Optional[str]:
    """The same, in rich markup (the event's words escaped: a reason may hold brackets)."""
    from rich.markup import escape

    if event.kind == STARTED:
        return f"[bold]== {escape(_who(event))}[/bold]"
    if event.kind == DONE:
        colour = _COLOURS.get(event.status or "", "")
        status = f"[{colour}]{event.status}[/{colour}]" if colour else escape(str(event.status))
        return f"{escape(_who(event))}: {status}: {escape(event.reason)} [dim]({event.seconds:.1f} s)[/dim]"
    if event.kind == WARNING:
        return f"{escape(_about(event))}[yellow]warning:[/yellow] {escape(event.reason)}"
    if event.kind == NOTE:
        return escape(_about(event) + event.reason)
    return None
