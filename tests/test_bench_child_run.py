"""bench/child_run.py: an interrupted bench gives its pytest child the chance to clean up."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from child_run import run_to_end  # noqa: E402

CHILD = r"""
import signal, sys, time
def cleanup(number, frame):
    open(sys.argv[1], "w").write("cleaned up after SIGINT")
    sys.exit(130)
signal.signal(signal.SIGINT, cleanup)
open(sys.argv[2], "w").write("ready")
time.sleep(60)
"""


def _interrupt_once(ready: Path) -> None:
    """Ctrl-C in this process once the child has set its handler (a loaded machine starts it late)."""
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # A real signal, to the main thread: it breaks the wait the child's output is read in, as a Ctrl-C does.
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_an_interrupt_reaches_the_child_as_sigint_and_waits_for_its_clean_up(tmp_path):
    marker, ready = tmp_path / "marker", tmp_path / "ready"
    # A run started in the background by a shell without job control ignores SIGINT: handle it here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=_interrupt_once, args=(ready,), daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run_to_end([sys.executable, "-c", CHILD, str(marker), str(ready)], grace_s=20)
    finally:
        signal.signal(signal.SIGINT, previous)
    # subprocess.run would have killed the child a quarter of a second later, before any clean-up
    assert marker.read_text() == "cleaned up after SIGINT"


def test_a_child_that_ends_on_its_own_gives_its_output():
    done = run_to_end([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
