"""The step protocol, and small remote steps several verbs share (serve, stop, status, logs, up).

A step looks, then acts: ``look`` says what is already true or what it will do and why (a
``Look``: ``act`` and ``reason``), without changing anything; ``act`` returns ``(status, reason)``
with status ``ok`` (already true), ``changed``, ``skipped`` (does not apply, saying why), or raises
``StepFailed`` (``failed``). ``up`` composes its steps this way, and a launcher or a replica
layout supplies its own look and act for the serve step (``ops/native_up.py``, ``ops/replica_up.py``).
Also here: run one command and check it, the profile's containers, stop-and-remove, a log tail."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from sparkctl.commands.serve import Container, logs_argv, remove_argv, stop_argv
from sparkctl.commands import facts
from sparkctl.ops.ask import ask  # noqa: F401  (the one fact runner; imported from here by the verbs)

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


def step_error(err: Exception) -> str:
    """A step's failure as one line; errors no step can foresee (bugs) are raised, not reported."""
    from sparkctl.errors import SparkctlError
    from sparkctl.remote.result import RemoteError

    if not isinstance(err, (StepFailed, SparkctlError, RemoteError, OSError, RuntimeError, ValueError)):
        raise err
    return " ".join(str(err).split()) or type(err).__name__


STEP_TIMEOUT_S = 60  # one remote command (docker run/stop/inspect, a file write)

Say = Callable[[str], None]


def quiet(_: str) -> None:
    pass


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_result(result, what: str) -> None:
    """Raise ``RuntimeError("cannot WHAT: <last line of its output>")`` when the command failed."""
    if not result.ok:
        detail = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}").splitlines()
        raise RuntimeError(f"cannot {what}: {detail[-1] if detail else result.exit_code}")


def list_containers(conn, profile: str, name: str = "") -> list[Container]:
    return ask(conn, facts.CONTAINERS, profile, name)


def stop_and_remove(conn, names: list[str], timeout_s: int) -> None:
    if not names:
        return
    conn.run(stop_argv(names, timeout_s), timeout=timeout_s + STEP_TIMEOUT_S)
    check_result(conn.run(remove_argv(names), timeout=STEP_TIMEOUT_S), f"remove {', '.join(names)}")


def tail_logs(conn, name: str, tail: int) -> str:
    result = conn.run(logs_argv(name, tail), timeout=STEP_TIMEOUT_S)
    return result.stdout if result.ok else (result.stdout + result.stderr).strip() or f"(docker logs exit {result.exit_code})"
