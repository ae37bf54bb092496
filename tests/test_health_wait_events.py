"""The health wait told to the one reporter (cli/answer.with_health_progress): a log gets a line
every 15 s while the endpoint does not answer, a program a JSON line per attempt, a terminal one
live line taken down at the end, whatever happens."""

from __future__ import annotations

import contextlib
import io
import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from sparkctl.cli.answer import with_health_progress
from sparkctl.output import Output

ENDPOINT = "http://10.0.0.1:8000"


def _output(monkeypatch, style: str, terminal: bool = False) -> tuple[Output, io.StringIO]:
    monkeypatch.setenv("SPARKCTL_EVENTS", style)
    out, buffer = Output(), io.StringIO()
    out._console = Console(file=buffer, force_terminal=terminal, width=300)
    return out, buffer


def _serve(attempts, fails: bool = False):
    """An execute that reports ``attempts`` (elapsed, stage, ok) the way the health wait does."""
    def execute(pool, on_attempt):
        for elapsed, stage, ok in attempts:
            on_attempt(elapsed, SimpleNamespace(stage=stage, detail="connection refused" if not ok else "200", ok=ok))
        if fails:
            raise RuntimeError("lost the head")
        return "served"
    return execute


ATTEMPTS = [(1.0, "health", False), (14.0, "health", False), (16.0, "health", False), (20.0, "models", False),
            (31.5, "models", False), (33.0, "models", True)]


def test_a_log_gets_a_line_every_15_s_while_it_does_not_answer(monkeypatch):
    out, buffer = _output(monkeypatch, "plain")
    assert with_health_progress(out, ENDPOINT, contextlib.nullcontext, _serve(ATTEMPTS)) == "served"
    assert buffer.getvalue().splitlines() == [f"waiting for {ENDPOINT}: health: connection refused (16 s)",
                                              f"waiting for {ENDPOINT}: models: connection refused (32 s)"]
    assert [(e.kind, e.status) for e in out.reporter.events] == [("waiting", "done")]  # the attempts are not kept


def test_a_program_gets_every_attempt_and_the_end(monkeypatch):
    out, buffer = _output(monkeypatch, "json")
    with_health_progress(out, ENDPOINT, contextlib.nullcontext, _serve(ATTEMPTS))
    docs = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert [d["status"] for d in docs] == ["waiting"] * 5 + ["ok", "done"]
    assert docs[0] == {"event": "waiting", "step": ENDPOINT, "status": "waiting", "reason": "health: connection refused",
                       "seconds": 1.0}


def test_on_a_terminal_the_live_line_comes_down_even_when_the_serve_fails(monkeypatch):
    out, buffer = _output(monkeypatch, "rich", terminal=True)
    with pytest.raises(RuntimeError, match="lost the head"):
        with_health_progress(out, ENDPOINT, contextlib.nullcontext, _serve(ATTEMPTS[:2], fails=True))
    renderer = out.reporter.render
    assert renderer._spinner is None and "connection refused" in buffer.getvalue()
