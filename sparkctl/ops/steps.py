"""The step protocol and its one runner, and small remote steps several verbs share.

A ``Step`` looks, then acts: ``look(ctx)`` says what is already true or what it will do and why (a
``Look``: ``act`` and ``reason``), without changing anything; ``act(ctx, look)`` runs only when the
look said it must, and returns ``(status, reason)`` with status ``ok`` (already true), ``changed``,
``skipped`` (does not apply, saying why), or raises ``StepFailed`` (``failed``). ``ctx`` is the
run's context (``up``'s run, one host of ``setup``). ``StepRun`` is the one runner: it looks at
every step, acts in order, looks again after a step changed something, and reports every look,
start and end to the run's ``Reporter`` (``sparkctl/reporter.py``), whose record is the verb's
``--json`` steps. ``up`` and ``setup`` run their steps through it, and ``serve`` its stages.
Also here: run one command and check it, the profile's containers, stop-and-remove, a log tail."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Protocol, runtime_checkable

from sparkctl.commands import facts
from sparkctl.commands.serve import Container, logs_argv, remove_argv, stop_argv
from sparkctl.errors import SparkctlError
from sparkctl.ops.ask import ask  # noqa: F401  (the one fact runner; imported from here by the verbs)
from sparkctl.remote.result import RemoteError
from sparkctl.reporter import Reporter, StepRecord

# A step's statuses: "planned" is a look's verdict before anything runs.
OK, CHANGED, SKIPPED, FAILED, PLANNED = "ok", "changed", "skipped", "failed", "planned"


class StepFailed(Exception):
    """A step failed; its message is the step's reason."""


@dataclass
class Look:
    """What a step found before acting: already true (``act`` False), or what it will do and why."""

    act: bool
    reason: str
    detail: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        """The look as a plan's status: planned (it will act), skipped (does not apply) or ok."""
        return PLANNED if self.act else (SKIPPED if self.detail.get("skip") else OK)


@runtime_checkable
class ReportShape(Protocol):
    """The common shape of a verb's report, so a step can end with it: ``ok``, the ``--json``
    document, and ``outcome(...)`` -> ``(ok | changed, reason)`` or ``StepFailed`` (its arguments:
    what the report does not know, such as the host it was built on or why the step acted)."""

    @property
    def ok(self) -> bool: ...

    def to_json(self) -> dict: ...

    def outcome(self, *args) -> tuple[str, str]: ...


def step_error(err: Exception) -> str:
    """A step's failure as one line; errors no step can foresee (bugs) are raised, not reported."""
    if not isinstance(err, (StepFailed, SparkctlError, RemoteError, OSError, RuntimeError, ValueError)):
        raise err
    return " ".join(str(err).split()) or type(err).__name__


@dataclass
class Step:
    """One step: its name, how it looks and how it acts (see the module's docstring)."""

    name: str
    look: Callable[[Any], Look]
    act: Callable[[Any, Look], tuple[str, str]]
    gate: str = ""  # when it will act, the steps after it cannot look yet: they are planned with this reason
    # The earlier steps whose acts can change what this look sees (None: any of them): its look is
    # kept while only other steps changed something (up's Engram shards do not change with the image).
    sees: Optional[tuple[str, ...]] = None


