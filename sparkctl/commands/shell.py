"""Argv lists as shell text, for people and scripts: always built with shlex, never by hand."""

from __future__ import annotations

import re
import shlex

_OPTION = re.compile(r"^--?[A-Za-z]")


def option_groups(argv: list[str]) -> list[list[str]]:
    """Split an argv into the program words (everything before the first ``--option``, e.g.
    ``python3 -m sglang.launch_server``) and then one ``-o/--option [value]`` group per option."""
    first = next((i for i, token in enumerate(argv) if token.startswith("--")), len(argv))
    groups: list[list[str]] = [argv[:first]] if first else []
    for token in argv[first:]:
        if not groups or _OPTION.match(token):
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def multiline(groups: list[list[str]], indents: list[str] | None = None) -> str:
    """Groups joined by backslash-newline: any POSIX shell reads it back as the one command."""
    indents = indents or ["    "] * len(groups)
    lines = [shlex.join(groups[0])] + [indent + shlex.join(group) for indent, group in zip(indents[1:], groups[1:])]
    return " \\\n".join(lines)


def docker_run_script(docker_argv: list[str], image: str, command: list[str]) -> str:
    """``docker run`` one option per line, then the image, then the engine command indented under it."""
    options = docker_argv[: len(docker_argv) - len(command) - 1]
    if docker_argv[len(options):] != [image, *command]:
        raise ValueError("a docker run argv ends with the image and the command")
    head, engine = option_groups(options) + [[image]], option_groups(command)
    indents = ["    "] * len(head) + ["    "] + ["        "] * (len(engine) - 1)
    return multiline(head + engine, indents)
