"""Stop signals honoured from the first instant, before the engine has anything to shut down.

As a container's main process the stand-in is PID 1 of its namespace, and the kernel delivers PID 1
no signal it has no handler for: until a handler is installed, ``docker stop``'s SIGTERM is dropped
and docker waits out its whole grace period (30 s for ``sparkctl stop``) before SIGKILL. So every
entry point (the ``vllm``, ``ray`` and ``sglang.launch_server`` shims, ``python -m``, the mains)
calls ``exit_on_stop()`` first; the engine replaces it with its orderly shutdown once it has a job
to end. Exit 0, as after the engine's own SIGTERM: docker's restart policy (on-failure) leaves it down.
"""

import os
import signal


def _exit_now(signum, _frame) -> None:
    try:
        os.write(1, f"received {signal.Signals(signum).name} while starting; exiting\n".encode())
    except OSError:  # stdout closed: the exit matters, not the line
        pass
    os._exit(0)


def exit_on_stop() -> None:
    """SIGTERM and SIGINT end the process at once (exit 0)."""
    signal.signal(signal.SIGTERM, _exit_now)
    signal.signal(signal.SIGINT, _exit_now)