class StepRun:
    """The one step runner: ``look`` at the steps (the plan), then ``act`` on them in order.

    Both take the names to work on (default: all), so a verb can run a first step before taking a
    lock and the rest under it. A step that fails stops the run (``keep_going``: only itself): the
    steps after it end ``skipped``, "not run: NAME failed". A step reuses its plan's look while no
    step before it changed anything, or none of those it ``sees`` (``relook`` False: always, the plan is
    what runs).

    With a ``host`` (one host's steps), a host that cannot be reached (``RemoteError``) fails every
    step not yet decided with that reason, and nothing more is tried there. ``raise_on``: errors
    that are the verb's, not a step's (sudo wanting a password), go up to the caller."""

    def __init__(self, steps: list[Step], ctx, reporter: Reporter, *, host: Optional[str] = None,
                 keep_going: bool = False, relook: bool = True, cannot_look: str = "cannot look: ",
                 raise_on: tuple[type, ...] = ()):
        self.steps, self.ctx, self.reporter, self.host, self.keep_going = steps, ctx, reporter, host, keep_going
        self.relook, self.cannot_look, self.raise_on = relook, cannot_look, raise_on
        self.looks: dict[str, Look] = {}
        self.look_seconds: dict[str, float] = {}
        self.status: dict[str, str] = {s.name: PLANNED for s in steps}
        self.reasons: dict[str, str] = {s.name: "" for s in steps}
        self.failed: Optional[str] = None  # the first step that failed
        self.lost: Optional[str] = None  # why the host cannot be reached (a host's run only)

    def _chosen(self, names) -> list[Step]:
        return [s for s in self.steps if names is None or s.name in names]

    def set(self, name: str, status: str, reason: str, seconds: Optional[float] = None, *, done: bool = False) -> None:
        """Record where step ``name`` stands: a look's verdict, or (``done``) how it ended."""
        self.status[name], self.reasons[name] = status, reason
        if done:
            self.reporter.done(name, status, reason, seconds or 0.0, self.host)
        else:
            self.reporter.looked(name, status, reason, self.host, seconds or 0.0)

    def _failure(self, err: Exception) -> str:
        """A step's error as its reason; the verb's own errors go up, and a lost host is remembered."""
        if isinstance(err, self.raise_on) and not isinstance(err, StepFailed):  # a StepFailed is always the step's
            raise err
        reason = step_error(err)
        if self.host is not None and isinstance(err, RemoteError):
            self.lost = reason
        return reason

    def _lose_host(self, done: bool) -> None:
        """The host went away: every step not yet decided fails with the reason."""
        for step in self.steps:
            if self.status[step.name] == PLANNED or not self.reasons[step.name]:
                self.set(step.name, FAILED, self.lost or "", done=done)

    def look(self, names=None) -> None:
        """Every chosen step's look, in order; nothing changes. A look that raises fails its step."""
        self.looks.clear()
        chosen = self._chosen(names)
        for index, step in enumerate(chosen):
            started = time.monotonic()
            try:
                look = self.looks[step.name] = step.look(self.ctx)
            except Exception as err:
                reason = self._failure(err)
                if self.lost is not None:
                    return self._lose_host(done=False)
                self.set(step.name, FAILED, f"{self.cannot_look}{reason}", time.monotonic() - started)
                if step.gate:
                    self._wait_for(step, chosen[index + 1:])
                    return
                continue
            self.look_seconds[step.name] = time.monotonic() - started
            self.set(step.name, look.status, look.reason, self.look_seconds[step.name])
            if step.gate and look.act:
                self._wait_for(step, chosen[index + 1:])
                return

    def _wait_for(self, gate: Step, later: list[Step]) -> None:
        for step in later:
            self.set(step.name, PLANNED, gate.gate)

    def act(self, names=None) -> None:
        """Each chosen step in order: its look (the plan's, or a new one), then its act when the look
        says it must. Stops at the first failure unless ``keep_going``."""
        for step in self._chosen(names):
            if self.lost is not None:
                return self._lose_host(done=True)
            if self.failed is not None and not self.keep_going:
                self.set(step.name, SKIPPED, f"not run: {self.failed} failed", done=True)
                continue
            if self.status[step.name] == FAILED:  # its look failed: it cannot act
                self.failed = self.failed or step.name
                continue
            started = time.monotonic() - self.look_seconds.pop(step.name, 0.0)  # the step's time: its look's too
            try:
                status, reason = self._one(step)
            except Exception as err:
                status, reason = FAILED, self._failure(err)
                if self.lost is not None:
                    return self._lose_host(done=True)
            self.set(step.name, status, reason, time.monotonic() - started, done=True)
            if status == FAILED:
                self.failed = self.failed or step.name
            if status == CHANGED and self.relook:
                self._forget_looks(step.name)  # what comes after may have changed too: look again

    def _forget_looks(self, changed: str) -> None:
        """Drop the looks that ``changed``'s act may have made wrong (every one but those of steps
        that say they see other steps only)."""
        sees = {s.name: s.sees for s in self.steps}
        for name in list(self.looks):
            if sees.get(name) is None or changed in sees[name]:
                del self.looks[name]

    def _one(self, step: Step) -> tuple[str, str]:
        look = self.looks.pop(step.name, None) or step.look(self.ctx)
        if not look.act:
            return look.status, look.reason
        self.reporter.started(step.name, self.host)
        return step.act(self.ctx, look)

    def records(self) -> list[StepRecord]:
        """The steps as reported (what the verb's document shows)."""
        return self.reporter.steps([s.name for s in self.steps], self.host)


def run_steps(steps: list[Step], ctx, reporter: Reporter, *, dry_run: bool = False, **how) -> StepRun:
    """Look at every step, then (unless ``dry_run``) act on them in order (``how``: StepRun's options)."""
    run = StepRun(steps, ctx, reporter, **how)
    run.look()
    if not dry_run:
        run.act()
    return run


STEP_TIMEOUT_S = 60  # one remote command (docker run/stop/inspect, a file write)

def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_result(result, what: str) -> None:
    """Raise ``RuntimeError("cannot WHAT: <last line of its output>")`` when the command failed."""
    if not result.ok:
        detail = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}").splitlines()
        raise RuntimeError(f"cannot {what}: {detail[-1] if detail else result.exit_code}")


def list_containers(conn, profile: str, name: str = "", *, fresh: bool = False) -> list[Container]:
    """The profile's containers (and any of that name); ``fresh``: asked again even in a run that keeps
    answers (a container changes by itself: a liveness look must never read an earlier look's answer)."""
    return ask(conn, facts.CONTAINERS, profile, name, fresh=fresh)


def stop_and_remove(conn, names: list[str], timeout_s: int) -> None:
    if not names:
        return
    conn.run(stop_argv(names, timeout_s), timeout=timeout_s + STEP_TIMEOUT_S)
    check_result(conn.run(remove_argv(names), timeout=STEP_TIMEOUT_S), f"remove {', '.join(names)}")


def tail_logs(conn, name: str, tail: int) -> str:
    result = conn.run(logs_argv(name, tail), timeout=STEP_TIMEOUT_S)
    return result.stdout if result.ok else (result.stdout + result.stderr).strip() or f"(docker logs exit {result.exit_code})"
