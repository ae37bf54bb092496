"""vLLM's and SGLang's /health answer 200 with no body: sparkctl must neither need nor show anything
from it, and the stand-in's own state route (``STATE_PATH``) is never asked by the product."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from sparkctl.cli.containers_cmd import format_status
from sparkctl.ops.bench_html import run_facts
from sparkctl.standin import routes
from sparkctl.standin.server import STATE_PATH

PACKAGE = Path(__file__).resolve().parent.parent / "sparkctl"


def test_no_real_engine_declares_the_state_route():
    for engine in ("vllm", "sglang"):
        assert routes.declared(engine), engine  # the tables are there, so the check below means something
        assert routes.match(engine, STATE_PATH) is None, engine
        assert "/health" in routes.declared(engine)


def test_the_product_never_asks_the_state_route():
    """Only the stand-in (which serves it) and the sandbox harness may name it."""
    needle = re.compile(r"_standin/state|STATE_PATH")
    users = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts[0]
        if part in ("standin", "sandbox"):
            continue
        if needle.search(path.read_text(encoding="utf-8")):
            users.append(str(path.relative_to(PACKAGE)))
    assert len(list(PACKAGE.rglob("*.py"))) > 50  # the walk did see the package
    assert users == []
    assert needle.search((PACKAGE / "standin" / "server.py").read_text())  # and the pattern does find it


def _status(health_body) -> str:
    doc = {"profile": "tp3", "deployed": True, "endpoint": "http://spark-1:8000", "deployed_at": None,
           "hosts": [], "health": {"ok": True, "stage": "ready", "detail": "ok", "models": ["dsv41"],
                                   "max_model_len": 4096, "health": health_body}}
    report = SimpleNamespace(to_json=lambda: doc, states=[], problems=[], drift=[], fix=None, lock=None)
    return format_status(report)


def test_status_claims_no_ranks_from_health():
    for body in (None, {"engine_config": {"ranks_connected": 2, "tp": 3}}):  # whatever a /health might carry
        line = next(l for l in _status(body).splitlines() if l.startswith("health:"))
        assert line == "health: ok; models: dsv41 (max_model_len 4096)", line


def test_bench_page_shows_no_configuration_when_health_gave_none():
    doc = {"endpoint": "http://e:8000", "model": "dsv41", "settings": {"prompt_tokens": 8, "max_tokens": 4}}
    without = run_facts({**doc, "server": {"models": ["dsv41"], "max_model_len": 4096, "engine_config": None}})
    assert "configuration" not in without and "null" not in without and "dsv41" in without
    given = run_facts({**doc, "server": {"engine_config": {"arena_slots": 7}}})  # the single-box engine's
    assert "The engine&#x27;s configuration" in given or "The engine's configuration" in given
    assert "arena_slots" in given
