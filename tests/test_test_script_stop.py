"""scripts/test.sh's full run starts three tiers side by side in the background: a Ctrl-C (SIGINT to
the terminal's foreground group) or a kill of the script itself ends every one of them and removes
its log folder. The script runs as it is, from a copy of the tree with a tiny selection: real pytest
runs (a quick test that passes, an integration and a sandbox test that hold until they are
stopped) and a smoke deploy that ignores SIGINT (so the SIGTERM that follows is needed too).

Nothing here depends on which tier starts first: the signal is sent only once all three said they
are running, and the checks are on what is left after the script ended."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HELD = ("integration", "sandbox", "smoke")
START_DEADLINE_S = 180  # three Python starts on a loaded 2-core machine

TINY_TESTS = '''
import os, time
from pathlib import Path
import pytest

def _hold(tier):
    (Path(os.environ["TIER_PIDS"]) / tier).write_text(str(os.getpid()))
    time.sleep(600)

def test_quick():
    pass

@pytest.mark.integration
def test_integration():
    _hold("integration")

@pytest.mark.sandbox
def test_sandbox():
    _hold("sandbox")
'''

TINY_CONFTEST = '''
from hypothesis import settings
settings.register_profile("quick")
settings.register_profile("full")

def pytest_configure(config):
    config.addinivalue_line("markers", "integration: held")
    config.addinivalue_line("markers", "sandbox: held")
'''

# ignores SIGINT, as a step that must not be cut short would: only the SIGTERM after the grace ends it
SMOKE_STUB = '''#!/bin/sh
trap '' INT
echo $$ > "$TIER_PIDS/smoke"
exec sleep 600
'''


def _tree(root: Path) -> Path:
    """A copy of test.sh in a tree of its own: setup a no-op, the smoke deploy a stub, the venv's
    Python the real one, and the tiny tests."""
    scripts = root / "scripts"
    scripts.mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", scripts / "test.sh")
    (scripts / "setup.sh").write_text("exit 0\n")
    (scripts / "smoke-deploy.sh").write_text(SMOKE_STUB)
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (root / "tiny").mkdir()
    (root / "tiny" / "test_tiny.py").write_text(TINY_TESTS)
    (root / "tiny" / "conftest.py").write_text(TINY_CONFTEST)
    return root


def _alive(pid: int) -> bool:
    """Running (a zombie left for its reaper counts as ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def _in_groups(groups: set[int]) -> list[str]:
    """The live processes of these process groups, as "pid command"."""
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            left.append(f"{entry.name} {command[:120]}")
    return left


def _wait_for_held(pids_dir: Path, proc: subprocess.Popen) -> dict[str, int]:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"test.sh ended before its tiers were running (exit {proc.returncode})")
        found = {t: (pids_dir / t).read_text().strip() for t in HELD if (pids_dir / t).exists()}
        if len(found) == len(HELD) and all(found.values()):
            return {t: int(p) for t, p in found.items()}
        time.sleep(0.1)
    pytest.fail(f"not every tier started within {START_DEADLINE_S} s: {sorted(os.listdir(pids_dir))}")


def _in_session(session: int) -> list[int]:
    """The processes of a session (the script was started as a session leader; its tiers' process
    groups stay in its session)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[3]) == session:
                found.append(int(entry))
    return found


@pytest.mark.integration
@pytest.mark.parametrize("how", ["ctrl-c", "parent killed"])
def test_stopping_the_full_run_ends_the_side_by_side_tiers_and_cleans_up(tmp_path, how):
    root = _tree(tmp_path / "tree")
    pids_dir, temp = tmp_path / "pids", tmp_path / "tmp"
    pids_dir.mkdir()
    temp.mkdir()
    env = dict(os.environ, TIER_PIDS=str(pids_dir), TMPDIR=str(temp), SPARKCTL_TEST_STOP_GRACE_S="1",
               SPARKCTL_TEST_WORKERS="0", SPARKCTL_INTEGRATION_WORKERS="0", SPARKCTL_SANDBOX_WORKERS="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.Popen(["bash", "scripts/test.sh", "--all", "tiny/test_tiny.py"], cwd=root, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    held: dict[str, int] = {}
    output = b""
    try:
        held = _wait_for_held(pids_dir, proc)
        groups = {os.getpgid(pid) for pid in held.values()}
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the foreground group, the script's
        else:
            proc.send_signal(signal.SIGTERM)  # the script alone
        output, _ = proc.communicate(timeout=120)
    finally:
        left = [pid for pid in held.values() if _alive(pid)]
        for pid in left:  # a failed run leaves nothing behind either
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _in_session(proc.pid):  # the tiers' own groups, when the script could not end them
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    text = output.decode(errors="replace")
    assert proc.returncode == -(signal.SIGINT if how == "ctrl-c" else signal.SIGTERM), text
    assert [t for t, pid in held.items() if pid in left] == [], text
    assert _in_groups(groups) == [], text
    assert list(temp.iterdir()) == [], text  # the tiers' log folder removed
    assert "SIGTERM" in text  # the smoke stub ignored SIGINT: the grace ran out and SIGTERM ended it
