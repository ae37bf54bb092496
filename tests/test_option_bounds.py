"""Every number a verb takes is bounded where it is read: a count, a size or a timeout out of range is one line
naming the option, exit 2, before anything is asked of a host or written (bounded time, memory and disk,
whatever the input)."""

from __future__ import annotations

import typing

import pytest
import typer

# Options whose every value is meaningful, with why.
UNBOUNDED = {
    "--seed": "any integer is a seed (random.Random, the synthetic tensors' hash prefix)",
}


def _commands(command, path=()):
    """(path, command) of every command under a built typer command, groups included."""
    from typer._click import Context

    if hasattr(command, "list_commands"):
        context = Context(command, info_name=" ".join(path) or "sparkctl")
        for name in command.list_commands(context):
            yield from _commands(command.get_command(context, name), (*path, name))
    yield path, command


def _takes_a_number(annotation) -> bool:
    return annotation in (int, float) or any(_takes_a_number(arg) for arg in typing.get_args(annotation))


def _unbounded(app) -> list[str]:
    """Every option or argument of the app's commands that takes a number and lacks a min or a max: the commands
    as typer builds them, however an option was declared (a default, a shared constant, Annotated, a function returning one)."""
    from typer.main import get_command

    return [f"{' '.join(path)} {parameter.opts[0]}: min={parameter.min} max={parameter.max}"
            for path, command in _commands(get_command(app)) for parameter in command.params
            if _takes_a_number(getattr(getattr(parameter, "type_descriptor", None), "annotation", None))
            and (parameter.min is None or parameter.max is None) and parameter.opts[0] not in UNBOUNDED]


def test_every_numeric_option_has_a_lower_and_an_upper_bound():
    from sparkctl.cli.main import app, register_commands

    register_commands()
    assert _unbounded(app) == []


def test_the_scan_finds_an_option_without_bounds():
    app, group = typer.Typer(), typer.Typer()
    BOUNDED = typer.Option(None, "--wait", min=0, max=9)

    @app.command()
    def verb(tries: int = typer.Option(3, "--tries", min=1), wait: typing.Optional[float] = BOUNDED,
             name: str = typer.Option("x", "--name"), seed: int = typer.Option(0, "--seed"),
             context: typing.Annotated[typing.Optional[int], typer.Option("--context", max=10)] = None): ...

    @group.command()
    def inner(count: int = typer.Argument(2)): ...

    app.add_typer(group, name="group")
    assert sorted(_unbounded(app)) == ["group inner count: min=None max=None", "verb --context: min=None max=10",
                                       "verb --tries: min=1 max=None"]


@pytest.mark.parametrize("argv, option", [
    (["logs", "--profile", "tp4", "--tail", "-1"], "--tail"),
    (["serve", "--profile", "tp4", "--log-tail", "-1"], "--log-tail"),
    (["setup", "--dry-run", "--connect-timeout", "-5"], "--connect-timeout"),
    (["setup", "--dry-run", "--connect-timeout", "nan"], "--connect-timeout"),
    (["model", "sync", "--source", "/nonexistent", "--retries", "1000000"], "--retries"),
])
def test_a_number_out_of_range_is_refused_before_any_host_is_asked(cli, example_inventory, argv, option):
    result = cli("-i", example_inventory, *argv)  # the example inventory's hosts are never reached
    assert result.code == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in result.stderr, result
    assert "connect" not in result.stdout.lower(), result


@pytest.mark.parametrize("extra, said", [
    (["--vocab", "99999999999"], "--vocab"),  # each option's own bound
    (["--max-ngram", "100000"], "--max-ngram"),
    (["--vocab", "9999999", "--heads", "64"], "--vocab: the Engram tables would take over"),  # too big together
    # 1,024 tables over a vocabulary of 2: their rows are the first 1,024 primes above it, ~30 GiB at this head dim
    (["--vocab", "2", "--layers", "1", "--max-ngram", "2", "--heads", "1024", "--head-dim", "8192"], "GiB"),
    (["--max-ngram", "64", "--heads", "1024"], "--heads: 129024 Engram tables"),
    (["--layers", ",".join(str(i) for i in range(1000))], "Engram tables"),
    (["--layers", "1,1"], "--layers: layer ids must be"),  # two tensors under one name: the index can point at only one
    (["--layers", "-5"], "--layers: layer ids must be"),
    (["--layers", "99999999999999999999999"], "--layers: layer ids must be"),
    (["--layers", ","], "--layers: layer ids must be"),
])
def test_a_synthetic_checkpoint_too_big_to_be_one_is_refused_and_nothing_is_written(cli, tmp_path, extra, said):
    target = tmp_path / "ckpt"
    result = cli("sandbox", "make-checkpoint", str(target), *extra)
    assert result.code == 2, result
    assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result
    assert not target.exists()
