"""One meaning per flag name, on every verb: the timeouts and the stop grace.

- ``--connect-timeout``: how long an SSH connection may take to open, per host;
- ``--health-timeout``: how long serve/up wait for the endpoint to become healthy;
- ``--request-timeout``: how long one HTTP request to the endpoint may take;
- ``--grace``: how long an engine gets to exit after SIGTERM before it is killed.

``--timeout`` used to mean each of these depending on the verb. It still works for one release
where it did (``LEGACY_SPELLINGS``): main rewrites it to the new name and says so on stderr, and
help no longer shows it.
"""

from __future__ import annotations

import typer

CONNECT_TIMEOUT_OPTION = typer.Option(10.0, "--connect-timeout", min=0.1, max=3600, help="SSH connect timeout per host, seconds.")
HEALTH_TIMEOUT_OPTION = typer.Option(
    None, "--health-timeout", min=1, max=86400, help="Seconds to wait for the endpoint (default: the profile's serving.health_timeout_s).")
GRACE_OPTION = typer.Option(30, "--grace", min=0, max=3600, help="Seconds each engine gets to exit after SIGTERM, then it is killed.")


def request_timeout_option(default: float) -> typer.Option:
    return typer.Option(default, "--request-timeout", min=1, max=3600, help="Seconds one request may take, stream included.")


# (command path) -> {old spelling: new spelling}; kept for one release after the rename.
LEGACY_SPELLINGS: dict[tuple[str, ...], dict[str, str]] = {
    ("doctor",): {"--timeout": "--connect-timeout"},
    ("model", "sync"): {"--timeout": "--connect-timeout"},
    ("pack-engram",): {"--timeout": "--connect-timeout"},
    ("serve",): {"--timeout": "--health-timeout"},
    ("up",): {"--timeout": "--health-timeout"},
    ("smoke",): {"--timeout": "--request-timeout"},
    ("stop",): {"--timeout": "--grace"},
}


def _command_path(argv: list[str], takes_value: tuple[str, ...]) -> tuple[tuple[str, ...], int]:
    """The leading command words of ``argv`` (after the global options) and where the rest starts."""
    words: list[str] = []
    i = 0
    while i < len(argv) and len(words) < 2:
        arg = argv[i]
        if arg == "--":
            break
        if arg.startswith("-"):
            i += 2 if arg in takes_value else 1
            continue
        if words and words[0] not in ("model", "inventory", "sandbox", "bench"):
            break
        words.append(arg)
        i += 1
    return tuple(words), i


def rewrite_legacy(argv: list[str], takes_value: tuple[str, ...], warn) -> list[str]:
    """``argv`` with each old spelling of this command replaced by its new name (``warn`` told once each)."""
    path, _ = _command_path(argv, takes_value)
    renames = LEGACY_SPELLINGS.get(path) or LEGACY_SPELLINGS.get(path[:1]) or {}
    if not renames:
        return argv
    out, told = [], set()
    for index, arg in enumerate(argv):
        if "--" in argv[:index]:
            out.append(arg)
            continue
        name, sep, value = arg.partition("=")
        if name in renames:
            if name not in told:
                warn(f"note: `{' '.join(path)} {name}` is now `{renames[name]}` (the old spelling goes in the next release)")
                told.add(name)
            arg = renames[name] + sep + value
        out.append(arg)
    return out
