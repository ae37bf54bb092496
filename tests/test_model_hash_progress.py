"""model sync --from HOST: hashing the source on that host says how far it is (done of total, a
percent, the time left), as hashing a local source does. The shipped agent runs for real here as
the source host's program would (a subprocess), its lines read the way they arrive over SSH."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.errors import OperationFailed
from sparkctl.model import agent
from sparkctl.ops import model_sync
from sparkctl.output import Output
from sparkctl.remote.result import CommandResult


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return Path(make_checkpoint(str(tmp_path / "src"), vocab_size=3000, files=4, seed=5).path)


class Shipped:
    """The agent as ShippedAgent runs it on a host: its stdout handed to ``sink`` as it comes."""

    def __init__(self, program: Path):
        self.program = program

    def stream_out(self, args, sink, timeout=None):
        proc = subprocess.Popen(["python3", str(self.program), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for chunk in iter(lambda: proc.stdout.read1(4096), b""):
            sink(chunk)
        err = proc.stderr.read().decode()
        return CommandResult(proc.wait(timeout), "", err, 0.0)


def _run(tmp_path, source: str, every: float):
    program = tmp_path / "agent.pyz"
    program.write_bytes(model_sync.agent_zip())
    said = io.StringIO()
    out = Output()  # its reporter draws the notes in a log's plain lines
    out._console = Console(file=said, width=400)
    run = SimpleNamespace(source_host=SimpleNamespace(name="spark-1"), source=SimpleNamespace(path=source),
                          agents=SimpleNamespace(shipped={"spark-1": Shipped(program)}), out=out,
                          options=SimpleNamespace(progress_every=every))
    return run, said


def test_the_agent_says_how_far_it_hashed_before_the_manifest(checkpoint):
    lines = []
    manifest = agent.build_told(str(checkpoint), "sha256", None, lines.append, every=0)
    total = sum(p.stat().st_size for p in checkpoint.iterdir() if p.is_file())
    progress = [line["hashing"] for line in lines if "hashing" in line]
    assert len(progress) > 2 and all(p["total"] == total for p in progress)
    assert [p["done"] for p in progress] == sorted(p["done"] for p in progress) and progress[-1]["done"] == total
    assert lines[-1] == {"manifest": manifest} and manifest["files"] == agent.build(str(checkpoint), "sha256")["files"]


def test_hashing_a_remote_source_shows_percent_and_eta(tmp_path, checkpoint):
    run, said = _run(tmp_path, str(checkpoint), every=0)
    manifest = model_sync._hash_there(run, "sha256")
    assert set(manifest["files"]) == set(agent.build(str(checkpoint), "sha256")["files"])
    lines = said.getvalue().splitlines()
    # a line per change (every=0), the last one's bytes not said twice at the end
    assert len(lines) >= 1 and all(re.match(r"  hashed .* of .* \(\d+\.\d %\), .*: spark-1 ", line) for line in lines), lines
    assert "ETA" in lines[0] or "(100.0 %)" in lines[0]  # a time left while there is some left
    assert "(100.0 %)" in lines[-1] and "done in" in lines[-1], lines


def test_a_missing_source_folder_is_one_line_naming_host_and_folder(tmp_path):
    run, _ = _run(tmp_path, str(tmp_path / "absent"), every=0)
    with pytest.raises(OperationFailed, match=rf"hashing the source on spark-1 failed \(exit 1\): no such folder: "
                                              rf"{tmp_path}/absent"):
        model_sync._hash_there(run, "sha256")


def test_hashing_a_local_source_is_told_as_progress_events(tmp_path, checkpoint, monkeypatch):
    """A source on this machine: its bytes read are the reporter's progress events (JSON lines when
    asked), started with the total and done with every byte, like a transfer's."""
    monkeypatch.setenv("SPARKCTL_EVENTS", "json")
    run, said = _run(tmp_path, str(checkpoint), every=0)
    run.local_dir, run.expected = str(checkpoint), None
    manifest = model_sync._hash_here(run, "sha256")
    total = sum(p.stat().st_size for p in checkpoint.iterdir() if p.is_file())
    events = [json.loads(line) for line in said.getvalue().splitlines()]
    assert {e["event"] for e in events} == {"progress"} and {e["step"] for e in events} == {"hashed"}
    assert events[0]["status"] == "started" and events[0]["hosts"] == [{"host": model_sync.HERE, "bytes": 0, "total": total}]
    assert events[-1]["status"] == "done" and events[-1]["hosts"][0]["bytes"] == total
    assert len(events) > 2  # running events in between (every=0: each read)
    assert set(manifest["files"]) == set(agent.build(str(checkpoint), "sha256")["files"])


def test_a_hosts_plan_is_one_line_for_the_reporter():
    from sparkctl.model.plan import HostPlan

    assert model_sync.plan_line(HostPlan("spark-2", refused="no room")) == "  spark-2      refused: no room"
    assert model_sync.plan_line(HostPlan("spark-2")) == "  spark-2      has every file, verified"
    needs = HostPlan("spark-3", send=[{"file": "a", "offset": 0}, {"file": "b", "offset": 5}], bytes_to_send=3 * 2**30,
                     resumed_bytes=2**20, free=100 * 2**30, states={"a": "missing", "b": "size"})
    line = model_sync.plan_line(needs)
    assert line.startswith("  spark-3      needs 2 file(s) (1 missing, 1 size), ") and "resuming" in line and line.endswith(" free")
