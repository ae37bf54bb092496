"""Faults a sandbox host can be given, and taken back: for the tests that check a broken host never
reads as a healthy answer.

Each fault is a context manager: entering breaks the host, leaving repairs it (also when the test
fails), so one shared cluster serves every case. What each one does to the host:

- ``dockerd_stopped``: the host's Docker engine is stopped (its containers with it); SSH still works.
- ``sshd_hung``: the host's sshd is stopped with SIGSTOP: the kernel accepts connections, nothing answers.
- ``unreachable``: the host's management link is down: nothing reaches its address.
- ``disk_full``: a folder on the host is replaced by a full, tiny filesystem (a tmpfs the size of
  what it holds, plus a filler file): every write there fails with "No space left on device".
- ``engine_killed``: the engine container's processes are killed with SIGKILL (a crash).
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Iterator

from sparkctl.sandbox import cluster
from sparkctl.sandbox.layout import SandboxLayout

FAULTS = ("dockerd_stopped", "sshd_hung", "unreachable", "disk_full", "engine_killed")


def _layout(sandbox) -> SandboxLayout:
    return sandbox if isinstance(sandbox, SandboxLayout) else cluster.load(sandbox)


@contextlib.contextmanager
def dockerd_stopped(sandbox, host: str) -> Iterator[None]:
    cluster.stop_service(sandbox, host, "dockerd")
    try:
        yield
    finally:
        cluster.start_service(sandbox, host, "dockerd")


@contextlib.contextmanager
def sshd_hung(sandbox, host: str) -> Iterator[None]:
    pid = cluster.host_pids(sandbox, host)["sshd"]
    if pid is None:
        raise cluster.SandboxError(f"{host}: sshd is not running")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def unreachable(sandbox, host: str) -> Iterator[None]:
    """The host's end of its management link goes down: its address answers nothing (sessions
    already open hang, new ones time out), as when a box loses power or its cable."""
    veth = _layout(sandbox).host(host).veth_mgmt
    cluster._run(["ip", "link", "set", veth, "down"])
    try:
        yield
    finally:
        cluster._run(["ip", "link", "set", veth, "up"])


_FILL_SCRIPT = r"""set -eu
path=$1; spare_kib=$2
used=$(du -sk "$path" | cut -f1)
size=$((used + spare_kib + 64))
mkdir -p /tmp/sparkctl-fault
keep=$(mktemp -d /tmp/sparkctl-fault/keep.XXXXXX)
cp -a "$path/." "$keep/"
mount -t tmpfs -o "size=${size}k,mode=755" sparkctl-disk-full "$path"
cp -a "$keep/." "$path/"
rm -rf "$keep"
dd if=/dev/zero of="$path/.sparkctl-fault-filler" bs=64k 2>/dev/null || true
"""


@contextlib.contextmanager
def disk_full(sandbox, host: str, path: str, spare_kib: int = 0) -> Iterator[None]:
    """``path`` on ``host`` (inside the host: /var/lib/sparkctl, /mnt/nvme/...) full: its content
    stays readable, nothing more can be written (``spare_kib`` left free). Leaving unmounts it:
    whatever was written meanwhile goes, what was there before is back."""
    cluster.exec_in_host(sandbox, host, ["mkdir", "-p", path], check=True)
    cluster.exec_in_host(sandbox, host, ["sh", "-c", _FILL_SCRIPT, "fill", path, str(spare_kib)], check=True)
    try:
        yield
    finally:
        # Lazily: a process may still hold a file there (a container's mounts, a shell's cwd).
        cluster.exec_in_host(sandbox, host, ["umount", "--lazy", path], check=True)


# By PID from outside the engine, not `docker kill`: docker then sees a crash (exit 137), not a stop.
_KILL_SCRIPT = r"""set -eu
pid=$(docker inspect --format '{{.State.Pid}}' "$1")
[ "$pid" -gt 0 ]
kill -KILL "$pid"
"""


@contextlib.contextmanager
def engine_killed(sandbox, host: str, container: str) -> Iterator[None]:
    """The engine's processes in ``container`` die of SIGKILL, as in a crash (docker's restart
    policy may bring it back). Leaving changes nothing: restarting it is the verbs' job."""
    cluster.exec_in_host(sandbox, host, ["sh", "-c", _KILL_SCRIPT, "kill", container], check=True)
    yield


def inject(sandbox, fault: str, host: str, **where):
    """The context manager of fault ``fault`` (one of FAULTS) on ``host``."""
    if fault == "disk_full":
        return disk_full(sandbox, host, where["path"], where.get("spare_kib", 0))
    if fault == "engine_killed":
        return engine_killed(sandbox, host, where["container"])
    return {"dockerd_stopped": dockerd_stopped, "sshd_hung": sshd_hung, "unreachable": unreachable}[fault](sandbox, host)
