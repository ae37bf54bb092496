"""User-facing errors: one line, a named field, a fixed exit code, never a traceback."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the operation or a check failed on at least one host
EXIT_USAGE = 2  # usage or configuration error


class SparkctlError(Exception):
    """An error the user can fix; the CLI prints ``str(err)`` alone and exits ``exit_code``."""

    exit_code = EXIT_USAGE


MAX_MESSAGE_CHARS = 400


def shorten_middle(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` at most ``limit`` characters: its start and end, and how much was left out between."""
    if len(text) <= limit:
        return text
    keep = limit - 40
    head, tail = text[: keep * 2 // 3], text[-(keep - keep * 2 // 3):]
    return f"{head} ... ({len(text) - len(head) - len(tail):,} characters left out) ... {tail}"


class ConfigError(SparkctlError):
    """Bad inventory, profile or image chain: names the file, the field path and the YAML line."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None, line: int | None = None):
        message = shorten_middle(message)  # a 250 KiB value must not become a 250 KiB error line
        self.file, self.field, self.line, self.detail = file, field, line, message
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        prefix = f"{field}: " if field else ""
        super().__init__(f"{where}{prefix}{message}")


class ConfigErrors(ConfigError):
    """Several problems in one file, each its own ConfigError (one line each when printed)."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = errors
        first = errors[0]
        super().__init__(first.detail, file=first.file, field=first.field, line=first.line)
        self.args = ("\n".join(str(e) for e in errors),)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def config_error(errors: list[ConfigError]) -> ConfigError:
    """One error as itself, several as a ConfigErrors."""
    return errors[0] if len(errors) == 1 else ConfigErrors(errors)


class OperationFailed(SparkctlError):
    """The work ran but failed somewhere (exit 1)."""

    exit_code = EXIT_FAILED
