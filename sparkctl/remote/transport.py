"""One transport: what every remote byte goes through, and the helpers written once on top of it.

A ``Transport`` runs an argv list on one host (joined with shlex.quote, never formatted by hand)
and streams bytes into or out of it. Three implementations:

- ``sparkctl.remote.connection.Connection``: paramiko, one SSH connection per host, kept for the
  run (``sparkctl.remote.pool``); every command and fact goes through it.
- ``sparkctl.remote.process.ProcessTransport``: a local process -- this machine itself
  (``local()``), or a host through the system ssh client (``over_openssh(route)``) for the bulk
  streams where it measured faster.
- ``sparkctl.remote.fake.FakeTransport``: recorded answers, for unit tests.

On top of any of them: ``put`` (a file's bytes to a path), ``temp_dir`` and ``ship_agent`` (a
zipped Python program copied into a temporary folder on the host and run with its python3: the
image relay of ``distribute --from`` and model sync's agent; removed with ``ShippedAgent.remove``).
The ssh argv lists themselves are built in ``sparkctl.remote.openssh`` only.
"""

from __future__ import annotations

import json
from typing import Callable, Iterable, Protocol, Sequence

from sparkctl.errors import OperationFailed
from sparkctl.remote.result import CommandResult, RemoteError


class Transport(Protocol):
    name: str

    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult: ...

    def run_stream_in(self, argv: Sequence[str], chunks: Iterable[bytes], *, timeout: float | None = None,
                      on_progress: Callable[[int], None] | None = None) -> CommandResult: ...

    def run_stream_out(self, argv: Sequence[str], sink: Callable[[bytes], None], *, timeout: float | None = None,
                       on_progress: Callable[[int], None] | None = None) -> CommandResult: ...

    def close(self) -> None: ...


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def put(transport: Transport, path: str, data: bytes, *, timeout: float = 120) -> None:
    """Write ``data`` to ``path`` on the host (created or replaced)."""
    written = transport.run(["sh", "-c", 'cat > "$1"', "sh", path], stdin=data, timeout=timeout)
    if written.exit_code != 0:
        raise OperationFailed(f"{transport.name}: could not write {path}: {last_line(written.stderr)}")


def temp_dir(transport: Transport, prefix: str) -> str:
    """A new private folder under /tmp on the host (``prefix`` names what it is for)."""
    made = transport.run(["mktemp", "-d", f"/tmp/{prefix}.XXXXXX"], timeout=60)
    if made.exit_code != 0:
        raise OperationFailed(f"{transport.name}: mktemp failed: {last_line(made.stderr)}")
    return made.stdout.strip()


def remove(transport: Transport, path: str, *, timeout: float = 60) -> None:
    """Best effort: a host that dropped us keeps a folder under /tmp, nothing worse."""
    try:
        transport.run(["rm", "-rf", "--", path], timeout=timeout)
    except RemoteError:
        pass


class ShippedAgent:
    """A zipped Python program in its own temporary folder on one host, run with the host's python3."""

    def __init__(self, transport: Transport, folder: str, name: str):
        self.transport, self.folder = transport, folder
        self.path = f"{folder}/{name}"

    def argv(self, args: Sequence[str]) -> list[str]:
        return ["python3", self.path, *args]

    def run(self, args: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        return self.transport.run(self.argv(args), stdin=stdin, timeout=timeout)

    def json(self, args: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None,
             purpose: str = "this step") -> dict:
        """Run it and read the last line it printed as JSON (its answer)."""
        result = self.run(args, stdin=stdin, timeout=timeout)
        if result.exit_code == 127:
            raise OperationFailed(f"python3 is needed on the host for {purpose}")
        if result.exit_code != 0:
            raise OperationFailed(f"agent {args[0]} failed (exit {result.exit_code}): {last_line(result.stderr)}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def stream_out(self, args: Sequence[str], sink: Callable[[bytes], None], **kwargs) -> CommandResult:
        return self.transport.run_stream_out(self.argv(args), sink, **kwargs)

    def put_beside(self, name: str, data: bytes) -> str:
        """Another file in the agent's folder (a spec too large for an argument); its path."""
        path = f"{self.folder}/{name}"
        put(self.transport, path, data, timeout=60)
        return path

    def remove(self) -> None:
        remove(self.transport, self.folder)


def ship_agent(transport: Transport, program: bytes, *, prefix: str, name: str = "agent.pyz") -> ShippedAgent:
    """Copy the zip application ``program`` to a new temporary folder on the host."""
    folder = temp_dir(transport, prefix)
    agent = ShippedAgent(transport, folder, name)
    try:
        put(transport, agent.path, program)
    except (OperationFailed, RemoteError):
        agent.remove()
        raise
    return agent
