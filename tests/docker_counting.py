"""Opt-in: count every docker CLI process the test clusters' hosts start, and say who started it.

``SPARKCTL_TEST_DOCKER_CALLS=<folder>`` puts a counting ``docker`` in each host's /usr/local/bin
(bound over the host's own, before /usr/bin on its PATH) when tests/sandbox_fixture.py brings a
cluster up; when the cluster goes down, each host's log is copied into <folder> as
``<cluster>-<host>.log``. ``python bench/docker_calls.py --from-logs <folder>`` ranks the calls by
docker subcommand, by the sparkctl verb or test that made them and by the caller (a command run over
SSH, a shell script, or the test itself through ``exec_in_host``).

One tab-separated line per call: the time, what the test process was doing (its test and the CLI
call it made last, written into a file beside the wrapper), the parent's command line (who ran
docker), docker's own arguments. Only bash builtins, and the real docker is started under the name
``docker`` as before, so tests that look for ``docker load`` processes still find them.
Measurement only: it changes no outcome, and it is off unless the variable is set.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ENV = "SPARKCTL_TEST_DOCKER_CALLS"
LOG_NAME = ".docker-calls.log"
CONTEXT_NAME = ".docker-calls.context"
# Newlines and tabs in a script or in docker's arguments would split a record: both become spaces.
WRAPPER = f"""#!/bin/bash
context=; read -r context < /usr/local/bin/{CONTEXT_NAME} 2>/dev/null
caller=(); mapfile -d '' caller < /proc/$PPID/cmdline 2>/dev/null
caller="${{caller[*]}}"; caller="${{caller//[$'\\t\\n']/ }}"
args="$*"; args="${{args//[$'\\t\\n']/ }}"
printf '%s\\t%s\\t%s\\t%s\\n' "$EPOCHREALTIME" "$context" "${{caller:0:240}}" "${{args:0:400}}" >> /usr/local/bin/{LOG_NAME}
exec -a docker /usr/bin/docker "$@"
"""

_COUNTED: dict[str, list[str]] = {}  # cluster name -> its hosts' bin folders
_context = {"test": "", "cli": ""}


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def install(cluster_name: str, bin_dirs: list[str]) -> None:
    """The counting docker in every host's bin folder (a no-op unless ``ENV`` is set)."""
    if not enabled():
        return
    for folder in bin_dirs:
        wrapper = Path(folder) / "docker"
        if wrapper.exists():
            raise RuntimeError(f"{wrapper} exists already: not replacing it")
        for name, mode in ((LOG_NAME, 0o666), (CONTEXT_NAME, 0o644)):  # the hosts' login user appends to the log
            path = Path(folder) / name
            path.write_text("")
            path.chmod(mode)
        wrapper.write_text(WRAPPER)
        wrapper.chmod(0o755)
    _COUNTED[cluster_name] = list(bin_dirs)
    _write_context()


def collect(cluster_name: str) -> None:
    """Copy a counted cluster's logs into the folder ``ENV`` names (before the cluster goes)."""
    bin_dirs = _COUNTED.pop(cluster_name, None)
    if not bin_dirs:
        return
    target = Path(os.environ[ENV])
    target.mkdir(parents=True, exist_ok=True)
    for folder in bin_dirs:
        log = Path(folder) / LOG_NAME
        if log.exists():
            host = Path(folder).parent.name
            shutil.copyfile(log, target / f"{cluster_name}-{host}.log")


def on_test(nodeid: str) -> None:
    _context.update(test=nodeid, cli="")
    _write_context()


def on_cli(args: tuple[str, ...]) -> None:
    # The verb and its first arguments: enough to tell `status --json` from `stop --dry-run`.
    words = [a for a in args if not a.startswith("/")]  # inventory and profile paths say nothing
    _context["cli"] = " ".join(words[:6])
    _write_context()


def _write_context() -> None:
    line = f"{_context['test']} :: {_context['cli']}".replace("\t", " ").replace("\n", " ")
    for bin_dirs in _COUNTED.values():
        for folder in bin_dirs:
            try:
                (Path(folder) / CONTEXT_NAME).write_text(line + "\n")
            except OSError:  # a host whose folder is gone already (a test removed its own cluster)
                pass
