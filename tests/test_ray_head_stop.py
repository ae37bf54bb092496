"""The Ray head's rendered launch line stops on SIGTERM while `ray start` runs. It runs as a
container runs it: as PID 1 of a PID namespace of its own (`unshare --pid`, root), where a signal
the process has no handler for is dropped, with the SIGTERM sent from outside as `docker stop` sends
it; under busybox sh (the stand-in image) and bash (real images). `ray` is a stand-in that never
ends on its own and `vllm` one that prints its argv, so nothing depends on which of two things
happens first: the line ends only if the signal is acted on."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_render_helpers import render_json

HELD_S = 60  # reached only when the line ignores the signal (the stand-in `ray start` never ends)


def _pid_namespaces() -> bool:
    """Whether this machine lets us start a PID namespace (root, unshare, and a kernel or container
    that allows it: an unprivileged container may not)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(not _pid_namespaces(), reason="a PID namespace of its own needs root and unshare")

SHELLS = {"busybox sh": ["busybox", "sh", "-c"], "bash": ["bash", "-c"]}
SHELL_PARAMS = [pytest.param(name, id=name, marks=pytest.mark.skipif(
    shutil.which(argv[0]) is None, reason=f"{argv[0]} is not installed")) for name, argv in SHELLS.items()]


def head_line() -> str:
    data = render_json("--profile", "tp4", "--set", "distributed.launcher=ray",
                       "--set", "engine_args.distributed-executor-backend=null")
    argv = data["hosts"][0]["engine_argv"]
    assert argv[:2] == ["bash", "-c"] and len(argv) == 3
    return argv[2]


def _stand_ins(folder: Path, ray_ends: bool) -> Path:
    """`ray` (says it started, then never ends, or ends at once) and `vllm` (prints its argv and PID)."""
    folder.mkdir()
    ray = "echo started > \"$MARK\"\n" + ("exit 0\n" if ray_ends else "exec sleep 600\n")
    (folder / "ray").write_text("#!/bin/sh\n" + ray)
    (folder / "vllm").write_text('#!/bin/sh\necho "pid $$"\nfor a in "$0" "$@"; do echo "arg $a"; done\n')
    for name in ("ray", "vllm"):
        (folder / name).chmod(0o755)
    return folder


def _as_pid_1(shell: list[str], line: str, bin_dir: Path, mark: Path) -> subprocess.Popen:
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", MARK=str(mark))
    return subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *shell, line], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _pid_1_of(proc: subprocess.Popen) -> int:
    """The shell unshare forked: PID 1 inside, this PID outside."""
    deadline = time.monotonic() + HELD_S
    while time.monotonic() < deadline:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.02)
    pytest.fail("unshare started no shell")


@pytest.mark.parametrize("shell", SHELL_PARAMS)
def test_sigterm_during_ray_start_stops_the_head(tmp_path, shell):
    mark = tmp_path / "ray-started"
    proc = _as_pid_1(SHELLS[shell], head_line(), _stand_ins(tmp_path / "bin", ray_ends=False), mark)
    try:
        pid_1 = _pid_1_of(proc)
        deadline = time.monotonic() + HELD_S
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert mark.exists(), "ray start never ran"
        os.kill(pid_1, signal.SIGTERM)  # docker stop: from outside the namespace, to its PID 1
        output, _ = proc.communicate(timeout=HELD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, output  # the trap's: 128 + SIGTERM, not a SIGKILL after a timeout
    assert b"arg " not in output  # the engine was never started


@pytest.mark.parametrize("shell", SHELL_PARAMS)
def test_after_ray_start_the_engine_replaces_the_shell_with_the_rendered_argv(tmp_path, shell):
    line = head_line()
    proc = _as_pid_1(SHELLS[shell], line, _stand_ins(tmp_path / "bin", ray_ends=True), tmp_path / "mark")
    try:
        output, _ = proc.communicate(timeout=HELD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = output.decode().splitlines()
    assert proc.returncode == 0 and lines[0] == "pid 1", output  # exec'd: vllm is PID 1, as before
    argv = [entry[len("arg "):] for entry in lines[1:]]
    assert Path(argv[0]).name == "vllm" and argv[1:] == shlex.split(line.split(" && exec ", 1)[1])[1:]
