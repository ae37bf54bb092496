"""Every number a verb takes is bounded where it is read: a count, a size or a timeout out of range is one line
naming the option, exit 2, before anything is asked of a host or written (bounded time, memory and disk,
whatever the input)."""

from __future__ import annotations

import ast

import pytest

from clirun import REPO

# Options whose every value is meaningful, with why.
UNBOUNDED = {
    "--seed": "any integer is a seed (random.Random, the synthetic tensors' hash prefix)",
}


def _is_option(node) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Option"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "typer" and bool(node.args))


def _numeric_options(source: str) -> list[tuple[int, str, set[str]]]:
    """(line, option name, which of min/max it sets) of each typer.Option that takes a number: its default is
    one, or (a default of None) the parameter it is the default of is annotated int or float."""
    tree = ast.parse(source)
    numeric = {id(node) for node in ast.walk(tree) if _is_option(node) and isinstance(node.args[0], ast.Constant)
               and type(node.args[0].value) in (int, float)}
    for function in (node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))):
        params = function.args.args + function.args.kwonlyargs
        defaults = [None] * (len(function.args.args) - len(function.args.defaults)) + function.args.defaults + \
            function.args.kw_defaults
        for param, default in zip(params, defaults):
            words = set(ast.unparse(param.annotation).replace("[", " ").replace("]", " ").replace("|", " ").split()) \
                if param.annotation is not None else set()
            if _is_option(default) and words & {"int", "float"}:
                numeric.add(id(default))
    found = []
    for node in ast.walk(tree):
        if id(node) in numeric:
            names = [a.value for a in node.args[1:] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            found.append((node.lineno, names[0] if names else "?", {k.arg for k in node.keywords} & {"min", "max"}))
    return found


def _unbounded(folder) -> list[str]:
    return [f"{path.relative_to(folder)}:{line}: {name} sets {sorted(bounds) or 'no bound'}"
            for path in sorted(folder.rglob("*.py"))
            for line, name, bounds in _numeric_options(path.read_text(encoding="utf-8"))
            if bounds != {"min", "max"} and name not in UNBOUNDED]


def test_every_numeric_option_has_a_lower_and_an_upper_bound():
    assert _unbounded(REPO / "sparkctl") == []


def test_the_scan_finds_an_option_without_bounds(tmp_path):
    (tmp_path / "verb.py").write_text('import typer\n'
                                      'def verb(a: int = typer.Option(3, "--tries", min=1), b: float = typer.Option(1.0, "--wait", min=0, max=9),\n'
                                      '         c: str = typer.Option("x", "--name"), d: int = typer.Option(0, "--seed"),\n'
                                      '         e: Optional[int] = typer.Option(None, "--context", min=1), f: Optional[str] = typer.Option(None, "--x")): ...\n')
    assert _unbounded(tmp_path) == ["verb.py:2: --tries sets ['min']", "verb.py:4: --context sets ['min']"]


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
    (["--vocab", "9999999", "--heads", "64"], "GiB"),  # each within its bound, too big together
    (["--max-ngram", "64", "--heads", "1024"], "Engram tables"),
    (["--layers", ",".join(str(i) for i in range(1000))], "Engram tables"),
    (["--layers", "1,1"], "layer ids must be"),  # two tensors under one name: the index can point at only one
    (["--layers", "-5"], "layer ids must be"),
    (["--layers", "99999999999999999999999"], "layer ids must be"),
    (["--layers", ","], "layer ids must be"),
])
def test_a_synthetic_checkpoint_too_big_to_be_one_is_refused_and_nothing_is_written(cli, tmp_path, extra, said):
    target = tmp_path / "ckpt"
    result = cli("sandbox", "make-checkpoint", str(target), *extra)
    assert result.code == 2, result
    assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result
    assert not target.exists()
