"""Notes and warnings through the one reporter (sparkctl.reporter): a note about a part of the run
(a replica) starts with its name in every style."""

from __future__ import annotations

import io
import json

from rich.console import Console

from sparkctl.reporter import NOTE, WARNING, Reporter, console_renderer


def _drawn(style: str, emit) -> str:
    buffer = io.StringIO()
    reporter = Reporter(console_renderer(Console(file=buffer, force_terminal=style == "rich", width=60), style))
    emit(reporter)
    return buffer.getvalue()


def _about_a_replica(reporter: Reporter) -> None:
    reporter.note("checking 2 host(s): image vllm:[tag], containers, ports", "r1")
    reporter.warning("the image has no --kv-cache-dtype", "r2")
    reporter.note("deploy lock on spark-1 (/var/lib/sparkctl/deploy.lock)")


def test_a_note_about_a_replica_starts_with_its_name_in_a_log():
    assert _drawn("plain", _about_a_replica).splitlines() == [
        "r1: checking 2 host(s): image vllm:[tag], containers, ports",
        "r2: warning: the image has no --kv-cache-dtype",
        "deploy lock on spark-1 (/var/lib/sparkctl/deploy.lock)"]


def test_on_a_terminal_the_same_words_brackets_kept():
    text = _drawn("rich", _about_a_replica)
    assert "r1: checking 2 host(s): image vllm:[tag], containers, ports" in text
    assert "r2: " in text and "the image has no --kv-cache-dtype" in text


def test_json_lines_name_the_part_as_the_step():
    docs = [json.loads(line) for line in _drawn("json", _about_a_replica).splitlines()]
    assert [(d["event"], d.get("step")) for d in docs] == [(NOTE, "r1"), (WARNING, "r2"), (NOTE, None)]
    assert docs[1]["reason"] == "the image has no --kv-cache-dtype"


def test_a_serve_about_a_replica_says_its_notes_about_it():
    from sparkctl.ops.serve import ServeRun

    serve = ServeRun.__new__(ServeRun)
    serve.reporter, serve.about = Reporter(), "r2"
    serve.note("starting 2 container(s)")
    assert [(e.kind, e.step, e.reason) for e in serve.reporter.events] == [(NOTE, "r2", "starting 2 container(s)")]


def test_distributes_host_lines_are_notes_a_program_can_follow(monkeypatch):
    """A round's failed host, said before it is tried again, reaches the run's reporter (here as JSON
    lines), not the console directly; each host's end is its ``load`` step's (test_distribute_steps)."""
    from sparkctl.ops import distribute
    from sparkctl.output import Output

    monkeypatch.setenv("SPARKCTL_EVENTS", "json")
    out, buffer = Output(), io.StringIO()
    out._console = Console(file=buffer, width=300)
    reports = {"spark-2": distribute.HostReport("spark-2", status="failed", mode="full", error="spark-2: connection closed")}
    dist = distribute._Distribution(None, None, [], None, None, distribute.DistributeOptions(tag="img:1", retry_delay=0),
                                    reports, None, {}, None, out)
    dist._say_retry(["spark-2"], 1)
    docs = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert [d["event"] for d in docs] == [NOTE, NOTE] and docs[0]["reason"] == "  spark-2: connection closed"
    assert docs[1]["reason"].startswith("retrying spark-2 (attempt 2 of 2)")
    assert [e.kind for e in out.reporter.events] == [NOTE, NOTE]
