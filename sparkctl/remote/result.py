"""What remote work returns: a command's result, a host's result, and the one remote error type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from sparkctl.errors import EXIT_FAILED, SparkctlError

T = TypeVar("T")

# Why a host could not be reached or used. Stable strings: JSON output and tests rely on them.
CAUSES = ("refused", "timeout", "auth", "hostkey-unknown", "hostkey-changed", "dns", "closed", "other")


@dataclass
class CommandResult:
    exit_code: int  # -1 when the remote side sent no exit status (killed by a signal)
    stdout: str  # decoded UTF-8 (invalid bytes replaced); "" when stdout was streamed to a sink
    stderr: str
    seconds: float
    bytes_sent: int = 0  # stdin bytes delivered to the remote command
    bytes_received: int = 0  # stdout bytes received (stderr is not counted)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class RemoteError(SparkctlError):
    """A host could not be reached, would not let us in, or dropped us. ``str()`` is one line."""

    exit_code = EXIT_FAILED

    def __init__(self, host: str, cause: str, detail: str):
        if cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}")
        self.host, self.cause = host, cause
        self.detail = " ".join(str(detail).split())  # one line, whatever the underlying error said
        super().__init__(f"{host}: {self.detail} [{cause}]")

    def __reduce__(self):  # keeps copy/pickle working despite the custom signature
        return (type(self), (self.host, self.cause, self.detail))


@dataclass
class HostResult(Generic[T]):
    name: str
    ok: bool
    value: T | None
    error: str | None  # one line; None when ok
    cause: str | None  # one of CAUSES for transport failures; None when ok or when the step itself raised
    seconds: float
