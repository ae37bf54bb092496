"""A counting wrapper in every sandbox host's own /usr/local/bin, for the bench scripts that count what
the hosts run (bench/docker_calls.py: docker, bench/host_python_calls.py: python3).

Each host has its own /usr/local, so this machine's command is untouched. The wrapper appends one line a
call to a log beside it (world-writable: the hosts' login user runs it) and then runs the real command.
Only wrappers written here are removed on exit, also when writing a later one failed.
"""

from __future__ import annotations

from pathlib import Path


class HostWrappers:
    """``command`` replaced by ``script`` (which logs to ``/usr/local/bin/LOG_NAME``) on every host."""

    def __init__(self, bin_dirs: dict[str, str], command: str, script: str, log_name: str):
        self.bin_dirs, self.command, self.script, self.log_name = bin_dirs, command, script, log_name
        self.written: list[str] = []  # the folders whose wrapper is ours: only those are removed

    def __enter__(self):
        try:
            for folder in self.bin_dirs.values():
                wrapper = Path(folder) / self.command
                if wrapper.exists():
                    raise SystemExit(f"error: {wrapper} exists already: not replacing it")
                wrapper.write_text(self.script)
                self.written.append(folder)
                wrapper.chmod(0o755)
                self._log(folder).touch()
                self._log(folder).chmod(0o666)  # the hosts' login user appends to it
        except BaseException:
            self.__exit__()  # the wrappers already written do not outlive a failed start
            raise
        return self

    def __exit__(self, *exc) -> None:
        for folder in self.written:
            (Path(folder) / self.command).unlink(missing_ok=True)
            self._log(folder).unlink(missing_ok=True)
        self.written = []

    def _log(self, folder: str) -> Path:
        return Path(folder) / self.log_name

    def reset(self) -> None:
        for folder in self.bin_dirs.values():
            self._log(folder).write_text("")

    def lines(self) -> dict[str, list[str]]:
        """host -> the non-empty lines logged since the last reset."""
        return {host: [line for line in self._log(folder).read_text().splitlines() if line.strip()]
                for host, folder in self.bin_dirs.items()}
