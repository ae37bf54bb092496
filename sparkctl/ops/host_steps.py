"""Each host's steps run by the one runner, on every host at once: a verb that works host by host.

A verb that does the same thing on many hosts (pack-engram's shards, model sync's copies, distribute's
loads) gives each
host its own ``StepRun`` (``ops/steps.py``) over the same steps, with the host's context, and runs
their looks, then their acts, on all hosts in parallel (``fan_out``, over the run's connections): every
look, start and end is told to the run's reporter under the host's name. A host whose connection
fails before its step could run fails the steps it had not decided with that reason (and its
cause: refused, timeout, ...), as a host lost in the middle of a step does; the other hosts go on.
The verb decides between the two phases (pack-engram writes nothing when one host cannot take it:
``stop`` ends the others' steps with why).

A host's context (any object) gets the host's connection as ``ctx.conn`` before each phase. Without
a pool the steps reach no host through the runner (what they need was read before, or is sent by
work the hosts share): the looks run in this thread in the hosts' order, the acts each in a thread of
its own. ``act(alongside=...)`` runs the work the acts share in this thread while they run, so an
interrupt stops it as it would any command (distribute's one stream: each host's act waits for its
host's end in it).
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from sparkctl.ops.steps import FAILED, PLANNED, SKIPPED, Step, StepRun
from sparkctl.remote.pool import fan_out, host_result
from sparkctl.reporter import Reporter


class HostSteps:
    """``steps`` on each host of ``contexts`` (host name -> its context), reached through ``targets``
    (host name -> SSH target) and the run's ``pool``; told to ``reporter``."""

    def __init__(self, steps: list[Step], contexts: dict, targets: dict, reporter: Reporter, *, pool,
                 max_workers: int = 16):
        self.targets, self.pool, self.max_workers = targets, pool, max_workers
        self.runs = {name: StepRun(steps, ctx, reporter, host=name, relook=False, cannot_look="")
                     for name, ctx in contexts.items()}
        self.causes: dict[str, Optional[str]] = {}  # host -> why its connection failed (a RemoteError's cause)

    def look(self, names: Optional[list[str]] = None) -> None:
        """Every host's looks at once (``names``: only these hosts)."""
        self._each(lambda run: run.look(), names, done=False)

    def act(self, names: Optional[list[str]] = None, *, alongside: Optional[Callable[[], None]] = None,
            release: Callable[[], None] = lambda: None) -> None:
        """Every host's acts at once, each as its look said (``names``: only these hosts). ``alongside``:
        the work they share, run in this thread meanwhile; whether it ends or raises (an interrupt too),
        ``release`` then lets every act still waiting for it end, and what it raised reaches the caller
        once every act has ended."""
        if alongside is None:
            return self._each(lambda run: run.act(), names, done=True)
        escaped: list[BaseException] = []  # an error no step foresaw, raised again here

        def acts() -> None:
            try:
                self._each(lambda run: run.act(), names, done=True)
            except BaseException as err:
                escaped.append(err)
        acting = threading.Thread(target=acts, name="sparkctl-acts", daemon=True)
        acting.start()
        try:
            alongside()
        finally:
            release()
            acting.join()
        if escaped:
            raise escaped[0]

    def _each(self, phase: Callable[[StepRun], None], names: Optional[list[str]], *, done: bool) -> None:
        chosen = [n for n in self.runs if names is None or n in names]
        reached: set[str] = set()

        def on_host(name: str, conn=None) -> None:
            run = self.runs[name]
            if conn is not None:
                run.ctx.conn = conn
            reached.add(name)
            phase(run)

        if self.pool is None:
            results = _unconnected(chosen, on_host, together=done)
        else:
            results = fan_out([self.targets[n] for n in chosen], lambda conn: on_host(conn.name, conn), pool=self.pool,
                              max_workers=self.max_workers)
        for result in results:
            if not result.ok:  # not connected, or an error no step foresaw: the host's open steps fail
                self.causes[result.name] = result.cause
                self._fail_open(self.runs[result.name], result.error, done, reached=result.name in reached)

    @staticmethod
    def _fail_open(run: StepRun, reason: str, done: bool, *, reached: bool) -> None:
        """Fail the steps this phase left open: all that did not fail when it never ran on the host,
        else those still undecided (an error escaped the runner in the middle)."""
        for step in run.steps:
            status = run.status[step.name]
            if status != FAILED and (not reached or status == PLANNED or not run.reasons[step.name]):
                run.set(step.name, FAILED, reason, done=done)
        run.failed = run.failed or run.steps[0].name

    def failed(self) -> list[str]:
        """The hosts where a step failed (looked or acted), in the hosts' order."""
        return [name for name, run in self.runs.items() if FAILED in run.status.values()]

    def status(self, host: str, step: str) -> tuple[str, str]:
        """(status, reason) of ``step`` on ``host`` as last told."""
        run = self.runs[host]
        return run.status[step], run.reasons[step]

    def fail(self, host: str, reason: str) -> None:
        """``host``'s steps fail with ``reason`` without reaching it (what the verb found before, such as
        an agent it could not copy there): no second connection to a host already known dead."""
        self._fail_open(self.runs[host], reason, False, reached=False)

    def end_failed(self) -> None:
        """Before acting: tell each step whose look failed as ended (a log draws ends, not looks); the
        hosts that go on act without them."""
        for run in self.runs.values():
            for step in run.steps:
                if run.status[step.name] == FAILED:
                    run.set(step.name, FAILED, run.reasons[step.name], done=True)

    def stop(self, reason: str) -> None:
        """End every host's steps before acting: a failed one ends failed, every other one ``skipped: reason``."""
        self.end_failed()
        for run in self.runs.values():
            for step in run.steps:
                if run.status[step.name] != FAILED:
                    run.set(step.name, SKIPPED, reason, done=True)


class HostDecisions:
    """Which hosts the work the acts share (``act(alongside=...)``) has decided: each host's act waits
    for its own host, not for the others; ``release`` (the act's ``release``) ends every wait."""

    def __init__(self, names):
        self._events = {name: threading.Event() for name in names}
        self._decided: set[str] = set()

    def decide(self, names) -> None:
        """These hosts' ends are known (the shared work ended them)."""
        for name in names:
            self._decided.add(name)
            self._events[name].set()

    def release(self) -> None:
        """No more is decided (the shared work ended, or stopped): every act still waiting goes on."""
        for event in self._events.values():
            event.set()

    def wait(self, name: str) -> bool:
        """Until ``name`` is decided or released; whether it was decided."""
        self._events[name].wait()
        return name in self._decided


def _unconnected(names: list[str], on_host: Callable[[str], None], *, together: bool) -> list:
    """Each host's phase without a connection, as a ``fan_out`` result: one after another in this
    thread, or (``together``) each in a thread of its own, all ended when this returns."""
    results: dict = {}

    def one(name: str) -> None:
        results[name] = host_result(name, lambda: on_host(name))
    if not together:
        for name in names:
            one(name)
        return [results[n] for n in names]
    threads = [threading.Thread(target=one, args=(n,), name=f"sparkctl-host-{n}", daemon=True) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[n] for n in names if n in results]
