"""How long the Ray head takes to stop when SIGTERM comes during `ray start`: the line rendered
before (`bash -c "ray start ... && exec vllm serve ..."`) against this checkout's, side by side.

Each line runs as a container runs it: PID 1 of a PID namespace of its own (`unshare --pid`, root),
where a signal without a handler is dropped, with a `ray` that is still starting (it never ends on
its own). It gets SIGTERM from outside the namespace, as `docker stop` sends it, and SIGKILL
--grace seconds later (docker stop's --time; sparkctl stop passes 30, docker's default is 10).
Prints each run's seconds from SIGTERM to the end and the ratio of the medians.

    sudo python bench/ray_head_stop.py [--grace 10] [--runs 3] [--shell "busybox sh"]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkctl.commands.vllm import ray_head_line  # noqa: E402

START = ["ray", "start", "--head", "--port=6379"]
SERVE = ["vllm", "serve", "/model", "--distributed-executor-backend", "ray", "--tensor-parallel-size", "2"]
LINES = {"before": " ".join(START) + " && exec " + " ".join(SERVE), "now": ray_head_line(START, SERVE)}


def stop_seconds(shell: list[str], line: str, grace_s: float, folder: Path) -> float:
    """Seconds from SIGTERM to the line's end (SIGKILL after ``grace_s``, as docker stop does)."""
    mark = folder / "started"
    mark.unlink(missing_ok=True)
    env = dict(os.environ, PATH=f"{folder}:{os.environ['PATH']}", MARK=str(mark))
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *shell, line], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while not mark.exists():
        time.sleep(0.01)
    pid_1 = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    sent = time.monotonic()
    os.kill(pid_1, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.kill(pid_1, signal.SIGKILL)
        proc.wait()
    return time.monotonic() - sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL (docker stop --time)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shell", default="busybox sh", choices=["busybox sh", "bash"])
    args = parser.parse_args()
    shell = args.shell.split() + ["-c"]
    runs: dict[str, list[float]] = {"before": [], "now": []}
    with tempfile.TemporaryDirectory() as folder:
        ray = Path(folder) / "ray"
        ray.write_text('#!/bin/sh\necho started > "$MARK"\nexec sleep 600\n')  # still starting
        ray.chmod(0o755)
        for _ in range(args.runs):  # alternate, so a change of load hits both
            for name, line in LINES.items():
                runs[name].append(stop_seconds(shell, line, args.grace, Path(folder)))
    for name, values in runs.items():
        print(f"{name:>6}: " + "  ".join(f"{v:.2f}" for v in values) + f"   median {statistics.median(values):.2f} s")
    ratio = statistics.median(runs["before"]) / statistics.median(runs["now"])
    print(f"stop during ray start ({args.shell}, grace {args.grace:g} s): now is {ratio:.0f}x faster than before "
          f"(median over {args.runs} runs each; load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
