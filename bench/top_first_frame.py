"""How long `sparkctl top` takes to show its first frame, this checkout against another commit,
side by side on a sandbox cluster (root): both run as a user runs them, in a pseudo-terminal,
and the time is from the start of the process to the first host row on the screen (the first
frame), and to the first host row holding a sample (the first sample: a first frame may be drawn
before the hosts answer). Prints each run and the ratios of the medians (the machine's load moves
both alike).

Without --before: this checkout alone, its first frame against the refresh interval it then keeps
(the time from the first frame to the second, same run). The target: the first frame within 2/3 of
the default 3 s interval (2 s).

    SPARKCTL_SANDBOX_ROOT=... python bench/top_first_frame.py --inventory INV --before /path/to/old/checkout [--runs 5]
    SPARKCTL_SANDBOX_ROOT=... python bench/top_first_frame.py --inventory INV --base HEAD~1 [--runs 5]
    SPARKCTL_SANDBOX_ROOT=... python bench/top_first_frame.py --inventory INV [--runs 5]

--base REV checks REV out into a temporary folder (``git worktree``, removed at the end) and
compares with it. --frame-only: the first frame alone, which asks no host (any inventory will do,
e.g. inventory.example.yaml --host spark-153 --profile tp4: no sandbox needed).
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


SAMPLED = b"(unified)"  # in a host row only once the host's first sample is drawn (the stand-in GB10's memory)


def first_frame_seconds(checkout: Path, inventory: str, host: str, profile: str, deadline_s: float = 60.0) -> float:
    """Seconds from spawning `sparkctl top` (from ``checkout``) to ``host``'s row on its terminal."""
    return frame_times(checkout, inventory, host, profile, 1, deadline_s)[0]


def first_sample_seconds(checkout: Path, inventory: str, profile: str, deadline_s: float = 60.0) -> float:
    """Seconds from spawning `sparkctl top` to the first host row holding a sample (a frame drawn
    before the hosts answered shows their names only)."""
    main_fd, proc, started = _spawn(checkout, inventory, profile)
    seen = b""
    try:
        while time.monotonic() - started < deadline_s:
            ready, _, _ = select.select([main_fd], [], [], 0.05)
            if ready:
                try:
                    seen += os.read(main_fd, 65536)
                except OSError:
                    break
                if SAMPLED in seen:
                    return time.monotonic() - started
        raise RuntimeError(f"no sample within {deadline_s} s: {seen[-400:]!r}")
    finally:
        _end(proc, main_fd)


def _spawn(checkout: Path, inventory: str, profile: str):
    main_fd, child_fd = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(checkout), COLUMNS="200", LINES="50")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "sparkctl", "-i", inventory, "top", "--profile", profile,
                             "--set", "tensor_parallel=2"], stdin=child_fd, stdout=child_fd, stderr=child_fd,
                            cwd=checkout, env=env, start_new_session=True)
    os.close(child_fd)
    return main_fd, proc, started


def _end(proc, main_fd) -> None:
    proc.terminate()
    proc.wait(timeout=10)
    os.close(main_fd)


def frame_times(checkout: Path, inventory: str, host: str, profile: str, frames: int,
                deadline_s: float = 60.0) -> list[float]:
    """Seconds from spawning `sparkctl top` to each of its first ``frames`` frames (``host``'s row
    drawn again after a pause: a frame is drawn in one burst)."""
    main_fd, proc, started = _spawn(checkout, inventory, profile)
    seen, times = b"", []
    try:
        while time.monotonic() - started < deadline_s:
            ready, _, _ = select.select([main_fd], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(main_fd, 65536)
                except OSError:
                    break
                seen += chunk
                now = time.monotonic() - started
                if host.encode() in chunk and (not times or now - times[-1] > 0.5):
                    times.append(now)
                    if len(times) == frames:
                        return times
        raise RuntimeError(f"{len(times)} of {frames} frames within {deadline_s} s: {seen[-400:]!r}")
    finally:
        _end(proc, main_fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--before", help="a checkout of the commit to compare with (else: the first frame "
                                          "against the refresh interval)")
    parser.add_argument("--host", default="spark-1")
    parser.add_argument("--profile", default="sandbox")
    parser.add_argument("--base", help="a commit to compare with, checked out into a temporary folder")
    parser.add_argument("--frame-only", action="store_true", help="the first frame only (no host is asked)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.base is not None:
        with tempfile.TemporaryDirectory() as folder:
            tree = Path(folder) / "base"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), args.base], check=True)
            try:
                side_by_side(args, tree)
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    elif args.before is None:
        against_interval(args)
    else:
        side_by_side(args, Path(args.before))


def side_by_side(args, before: Path) -> None:
    whats = ("first frame",) if args.frame_only else ("first frame", "first sample")
    runs = {(what, name): [] for what in whats for name in ("before", "now")}
    for _ in range(args.runs):  # alternate, so a change of load hits both
        for name, checkout in (("before", before), ("now", REPO)):
            runs["first frame", name].append(first_frame_seconds(checkout, args.inventory, args.host, args.profile))
            if not args.frame_only:
                runs["first sample", name].append(first_sample_seconds(checkout, args.inventory, args.profile))
    for (what, name), values in runs.items():
        print(f"{what} {name:>6}: " + "  ".join(f"{v:.2f}" for v in values) +
              f"   median {statistics.median(values):.2f} s")
    for what in whats:
        ratio = statistics.median(runs[what, "before"]) / statistics.median(runs[what, "now"])
        print(f"{what}: now is {ratio:.2f}x faster than before (median over {args.runs} runs each; load "
              f"{os.getloadavg()[0]:.1f})")


def against_interval(args) -> None:
    ratios = []
    for _ in range(args.runs):
        first, second = frame_times(REPO, args.inventory, args.host, args.profile, 2)
        ratios.append(first / (second - first))
        print(f"first frame {first:.2f} s, then every {second - first:.2f} s: ratio {ratios[-1]:.2f}")
    median = statistics.median(ratios)
    print(f"first frame / refresh interval: median {median:.2f} over {args.runs} runs (target below {2 / 3:.2f}: "
          f"{'met' if median < 2 / 3 else 'not met'}; load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
