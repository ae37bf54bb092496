"""Bytes going to hosts (sparkctl.transfer.Transfer) told as the one reporter's progress events: as
a CI log shows them, as JSON lines, and as bars on a terminal."""

from __future__ import annotations

import io
import json
import threading

from rich.console import Console

from sparkctl.output import Output, size_text
from sparkctl.reporter import NOTE, PROGRESS, Reporter, console_renderer
from sparkctl.transfer import Transfer


def _output(style: str = "", terminal: bool = False, monkeypatch=None) -> tuple[Output, io.StringIO]:
    if monkeypatch is not None:
        monkeypatch.setenv("SPARKCTL_EVENTS", style)
    out = Output()
    buffer = io.StringIO()
    out._console = Console(file=buffer, force_terminal=terminal, width=300)
    return out, buffer


def test_plain_lines_carry_the_total_each_host_and_a_last_line_at_close():
    out, buffer = _output()
    transfer = Transfer(out.reporter, {"spark-2": 4 * 1048576, "spark-3": 4 * 1048576}, every=3600)
    transfer.update("spark-2", 1048576)  # no line before `every` has passed
    transfer.update("spark-2", 2 * 1048576)
    transfer.advance("spark-3", 3 * 1048576)
    transfer.note("spark-3: shard-0 written")
    transfer.close()
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "spark-3: shard-0 written"
    assert lines[1].startswith("  sent 5.0 MiB of 8.0 MiB (62.5 %)")
    assert lines[1].endswith("spark-2 2.0 MiB/4.0 MiB (50 %), spark-3 3.0 MiB/4.0 MiB (75 %)")
    assert len(lines) == 2


def test_an_unknown_size_is_left_out_and_unknown_hosts_are_ignored():
    out, buffer = _output()
    transfer = Transfer(out.reporter, {"a": None}, every=0, verb="sending")
    transfer.update("a", 2048)
    transfer.update("nobody", 99)
    transfer.close()  # says nothing new: no second line
    assert len(buffer.getvalue().splitlines()) == 1
    assert buffer.getvalue().startswith("  sending 2.0 KiB, ") and buffer.getvalue().rstrip().endswith("/s: a 2.0 KiB")


def test_hosts_report_from_their_own_threads():
    transfer = Transfer(None, {f"h{i}": None for i in range(8)})
    threads = [threading.Thread(target=lambda n=f"h{i}": [transfer.advance(n, 10) for _ in range(500)]) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    transfer.close()
    assert transfer.sent == {f"h{i}": 5000 for i in range(8)}
    assert [e.status for e in transfer.reporter.events] == ["started", "done"]
    assert {h.host: h.sent for h in transfer.reporter.events[-1].hosts} == transfer.sent


def test_json_lines_say_the_start_each_step_and_the_end(monkeypatch):
    out, buffer = _output("json", monkeypatch=monkeypatch)
    transfer = Transfer(out.reporter, {"spark-2": 100, "spark-3": None}, every=0)
    transfer.update("spark-2", 40)
    transfer.update("spark-3", 7)
    transfer.note("spark-3: config.json done")
    transfer.close()
    docs = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert [(d["event"], d.get("status")) for d in docs] == [
        (PROGRESS, "started"), (PROGRESS, "running"), (PROGRESS, "running"), (NOTE, None), (PROGRESS, "done")]
    assert docs[0]["step"] == "sent" and docs[0]["hosts"] == [{"host": "spark-2", "bytes": 0, "total": 100},
                                                              {"host": "spark-3", "bytes": 0, "total": None}]
    assert docs[-1]["hosts"][1] == {"host": "spark-3", "bytes": 7, "total": None} and docs[-1]["seconds"] >= 0


def test_only_the_start_and_the_end_are_kept_however_long_it_runs():
    reporter = Reporter()
    transfer = Transfer(reporter, {"a": 10_000}, every=0)
    for sent in range(1, 10_001):
        transfer.update("a", sent)
    transfer.close()
    assert [(e.kind, e.status) for e in reporter.events] == [(PROGRESS, "started"), (PROGRESS, "done")]


def test_on_a_terminal_bars_show_it_and_its_notes_are_left_to_them(monkeypatch):
    out, buffer = _output("rich", terminal=True, monkeypatch=monkeypatch)
    assert out.reporter.live
    transfer = Transfer(out.reporter, {"spark-2": 1048576}, labels={"spark-2": "spark-2 full"})
    transfer.update("spark-2", 1048576)
    transfer.note("spark-2: shard-0 written")
    transfer.close()
    text = buffer.getvalue()
    assert "spark-2 full" in text and "100%" in text and "shard-0 written" not in text
    assert [e.kind for e in out.reporter.events] == [PROGRESS, PROGRESS]


def test_with_json_on_stdout_no_bars_even_on_a_terminal(monkeypatch):
    out, buffer = _output("rich", terminal=True, monkeypatch=monkeypatch)
    out.json_mode = True
    transfer = Transfer(out.reporter, {"a": 2048}, every=3600)
    transfer.update("a", 2048)
    transfer.close()
    assert not out.reporter.live and "a 2.0 KiB/2.0 KiB (100 %)" in buffer.getvalue()


def test_a_renderer_without_bars_draws_the_same_line_in_rich():
    buffer = io.StringIO()
    reporter = Reporter(console_renderer(Console(file=buffer, force_terminal=True, width=300), "rich", bars=False))
    transfer = Transfer(reporter, {"[x]": 1024}, every=3600)
    transfer.update("[x]", 1024)
    transfer.close()
    assert "[x] 1.0 KiB/1.0 KiB (100 %)" in buffer.getvalue()


def test_size_text():
    assert [size_text(n) for n in (5, 2048, 3 * 1048576, 1.5 * 2**40)] == ["5 B", "2.0 KiB", "3.0 MiB", "1.5 TiB"]
