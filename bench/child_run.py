"""Run a child (a pytest run, mostly) to its end, and on an interrupt give it the chance to clean up.

``subprocess.run`` answers a Ctrl-C (or a SIGTERM turned into SystemExit) by killing its child after a
quarter of a second: a pytest run then never reaches its teardown, and its sandbox clusters and private
dockerds (started in sessions of their own, so no signal reaches them) are left running. Here the child
gets SIGINT, which pytest turns into its teardown, then SIGTERM, then SIGKILL, ``grace_s`` apart (as
scripts/test.sh does for its tiers); then the interrupt goes on up.
"""

from __future__ import annotations

import signal
import subprocess


def run_to_end(argv: list[str], *, grace_s: float = 60, **popen) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, **popen)``, but an interrupt ends the child gently."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        out, err = proc.communicate()
    except BaseException:
        for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            proc.send_signal(stop)
            try:
                proc.communicate(timeout=grace_s)  # drained, so a child that writes much is never blocked
            except subprocess.TimeoutExpired:
                continue
            except BaseException:  # a second interrupt: on to the next signal at once
                continue
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
