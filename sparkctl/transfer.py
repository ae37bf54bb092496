"""Bytes going to hosts (images, checkpoints, Engram shards), told to the run's reporter.

A ``Transfer`` counts each host's bytes (hosts report from their own threads) and tells the reporter
a ``progress`` event: ``started`` with each host's total, ``running`` as it goes, ``done`` at
``close``. How often: every change when the reporter draws bars (rich on a terminal), else at most
every ``every`` seconds (a line in a log, a JSON line). The reporter records the start and the end
and draws the rest (``sparkctl.reporter``); a ``note`` (a file done) is told only when there are
no bars, which already show it.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from sparkctl.reporter import DONE, PROGRESS, RUNNING, Event, HostBytes, Reporter


class Transfer:
    """One transfer's bytes per host. ``reporter`` None: counted and recorded only (a dry run's plan)."""

    def __init__(self, reporter: Optional[Reporter], totals: dict[str, Optional[int]], *, every: float = 5.0,
                 labels: Optional[dict[str, str]] = None, verb: str = "sent"):
        self.reporter = reporter if reporter is not None else Reporter()
        self.totals, self.every, self.verb, self.labels = totals, every, verb, labels or {}
        self.sent = {name: 0 for name in totals}
        self._clock = time.monotonic
        self.started = self._last = self._clock()
        self._told: Optional[dict] = None  # the bytes the last running event said
        self._lock = threading.Lock()
        self._tell("started")

    def update(self, name: str, sent: int) -> None:
        """``name`` has been sent ``sent`` bytes so far."""
        with self._lock:
            self._set(name, sent)

    def advance(self, name: str, nbytes: int) -> None:
        """``nbytes`` more for ``name`` (negative: bytes taken back, a resend)."""
        with self._lock:
            self._set(name, self.sent.get(name, 0) + nbytes)

    def note(self, line: str) -> None:
        if not self.reporter.live:
            self.reporter.note(line)

    def close(self) -> None:
        with self._lock:
            self._tell(DONE)

    def _set(self, name: str, sent: int) -> None:
        if name not in self.sent:
            return
        self.sent[name] = sent
        now = self._clock()
        if self.reporter.live or (now - self._last >= self.every and self.sent != self._told):
            self._last, self._told = now, dict(self.sent)
            self._tell(RUNNING)

    def _tell(self, status: str) -> None:
        hosts = tuple(HostBytes(name, self.sent[name], self.totals[name], self.labels.get(name, "")) for name in self.totals)
        self.reporter.emit(Event(PROGRESS, step=self.verb, status=status, seconds=self._clock() - self.started, hosts=hosts))
