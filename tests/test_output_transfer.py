"""The one byte-progress reporter (sparkctl.output.Transfer) as a CI log shows it."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from sparkctl.output import Output, Transfer, size_text


def _plain_output() -> tuple[Output, io.StringIO]:
    out = Output()
    buffer = io.StringIO()
    out._console = Console(file=buffer, force_terminal=False, width=300)
    return out, buffer


def test_plain_lines_carry_the_total_each_host_and_a_last_line_at_close():
    out, buffer = _plain_output()
    transfer = Transfer(out, {"spark-2": 4 * 1048576, "spark-3": 4 * 1048576}, every=3600)
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
    out, buffer = _plain_output()
    transfer = Transfer(out, {"a": None}, every=0, verb="sending")
    transfer.update("a", 2048)
    transfer.update("nobody", 99)
    transfer.close()
    assert buffer.getvalue().splitlines() == [buffer.getvalue().splitlines()[0]]
    assert buffer.getvalue().startswith("  sending 2.0 KiB, ") and buffer.getvalue().rstrip().endswith("/s: a 2.0 KiB")


def test_hosts_report_from_their_own_threads():
    transfer = Transfer(None, {f"h{i}": None for i in range(8)})
    threads = [threading.Thread(target=lambda n=f"h{i}": [transfer.advance(n, 10) for _ in range(500)]) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert transfer.sent == {f"h{i}": 5000 for i in range(8)}


def test_size_text():
    assert [size_text(n) for n in (5, 2048, 3 * 1048576, 1.5 * 2**40)] == ["5 B", "2.0 KiB", "3.0 MiB", "1.5 TiB"]
