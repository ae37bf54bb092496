"""A host agent whose sparkctl is gone (Ctrl-C, kill -9, a dropped connection: its stdout closes) ends
the work it started and removes its temporary folders, instead of running to the end."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

from sparkctl.images.orphan import ORPHAN_EXIT
from sparkctl.images.relay import MODULES, relay_zip

REPO = Path(__file__).resolve().parents[1]

AGENT = textwrap.dedent("""
    import subprocess, sys, tempfile, time
    from sparkctl.images.orphan import emit, remove_when_orphaned
    folder = tempfile.mkdtemp(prefix="sparkctl-test-orphan-")
    remove_when_orphaned(folder)
    child = subprocess.Popen(["sleep", "300"])
    emit({"folder": folder, "child": child.pid})
    while True:  # the work, reporting progress as the relay does
        time.sleep(0.1)
        emit({"progress": 1})
""")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1].startswith("Z")  # a zombie has ended
    except FileNotFoundError:
        return True


def test_an_agent_whose_reader_is_gone_ends_its_children_and_removes_its_folders(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    import json

    first = json.loads(proc.stdout.readline())
    assert os.path.isdir(first["folder"]) and not _gone(first["child"])
    proc.stdout.close()  # sparkctl is gone: nobody reads the agent's answer any more
    code = proc.wait(timeout=60)
    assert code == ORPHAN_EXIT
    assert not os.path.exists(first["folder"])
    deadline = time.monotonic() + 30
    while not _gone(first["child"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(first["child"]), "the agent's child (its docker save, its ssh pipes) still runs"


def test_the_shipped_agents_carry_the_guard():
    from sparkctl.ops.model_sync import AGENT_MODULES

    assert "sparkctl.images.orphan" in MODULES and "sparkctl.images.orphan" in AGENT_MODULES
    with zipfile.ZipFile(__import__("io").BytesIO(relay_zip())) as archive:
        assert "sparkctl/images/orphan.py" in archive.namelist()


def test_an_engram_cutter_whose_command_is_gone_stops(tmp_path):
    """pack-engram's host program prints nothing until it is done: it watches its stdout instead."""
    script = ("import sys, time\nfrom sparkctl.engram.hostside import exit_when_orphaned, EXIT_ORPHANED\n"
              "exit_when_orphaned(every_s=0.1)\nprint('cutting', flush=True)\ntime.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "cutting"
    proc.stdout.close()
    from sparkctl.engram.hostside import EXIT_ORPHANED

    assert proc.wait(timeout=60) == EXIT_ORPHANED


SHIPPED_AGENT = textwrap.dedent("""
    import sys, time
    from sparkctl.images.orphan import emit
    while True:
        emit({"progress": 1})
        time.sleep(0.1)
""")


def _orphan_shipped(role: str) -> str:
    """A shipped agent (its script in /tmp/sparkctl-*/) whose reader goes away; returns its folder."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="sparkctl-test-shipped-", dir="/tmp")
    script = os.path.join(folder, "agent.py")
    Path(script).write_text(SHIPPED_AGENT)
    proc = subprocess.Popen([sys.executable, script, role], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=60) == ORPHAN_EXIT
    return folder


def test_an_agent_whose_reader_is_gone_removes_the_folder_it_was_shipped_to():
    assert not os.path.exists(_orphan_shipped("sender"))


RECEIVER = textwrap.dedent("""
    import sys
    from sparkctl.model.agent import receive
    sys.exit(receive(sys.argv[1], sys.stdin.buffer))
""")


def _receive(tmp_path, frames: bytes) -> tuple[int, str, Path]:
    """model sync's receiver, shipped to its own /tmp/sparkctl-* folder, fed ``frames`` then EOF."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="sparkctl-test-receiver-", dir="/tmp")
    Path(folder, "agent.py").write_text(RECEIVER)
    root = tmp_path / "copy"
    done = subprocess.run([sys.executable, os.path.join(folder, "agent.py"), str(root)], input=frames,
                          capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, folder, root


def test_a_receiver_whose_sender_went_away_removes_its_folder_and_keeps_the_part(tmp_path):
    """Its sender (sparkctl, or the agent sending host to host) is gone or its link dropped: nobody may
    come back to remove the folder, and a sparkctl still running ships the agent again for its retry."""
    import hashlib
    import json
    import shutil

    from sparkctl.model.agent import PART_SUFFIX

    data = b"x" * 1000
    header = {"file": "a.bin", "offset": 0, "size": len(data), "algo": "sha256", "digest": hashlib.sha256(data).hexdigest()}
    code, folder, root = _receive(tmp_path, json.dumps(header).encode() + b"\n" + data[:400])
    try:
        assert code == 3 and not os.path.exists(folder)
        assert (root / ("a.bin" + PART_SUFFIX)).read_bytes() == data[:400]  # kept for a resume
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    # A stream its sender closed (the manifest frame last) leaves the folder to sparkctl, which still runs.
    closing = json.dumps({"manifest": {"files": {}}}).encode() + b"\n"
    code, folder, root = _receive(tmp_path, json.dumps(header).encode() + b"\n" + data + closing)
    try:
        assert code == 0 and os.path.isfile(os.path.join(folder, "agent.py"))
        assert (root / "a.bin").read_bytes() == data
    finally:
        shutil.rmtree(folder, ignore_errors=True)
