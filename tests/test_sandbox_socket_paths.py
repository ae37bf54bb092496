"""`sandbox up` under a state root too long for its hosts' Docker sockets: refused at once, in one line
naming SPARKCTL_SANDBOX_ROOT, exit 2, nothing written (a dockerd whose socket path passes the 108-byte
Unix limit starts but can never be reached)."""

from __future__ import annotations

import os

import pytest

from sparkctl.sandbox import cluster
from sparkctl.sandbox import layout as L

SUFFIX = "/t/hosts/spark-1/run/docker.sock"  # after the root, for sandbox "t" with one host


def _root_for(tmp_path, socket_bytes: int) -> str:
    """A root whose host socket path is exactly ``socket_bytes`` long (never made: planning touches no
    disk). From a short base, not ``tmp_path``: that alone can pass 107 bytes (pytest-1000/popen-gw10)."""
    base = f"/tmp/sbxlen-{os.getpid()}/r"
    pad = socket_bytes - len(base) - len(SUFFIX)
    assert pad > 0
    return base + "x" * pad


def test_the_longest_path_that_fits_is_taken_and_one_byte_more_is_refused(tmp_path):
    fits = L.plan("t", 1, root=_root_for(tmp_path, L.UNIX_PATH_MAX - 1))
    assert len(fits.hosts[0].docker_socket) == 107 and L.long_socket_paths(fits) == []
    L.check_socket_paths(fits)
    over = L.plan("t", 1, root=_root_for(tmp_path, L.UNIX_PATH_MAX))
    with pytest.raises(L.LayoutError) as err:
        L.check_socket_paths(over)
    assert str(err.value).startswith(f"SPARKCTL_SANDBOX_ROOT={_root_for(tmp_path, L.UNIX_PATH_MAX)} is too long")
    assert "108 bytes, 1 over the 108-byte Unix socket limit" in str(err.value)


def test_up_refuses_before_it_writes_anything(tmp_path, monkeypatch):
    root = _root_for(tmp_path, 130)
    monkeypatch.setenv(L.ROOT_ENV, root)
    with pytest.raises(cluster.SandboxError) as err:
        cluster.refuse_long_socket_paths("t", 1)
    message = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in message and message.startswith(f"{L.ROOT_ENV}={root} is too long")
    assert "23 over the 108-byte Unix socket limit" in message
    assert not os.path.exists(root)  # refused before the state root (or its lock) was made
    # more hosts: the longest host name decides (spark-10 is one byte longer than spark-9)
    monkeypatch.setenv(L.ROOT_ENV, _root_for(tmp_path, 107))
    cluster.refuse_long_socket_paths("t", 9)
    with pytest.raises(cluster.SandboxError, match=", 1 over the 108-byte"):
        cluster.refuse_long_socket_paths("t", 10)
