"""Helpers shared by the render tests (imported by the other test_render_*.py files): run
`sparkctl render`, and read engine argv as the engines would. The tests at the end check the
helpers themselves, since every other render test leans on them.

The argv reader here is written from the engine flags files alone (not from sparkctl's own
validator), so the tests check the rendered commands independently of the code that built them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import clirun
from clirun import CliResult

# Not imported from conftest: with tests/sandbox/conftest.py also present, "conftest" may name
# either module depending on collection order.
REPO = Path(__file__).resolve().parent.parent

INVENTORY = str(REPO / "inventory.example.yaml")
FLAGS_DIR = REPO / "sparkctl" / "engine_flags"
# Keep a user's own $SPARKCTL_RECIPES from shadowing the shipped profiles.
CLEAN_ENV = {"SPARKCTL_RECIPES": ""}


def run_cli(*args: str, cwd: str | Path | None = None, env: dict | None = None) -> CliResult:
    """The real entry point, as a user runs it: ``python -m sparkctl ARGS``."""
    return clirun.run_cli(*args, cwd=cwd, env={**CLEAN_ENV, **(env or {})}, timeout=120)


def render(*args: str, inventory: str = INVENTORY, env: dict | None = None, cwd: str | Path | None = None) -> CliResult:
    return run_cli("-i", inventory, "render", *args, env=env, cwd=cwd)


def render_json(*args: str, **kwargs) -> dict:
    result = render(*args, "--json", **kwargs)
    assert result.code == 0, result
    return result.json()


def engine_flags(engine: str, version: str) -> dict:
    return json.loads((FLAGS_DIR / f"{engine}-{version}.json").read_text())


def parsers(engine: str, version: str) -> dict:
    return json.loads((FLAGS_DIR / "parsers.json").read_text())[f"{engine}-{version}"]


def split_engine_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(program words, options) of a vllm serve / sglang launch_server argv; a Ray head's
    ``bash -c "ray start ... && exec vllm serve ..."`` is unwrapped to its vllm serve part."""
    if argv[:2] == ["bash", "-c"]:
        argv = shlex.split(argv[2].split(" && exec ", 1)[1])
    if argv[:2] == ["vllm", "serve"]:
        return argv[:3], argv[3:]
    if argv[:3] == ["python3", "-m", "sglang.launch_server"]:
        return argv[:3], argv[3:]
    raise AssertionError(f"not an engine command: {argv}")


def parse_options(options: list[str], flags: dict) -> dict[str, object]:
    """``--flag value`` pairs and bare switches, read with the engine's own takes_value table.
    Fails on anything the engine's parser would refuse (unknown option, missing value, repeats)."""
    parsed: dict[str, object] = {}
    i = 0
    while i < len(options):
        flag = options[i]
        assert flag in flags, f"{flag!r} is not an option of this engine version"
        assert flag not in parsed, f"{flag} given twice"
        if flags[flag]["takes_value"]:
            assert i + 1 < len(options), f"{flag} has no value"
            value = options[i + 1]
            if flags[flag]["choices"]:
                assert value in flags[flag]["choices"], f"{flag} {value!r} not in {flags[flag]['choices']}"
            parsed[flag] = value
            i += 2
        else:
            parsed[flag] = True
            i += 1
    return parsed


def docker_options(docker_argv: list[str], engine_argv: list[str]) -> list[tuple[str, str]]:
    """The ``docker run`` options as (option, value) pairs ('-d' has no value), image excluded."""
    assert docker_argv[:2] == ["docker", "run"]
    assert docker_argv[len(docker_argv) - len(engine_argv):] == engine_argv
    head = docker_argv[2 : len(docker_argv) - len(engine_argv) - 1]
    pairs, i = [], 0
    while i < len(head):
        if head[i] == "-d":
            pairs.append(("-d", ""))
            i += 1
        else:
            pairs.append((head[i], head[i + 1]))
            i += 2
    return pairs


def image_of(docker_argv: list[str], engine_argv: list[str]) -> str:
    return docker_argv[len(docker_argv) - len(engine_argv) - 1]


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- the helpers' own tests -------------------------------------------------------------------

import pytest  # noqa: E402


def test_parse_options_reads_values_and_switches():
    flags = engine_flags("vllm", "0.33.0")
    parsed = parse_options(["--max-model-len", "300000", "--enable-auto-tool-choice", "--convert", "auto"], flags)
    assert parsed == {"--max-model-len": "300000", "--enable-auto-tool-choice": True, "--convert": "auto"}


@pytest.mark.parametrize(
    "options",
    [["--no-such-option", "1"], ["--max-model-len"], ["--convert", "bogus"], ["--port", "1", "--port", "2"], ["--tp", "4"]],
)
def test_parse_options_refuses_what_the_engine_would(options):
    with pytest.raises(AssertionError):
        parse_options(options, engine_flags("vllm", "0.33.0"))


def test_split_engine_argv_unwraps_a_ray_head():
    argv = ["bash", "-c", "ray start --head --port=6379 && exec vllm serve /model --port 8000"]
    assert split_engine_argv(argv) == (["vllm", "serve", "/model"], ["--port", "8000"])
