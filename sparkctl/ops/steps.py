"""Small remote steps several verbs share (serve, stop, status, logs, up): run one command and
check it, the profile's containers, stop-and-remove, a log tail."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

from sparkctl.commands.serve import Container, logs_argv, remove_argv, stop_argv
from sparkctl.commands import facts
from sparkctl.ops.ask import ask  # noqa: F401  (the one fact runner; imported from here by the verbs)

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
