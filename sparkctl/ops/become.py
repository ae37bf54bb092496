"""Root on a host, only through sudo.

Without a password every root command is ``sudo -n`` (never a prompt: a sudo that wants a password
fails at once). With one (``--ask-become-pass``, read once from the terminal), it goes to sudo on
stdin, never in argv, the environment, a file or the ``-v`` echo (which shows the command only).
"""

from __future__ import annotations

from sparkctl.commands import setup as cmds
from sparkctl.errors import EXIT_FAILED, SparkctlError

ROOT_TIMEOUT_S = 120  # netplan apply, a docker restart


class NeedsPassword(SparkctlError):
    """sudo on ``host`` wants a password and none was given."""

    def __init__(self, host: str):
        super().__init__(f"{host}: sudo asks for a password; run again with --ask-become-pass")
        self.host = host
        self.exit_code = EXIT_FAILED


class Become:
    def __init__(self, password: str | None = None):
        self._password = password

    @property
    def has_password(self) -> bool:
        return self._password is not None

    def check(self, conn, host: str) -> None:
        """Raise NeedsPassword when sudo on ``host`` cannot run without one and none was given."""
        if self.has_password:
            return
        result = conn.run(cmds.SUDO_PROBE, timeout=30)
        if result.exit_code != 0 and cmds.sudo_wants_password(result.stderr):
            raise NeedsPassword(host)

    def run(self, conn, host: str, argv: list[str], timeout: float = ROOT_TIMEOUT_S):
        """Run ``argv`` as root on ``conn``; the result as ``conn.run`` gives it."""
        wrapped = cmds.sudo_argv(argv, with_password=self.has_password)
        stdin = (self._password + "\n").encode() if self._password is not None else None
        result = conn.run(wrapped, timeout=timeout, stdin=stdin)
        if result.exit_code != 0 and not self.has_password and cmds.sudo_wants_password(result.stderr):
            raise NeedsPassword(host)
        return result

    def __repr__(self) -> str:  # never the password, whatever prints this object
        return f"Become(password={'given' if self.has_password else 'none'})"
