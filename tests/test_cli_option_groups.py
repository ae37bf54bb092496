"""Option groups (sparkctl.cli.option_groups): a verb that takes a group parses and shows the
group's options exactly where the group stands, and receives the group built from them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from clirun import run_cli
from sparkctl.cli.option_groups import GROUP, with_option_groups


@dataclass
class Pair:
    first: Optional[str] = typer.Option(None, "--first", help="The first of the pair.")
    second: list[str] = typer.Option([], "--second", help="Repeatable.")


def _app(received: dict) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @with_option_groups
    def verb(before: bool = typer.Option(False, "--before"), pair: Pair = GROUP,
             after: int = typer.Option(3, "--after")) -> None:
        received.update(before=before, pair=pair, after=after)

    return app


def test_the_verb_gets_the_group_built_from_its_options():
    received: dict = {}
    result = CliRunner().invoke(_app(received), ["--second", "b", "--first", "a", "--second", "c", "--after", "5"])
    assert result.exit_code == 0, result.output
    assert received == {"before": False, "pair": Pair(first="a", second=["b", "c"]), "after": 5}
    received.clear()
    assert CliRunner().invoke(_app(received), []).exit_code == 0
    assert received["pair"] == Pair(first=None, second=[])


def test_the_groups_options_stand_in_its_place_in_help():
    result = CliRunner().invoke(_app({}), ["--help"], terminal_width=200)
    text = result.output
    assert [text.index(flag) for flag in ("--before", "--first", "--second", "--after")] == sorted(
        text.index(flag) for flag in ("--before", "--first", "--second", "--after"))
    assert "The first of the pair." in text


def test_a_field_named_like_another_parameter_is_refused():
    def verb(first: bool = typer.Option(False, "--x"), pair: Pair = GROUP) -> None:
        pass

    with pytest.raises(TypeError, match="option group"):
        with_option_groups(verb)


DEPLOYMENT = ["--profile", "--hosts", "--set", "--env"]
IMAGE = ["--profile", "--image", "--variant"]
LOOKUP = ["--set", "--env", "--connect-timeout"]


@pytest.mark.parametrize("verb, group, before", [
    (["serve"], DEPLOYMENT, None), (["status"], DEPLOYMENT, None), (["build"], IMAGE, None),
    (["distribute"], IMAGE, None), (["bench"], LOOKUP, "--model"), (["top"], LOOKUP, "--endpoint"),
    (["smoke"], LOOKUP, "--request-timeout")])
def test_the_verbs_that_take_a_group_show_its_options_in_its_place(verb, group, before):
    result = run_cli(*verb, "--help", env={"COLUMNS": "200"})
    assert result.code == 0, result
    # the first word of each row of the options table
    flags = [m.group(1) for m in re.finditer(r"^│\s+(--[\w-]+)", result.stdout, re.M)]
    start = flags.index(before) + 1 if before else 0
    assert flags[start:start + len(group)] == group
