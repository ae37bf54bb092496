"""Run the real ``sparkctl`` CLI as a user does, and read what it printed. Shared by every test module.

Two ways, one result type:

- ``run_cli`` calls the CLI's entry point (``sparkctl.cli.main.run``) inside the test process, with
  its own argv, environment, working directory, stdin, stdout and stderr for the one call, all
  put back afterwards. A call costs about a tenth of a fresh interpreter's start, which is most
  of what the suite used to spend.
- ``run_cli_process`` starts ``python -m sparkctl`` as a process: for what only a process shows
  (which modules start-up imports, signals, a real exit of the interpreter, a stand-in module
  other than the CLI). ``SPARKCTL_TEST_SUBPROCESS=1`` sends every ``run_cli`` call there too, to
  check that the two agree.

A plain module (not conftest): with tests/sandbox/conftest.py also present, ``import conftest``
may name either file depending on collection order.
"""

from __future__ import annotations

import _thread
import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A developer's own choices must not change what the tests see (unless a test's env sets them).
_DROPPED_ENV = ("SPARKCTL_INVENTORY", "SPARKCTL_RECIPES", "SPARKCTL_PROFILE")
_EMPTY_CONFIG_HOME = tempfile.mkdtemp(prefix="sparkctl-test-config-")
# Variables a library reads once, when it is imported (huggingface_hub's HF_ENDPOINT, HF_HOME):
# a call that sets one needs a fresh interpreter to see it.
_READ_AT_IMPORT = ("HF_",)


class CliResult:
    def __init__(self, code: int, stdout: str, stderr: str):
        self.code, self.stdout, self.stderr = code, stdout, stderr

    @classmethod
    def of(cls, proc: subprocess.CompletedProcess) -> "CliResult":
        return cls(proc.returncode, proc.stdout, proc.stderr)

    @property
    def returncode(self) -> int:  # the name subprocess.CompletedProcess gives it
        return self.code

    def json(self):
        return json.loads(self.stdout)

    def __repr__(self) -> str:
        return f"<exit {self.code}>\nstdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-4000:]}"


