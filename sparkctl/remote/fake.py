"""A transport with recorded answers, for unit tests: no host, no process, no network.

``FakeTransport(name, answers)`` answers an argv with the first rule whose key is a prefix of it
(a tuple of leading elements) or which a callable accepts; ``calls`` records every argv with the
bytes it was given on stdin. An argv no rule answers fails loudly (a test must say what a host
answers), and ``unreachable=cause`` makes every call raise ``RemoteError`` as a dead host would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from sparkctl.remote.result import CommandResult, RemoteError


@dataclass
class Answer:
    exit_code: int = 0
    stdout: str | bytes = ""
    stderr: str = ""


@dataclass
class Call:
    argv: list[str]
    stdin: bytes | None = None


@dataclass
class FakeTransport:
    name: str
    answers: dict = field(default_factory=dict)  # tuple prefix (or callable(argv) -> bool) -> Answer
    unreachable: str | None = None  # a RemoteError cause: the host cannot be reached at all
    calls: list[Call] = field(default_factory=list)
    closed: bool = False
    memo: dict = field(default_factory=dict)  # the fact runner's kept answers, as a Connection's
    changes: int = 0  # commands run that may have changed the host (not facts), as a Connection's

    def connect(self) -> "FakeTransport":
        if self.unreachable:
            raise RemoteError(self.name, self.unreachable, "as recorded")
        return self

    def _answer(self, argv: Sequence[str], stdin: bytes | None) -> Answer:
        self.connect()
        argv = list(argv)
        self.calls.append(Call(argv, stdin))
        for rule, answer in self.answers.items():
            matched = rule(argv) if callable(rule) else tuple(argv[:len(rule)]) == tuple(rule)
            if matched:
                return answer(argv, stdin) if callable(answer) else answer
        raise AssertionError(f"{self.name}: no recorded answer for {argv!r}")

    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None,
            reads_only: bool = False) -> CommandResult:
        if not reads_only:
            self.changes += 1
        answer = self._answer(argv, stdin)
        out = answer.stdout.decode("utf-8", "replace") if isinstance(answer.stdout, bytes) else answer.stdout
        return CommandResult(answer.exit_code, out, answer.stderr, 0.0, bytes_sent=len(stdin or b""))

    def run_stream_in(self, argv: Sequence[str], chunks: Iterable[bytes], *, timeout: float | None = None,
                      on_progress: Callable[[int], None] | None = None) -> CommandResult:
        data, sent = [], 0
        for chunk in chunks:
            data.append(bytes(chunk))
            sent += len(chunk)
            if on_progress is not None:
                on_progress(sent)
        return self.run(argv, stdin=b"".join(data))

    def run_stream_out(self, argv: Sequence[str], sink: Callable[[bytes], None], *, timeout: float | None = None,
                       on_progress: Callable[[int], None] | None = None) -> CommandResult:
        self.changes += 1
        answer = self._answer(argv, None)
        body = answer.stdout.encode() if isinstance(answer.stdout, str) else answer.stdout
        if body:
            sink(body)
            if on_progress is not None:
                on_progress(len(body))
        return CommandResult(answer.exit_code, "", answer.stderr, 0.0, bytes_received=len(body))

    def close(self) -> None:
        self.closed = True

    def ran(self, *prefix: str) -> list[Call]:
        """The calls whose argv starts with ``prefix``."""
        return [c for c in self.calls if tuple(c.argv[:len(prefix)]) == prefix]