def cli_env(env: dict | None = None) -> dict:
    """The environment a CLI call sees: the test process's, minus ``_DROPPED_ENV``, plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    full_env["PYTHONPATH"] = str(REPO)  # processes the CLI starts (stand-ins, agents) import this checkout
    full_env["XDG_CONFIG_HOME"] = _EMPTY_CONFIG_HOME  # a developer's own `sparkctl init` defaults must not leak in
    full_env.update(env or {})
    return full_env


def run_cli(*args: str, cwd: str | Path | None = None, env: dict | None = None, timeout: float = 300,
            module: str = "sparkctl") -> CliResult:
    """``sparkctl ARGS``, in this process (see the module's docstring). As a process: ``module``
    other than ``sparkctl`` (e.g. ``sparkctl.standin``), and an ``env`` that sets a variable of
    ``_READ_AT_IMPORT``."""
    if os.environ.get("SPARKCTL_TEST_DOCKER_CALLS"):  # opt-in measurement: the hosts' docker calls name this call
        import docker_counting

        docker_counting.on_cli(args)
    read_at_import = any(name.startswith(_READ_AT_IMPORT) for name in env or {})
    if module != "sparkctl" or read_at_import or os.environ.get("SPARKCTL_TEST_SUBPROCESS"):
        return run_cli_process(*args, cwd=cwd, env=env, timeout=timeout, module=module)
    return run_cli_in_process(*args, cwd=cwd, env=env, timeout=timeout)


def run_cli_in_process(*args: str, cwd: str | Path | None = None, env: dict | None = None,
                       timeout: float = 300) -> CliResult:
    """``sparkctl ARGS`` in this process, whatever ``SPARKCTL_TEST_SUBPROCESS`` says (for tests that
    measure the call itself: its memory, its CPU time)."""
    return _run_in_process(list(args), cwd=cwd or REPO, env=cli_env(env), timeout=timeout)


def run_cli_process(*args: str, cwd: str | Path | None = None, env: dict | None = None, timeout: float = 300,
                    module: str = "sparkctl") -> CliResult:
    """``python -m MODULE ARGS`` as a process."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO, env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return CliResult.of(proc)


class _Capture(io.TextIOWrapper):
    """A text stream over bytes (``.buffer`` works, as on a real stdout), never a terminal."""

    def __init__(self):
        super().__init__(io.BytesIO(), encoding="utf-8", errors="replace", write_through=True)

    def text(self) -> str:
        self.flush()
        return self.buffer.getvalue().decode("utf-8", "replace")


def _run_in_process(argv: list[str], *, cwd, env: dict, timeout: float) -> CliResult:
    from sparkctl.cli.main import run

    stdout, stderr = _Capture(), _Capture()
    stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")  # as stdin=DEVNULL: nothing to read
    with _isolated(argv, cwd, env, stdin, stdout, stderr), _deadline(timeout) as interrupts:
        try:
            run()
            code = 0
        except SystemExit as done:
            code = _exit_code(done.code, stderr)
    if interrupts["user"]:  # Ctrl-C while the CLI ran: it stops the test run, as it would a process's
        raise KeyboardInterrupt
    return CliResult(code, stdout.text(), stderr.text())


def _exit_code(value, stderr) -> int:
    """What ``sys.exit(value)`` makes the process's exit status (a message is printed, status 1)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=stderr)
    return 1


@contextlib.contextmanager
def _isolated(argv, cwd, env, stdin, stdout, stderr):
    """The process-wide state one CLI call may touch, set for the call and restored after it."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_argv = sys.argv
    paramiko_log = logging.getLogger("paramiko")
    saved_log = list(paramiko_log.handlers), paramiko_log.level
    os.environ.clear()  # in place: code holding os.environ (default arguments) sees the call's env
    os.environ.update(env)
    os.chdir(cwd)
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    sys.argv = ["sparkctl", *argv]
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        _reset_cli_state(paramiko_log, saved_log)


# What the CLI remembers for the rest of its process, as (module, attribute): each is emptied after
# a call, as a process's end would. (A test may rewrite a file within the same mtime tick.)
_PROCESS_CACHES = (("sparkctl.images.inputs", "_digest_cache"),)


def _reset_cli_state(paramiko_log, saved_log) -> None:
    """Global switches a call may have turned on (``-v``'s echo, ``SPARKCTL_SSH_LOG``'s handler),
    and the process's caches."""
    from sparkctl.remote import echo

    echo.echo_to(None)
    for module, name in _PROCESS_CACHES:
        if module in sys.modules:
            getattr(sys.modules[module], name).clear()
    handlers, level = saved_log
    for handler in paramiko_log.handlers[:]:
        if handler not in handlers:
            paramiko_log.removeHandler(handler)
            handler.close()
    paramiko_log.setLevel(level)


@contextlib.contextmanager
def _deadline(timeout: float):
    """A call that hangs is interrupted after ``timeout`` s (the CLI reports it as exit 130)
    rather than hanging the whole run. A real SIGINT, so a blocking system call (opening a FIFO
    that has no writer) is interrupted too. Yields whether a SIGINT came from elsewhere (a user's
    Ctrl-C, which the CLI turns into exit 130 too): the caller passes that one on."""
    state = {"deadline": False, "user": False}
    caller = threading.get_ident()
    on_main = caller == threading.main_thread().ident

    def expire() -> None:
        state["deadline"] = True
        if on_main:
            signal.pthread_kill(caller, signal.SIGINT)
        else:  # signals reach the main thread only: interrupt Python there, as best we can
            _thread.interrupt_main()

    def on_sigint(signum, frame):
        if not state["deadline"]:
            state["user"] = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint) if on_main else None
    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        yield state
    finally:
        timer.cancel()
        if on_main:
            signal.signal(signal.SIGINT, previous)
