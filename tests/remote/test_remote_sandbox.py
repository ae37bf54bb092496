"""The remote layer against real OpenSSH servers (the sandbox cluster): commands, streams, fan-out,
host-key policy, authentication, timeouts, ssh_config, ssh-agent and ProxyJump."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import subprocess
import threading
import time

import pytest

from sparkctl.remote.connection import Connection
from sparkctl.remote.pool import ConnectionPool, fan_out
from sparkctl.remote.result import RemoteError
from sparkctl.remote.target import SSHTarget
from sparkctl.sandbox import cluster

pytestmark = pytest.mark.sandbox

MB = 1024 * 1024


@pytest.fixture
def targets(sandbox_cluster, isolated_home):
    return sandbox_cluster.targets()


def _host_public_key(sandbox_cluster, host: str) -> str:
    kind, b64 = open(sandbox_cluster.info.host(host).host_key + ".pub").read().split()[:2]
    return f"{kind} {b64}"


def test_run_passes_argv_verbatim_and_reports_exit_stderr_stdin(targets):
    with Connection(targets[0]) as conn:
        tricky = ["a b", "$HOME", "it's", "x;y", "`id`", "", "*"]
        result = conn.run(["printf", "%s\\n"] + tricky)
        assert result.ok and result.stdout == "".join(t + "\n" for t in tricky)
        result = conn.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
        assert (result.exit_code, result.stdout, result.stderr, result.ok) == (7, "out\n", "err\n", False)
        result = conn.run(["tr", "a-z", "A-Z"], stdin=b"hello")
        assert (result.stdout, result.bytes_sent, result.bytes_received) == ("HELLO", 5, 5)
        # No stdin given: the command sees EOF at once instead of hanging.
        assert conn.run(["cat"], timeout=10).stdout == ""
        assert conn.run(["hostname"]).stdout == "spark-1\n"
        assert conn.connected


def test_many_short_commands_on_one_connection_never_drop_it(sandbox_cluster, targets):
    """Short commands on several channels at once (as doctor runs its probes). Sending EOF to a
    command that already exited can reach sshd after the channel is gone, and OpenSSH then drops
    the whole connection ("ieof packet referred to nonexistent channel"); one drop fails the test."""
    from concurrent.futures import ThreadPoolExecutor

    log = sandbox_cluster.info.host("spark-2").logfile("sshd")
    before = os.path.getsize(log)
    with Connection(targets[1]) as conn:
        conn.connect()
        transport = conn._transport
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(lambda i: conn.run(["true"]), range(1500)))
        assert all(r.ok for r in results)
        assert conn._transport is transport and transport.is_active()  # never reconnected
    with open(log, "rb") as handle:
        handle.seek(before)
        assert b"nonexistent channel" not in handle.read()


def test_small_commands_do_not_wait_on_nagle(targets):
    # Without TCP_NODELAY each command's small packets wait for the peer's delayed ACKs (~40 ms each).
    # The property itself, not a wall-clock bound: the socket under the live SSH transport (the one
    # every command of this connection goes through) has Nagle's algorithm turned off.
    import socket

    with Connection(targets[0]) as conn:
        assert conn.run(["true"]).ok
        sock = conn._transport.sock
        assert isinstance(sock, socket.socket) and sock.type == socket.SOCK_STREAM
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert sock.getpeername()  # connected: the live transport's own socket
        for _ in range(5):
            assert conn.run(["true"]).ok
        assert conn._transport.sock is sock  # still the same socket after more commands (no reconnect)


def test_streams_50_mb_in_and_out_with_byte_counts(targets):
    payload = os.urandom(50 * MB)
    digest = hashlib.sha256(payload).hexdigest()
    progress_in: list[int] = []
    with Connection(targets[1]) as conn:
        chunks = (payload[i:i + 4 * MB] for i in range(0, len(payload), 4 * MB))
        started = time.monotonic()
        result = conn.run_stream_in(["sh", "-c", "cat > /mnt/nvme/blob && sha256sum /mnt/nvme/blob"], chunks,
                                    on_progress=progress_in.append, timeout=120)
        seconds_in = time.monotonic() - started
        assert result.ok, result.stderr
        assert result.stdout.split()[0] == digest
        assert result.bytes_sent == len(payload)
        assert progress_in == sorted(progress_in) and progress_in[-1] == len(payload) and len(progress_in) >= 50

        received = hashlib.sha256()
        progress_out: list[int] = []
        started = time.monotonic()
        result = conn.run_stream_out(["cat", "/mnt/nvme/blob"], received.update, on_progress=progress_out.append, timeout=120)
        seconds_out = time.monotonic() - started
        assert result.ok and result.stdout == ""
        assert result.bytes_received == len(payload) and received.hexdigest() == digest
        assert progress_out[-1] == len(payload)
        conn.run(["rm", "/mnt/nvme/blob"])
    print(f"\nstream 50 MiB: in {50 / seconds_in:.0f} MiB/s, out {50 / seconds_out:.0f} MiB/s")


def test_stream_in_stops_when_the_command_stops_reading(targets):
    with Connection(targets[0]) as conn:
        chunks = (b"x" * MB for _ in range(200))
        result = conn.run_stream_in(["head", "-c", "10"], chunks, timeout=60)
    assert result.ok and result.stdout == "x" * 10
    assert result.bytes_sent < 200 * MB


def test_a_failing_sink_reaches_the_caller(targets):
    def sink(_: bytes) -> None:
        raise OSError("disk full")

    with Connection(targets[0]) as conn:
        with pytest.raises(OSError, match="disk full"):
            conn.run_stream_out(["head", "-c", "1000000", "/dev/zero"], sink, timeout=30)
        assert conn.run(["true"]).ok  # the connection is still usable


def test_command_timeout(targets):
    with Connection(targets[0]) as conn:
        started = time.monotonic()
        with pytest.raises(RemoteError) as err:
            conn.run(["sleep", "30"], timeout=1)
        assert err.value.cause == "timeout" and "within 1s: sleep 30" in str(err.value)  # the argv as given
        # Cut at its 1 s timeout, not waited out to the command's 30 s end: a bound far from both, so
        # a loaded machine that starves this process for seconds does not fail it.
        assert time.monotonic() - started < 30 / 3
        assert conn.run(["true"], timeout=10).ok


def test_many_commands_at_once_on_one_connection(targets):
    with Connection(targets[2]) as conn:
        results = [None] * 8

        def work(i):
            results[i] = conn.run(["sh", "-c", f"sleep 0.2; echo {i}"]).stdout

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [f"{i}\n" for i in range(8)]


def test_a_dropped_connection_is_reported_then_reopened(targets):
    with Connection(targets[2]) as conn:
        first = conn.run(["sh", "-c", "echo $PPID"]).stdout.strip()
        # Kill this connection's own sshd process on the host: the link drops mid-command.
        with pytest.raises(RemoteError) as err:
            conn.run(["sh", "-c", "kill -9 $PPID; sleep 5"], timeout=20)
        assert err.value.cause == "closed"
        second = conn.run(["sh", "-c", "echo $PPID"]).stdout.strip()
        assert second and second != first


def test_fan_out_reports_every_host_and_the_cause_of_a_stopped_sshd(sandbox_cluster, targets):
    stopped = cluster.stop_sshd(sandbox_cluster.info, "spark-2")
    assert stopped
    connect_timeout = 5
    try:
        with ConnectionPool(connect_timeout=connect_timeout) as pool:
            results = fan_out(targets, lambda c: c.run(["hostname"]).stdout.strip(), pool=pool)
    finally:
        cluster.start_sshd(sandbox_cluster.info, "spark-2")
    assert [r.name for r in results] == ["spark-1", "spark-2", "spark-3"]
    assert [(r.ok, r.value, r.cause) for r in results] == [
        (True, "spark-1", None), (False, None, "refused"), (True, "spark-3", None)]
    assert results[1].error.startswith("spark-2: ") and "\n" not in results[1].error
    assert results[1].seconds < connect_timeout  # refused at once, not waited out


def test_fan_out_is_bounded_and_keeps_input_order(targets):
    def slow(conn):
        conn.run(["sleep", "0.4"])
        return conn.name

    with ConnectionPool() as pool:
        fan_out(targets, lambda c: None, pool=pool)  # connect first, so timings below are the work
        started = time.monotonic()
        serial = fan_out(targets, slow, pool=pool, max_workers=1)
        serial_seconds = time.monotonic() - started
        started = time.monotonic()
        parallel = fan_out(list(reversed(targets)), slow, pool=pool, max_workers=16)
        parallel_seconds = time.monotonic() - started
        assert pool.get(targets[0]) is pool.get(targets[0])
    assert [r.value for r in serial] == ["spark-1", "spark-2", "spark-3"]
    assert [r.value for r in parallel] == ["spark-3", "spark-2", "spark-1"]
    assert serial_seconds >= 3 * 0.4  # sleeps: load can only lengthen them
    assert parallel_seconds < serial_seconds / 2  # 3x side by side when the three run at once


def test_fan_out_turns_a_failing_step_into_that_hosts_result(targets):
    def step(conn):
        if conn.name == "spark-3":
            raise ValueError("disk too small\n(needs 600 GB)")
        return conn.run(["true"]).exit_code

    with ConnectionPool() as pool:
        results = fan_out(targets, step, pool=pool)
    assert [(r.ok, r.value) for r in results[:2]] == [(True, 0), (True, 0)]
    assert (results[2].ok, results[2].cause, results[2].error) == (False, None, "spark-3: disk too small (needs 600 GB)")


def test_changed_host_key_is_refused_even_with_accept_new(sandbox_cluster, targets, tmp_path):
    wrong = tmp_path / "known_hosts"
    client_key = open(sandbox_cluster.info.identity_file + ".pub").read().split()[:2]  # an ed25519 key, not spark-1's
    wrong.write_text(f"{targets[0].address} {' '.join(client_key)}\n")
    target = dataclasses.replace(targets[0], known_hosts=str(wrong))
    for accept in (False, True):
        with pytest.raises(RemoteError) as err:
            Connection(target, accept_new_host_keys=accept).connect()
        assert err.value.cause == "hostkey-changed"
        assert "spark-1" in str(err.value) and "CHANGED" in str(err.value)
    assert wrong.read_text() == f"{targets[0].address} {' '.join(client_key)}\n"


def test_a_host_key_alias_checks_the_key_under_another_name(sandbox_cluster, targets, tmp_path):
    """As distribute does for a fabric address: connect to one address, check the key recorded for
    another name (the management address)."""
    known = tmp_path / "known_hosts"
    known.write_text(f"spark-2-by-name {_host_public_key(sandbox_cluster, 'spark-2')}\n")
    target = dataclasses.replace(targets[1], known_hosts=str(known))
    with pytest.raises(RemoteError) as err:
        Connection(target).connect()  # no entry for its address
    assert err.value.cause == "hostkey-unknown"
    with Connection(dataclasses.replace(target, host_key_alias="spark-2-by-name")) as conn:
        assert conn.run(["hostname"]).stdout == "spark-2\n"
    impostor = dataclasses.replace(targets[2], known_hosts=str(known), host_key_alias="spark-2-by-name")
    with pytest.raises(RemoteError) as err:
        Connection(impostor).connect()  # spark-3 presenting its own key under spark-2's name
    assert err.value.cause == "hostkey-changed"


def test_unknown_host_key_is_refused_then_accepted_and_recorded(sandbox_cluster, targets, tmp_path):
    known = tmp_path / "inventory_known_hosts"
    known.write_text("")
    target = dataclasses.replace(targets[1], known_hosts=str(known))
    with pytest.raises(RemoteError) as err:
        Connection(target).connect()
    assert err.value.cause == "hostkey-unknown" and "--accept-new-host-keys" in str(err.value)
    with Connection(target, accept_new_host_keys=True) as conn:
        assert conn.run(["hostname"]).stdout == "spark-2\n"
        assert conn.recorded_host_key
    assert known.read_text() == f"{target.address} {_host_public_key(sandbox_cluster, 'spark-2')}\n"
    with Connection(target) as conn:  # known now: no flag needed
        assert conn.run(["true"]).ok and not conn.recorded_host_key


def test_accept_new_without_inventory_file_records_in_user_known_hosts(sandbox_cluster, targets, isolated_home):
    target = dataclasses.replace(targets[2], known_hosts=None)
    with pytest.raises(RemoteError, match="hostkey-unknown"):
        Connection(target).connect()
    with Connection(target, accept_new_host_keys=True) as conn:
        assert conn.run(["true"]).ok
    user_file = os.path.join(isolated_home, ".ssh", "known_hosts")
    assert open(user_file).read() == f"{target.address} {_host_public_key(sandbox_cluster, 'spark-3')}\n"
    assert os.stat(os.path.dirname(user_file)).st_mode & 0o777 == 0o700
    with Connection(target) as conn:
        assert conn.run(["true"]).ok


def test_hashed_user_known_hosts_is_honoured(sandbox_cluster, targets, isolated_home):
    ssh_dir = os.path.join(isolated_home, ".ssh")
    os.makedirs(ssh_dir)
    path = os.path.join(ssh_dir, "known_hosts")
    with open(path, "w") as handle:
        handle.write(f"{targets[0].address} {_host_public_key(sandbox_cluster, 'spark-1')}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", path], check=True, capture_output=True)
    with Connection(dataclasses.replace(targets[0], known_hosts=None)) as conn:
        assert conn.run(["true"]).ok


def test_wrong_or_missing_identity_file_is_an_auth_error(targets, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(RemoteError) as err:
        Connection(dataclasses.replace(targets[0], identity_file=str(stranger))).connect()
    assert err.value.cause == "auth" and str(stranger) in str(err.value) and "\n" not in str(err.value)
    missing = str(tmp_path / "nope")
    with pytest.raises(RemoteError) as err:
        Connection(dataclasses.replace(targets[0], identity_file=missing)).connect()
    assert err.value.cause == "auth" and f"identity file {missing} does not exist" in str(err.value)


def test_unreachable_address_times_out_within_the_timeout(sandbox_cluster, targets):
    target = dataclasses.replace(targets[0], name="ghost", address=sandbox_cluster.info.blackhole_address)
    timeout = 1.5
    started = time.monotonic()
    with pytest.raises(RemoteError) as err:
        Connection(target, connect_timeout=timeout).connect()
    elapsed = time.monotonic() - started
    assert err.value.cause == "timeout" and str(err.value).startswith("ghost: ")
    # The given timeout, not the default one (10 s) nor the kernel's SYN retries (minutes): a sleep-like
    # wait that load only lengthens, so the lower bound is exact and the upper one leaves load room.
    default = Connection(target).connect_timeout
    assert 0.9 * timeout <= elapsed < default / 2, (elapsed, timeout, default)


def test_closed_port_is_refused(targets):
    with pytest.raises(RemoteError) as err:
        Connection(dataclasses.replace(targets[0], port=2222)).connect()
    assert err.value.cause == "refused" and ":2222" in str(err.value)


def test_ssh_config_fills_what_the_target_leaves_out(sandbox_cluster, targets, isolated_home, tmp_path):
    info = sandbox_cluster.info
    bare = [SSHTarget(name=t.name, address=t.address, known_hosts=info.known_hosts) for t in targets]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host spark-1\n  User nvidia\n  IdentityFile {info.identity_file}\n"
        f"Host spark-2\n  User nvidia\n  Port 2222\n  IdentityFile {info.identity_file}\n"
    )
    with Connection(bare[0], ssh_config_path=str(config)) as conn:
        assert conn.run(["whoami"]).stdout == "nvidia\n"
    with pytest.raises(RemoteError) as err:  # the config's Port is used, and nothing listens there
        Connection(bare[1], ssh_config_path=str(config)).connect()
    assert err.value.cause == "refused"
    # Without a path, ~/.ssh/config is read.
    os.makedirs(os.path.join(isolated_home, ".ssh"))
    with open(os.path.join(isolated_home, ".ssh", "config"), "w") as handle:
        handle.write(f"Host spark-*\n  User nvidia\n  IdentityFile {info.identity_file}\n")
    with Connection(bare[2]) as conn:
        assert conn.run(["hostname"]).stdout == "spark-3\n"
    # No key anywhere: a clear auth error.
    os.unlink(os.path.join(isolated_home, ".ssh", "config"))
    with pytest.raises(RemoteError) as err:
        Connection(dataclasses.replace(bare[2], user="nvidia")).connect()
    assert err.value.cause == "auth" and "no key at all" in str(err.value)


@pytest.fixture
def ssh_agent(tmp_path, monkeypatch, sandbox_cluster):
    sock = str(tmp_path / "agent.sock")
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.02)
        env = dict(os.environ, SSH_AUTH_SOCK=sock)
        subprocess.run(["ssh-add", "-q", sandbox_cluster.info.identity_file], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        yield sock
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=5)


def test_keys_from_ssh_agent(targets, isolated_home, ssh_agent):
    target = dataclasses.replace(targets[0], identity_file=None)
    with Connection(target) as conn:
        assert conn.run(["hostname"]).stdout == "spark-1\n"
    subprocess.run(["ssh-add", "-D"], env=dict(os.environ, SSH_AUTH_SOCK=ssh_agent), check=True, capture_output=True)
    with pytest.raises(RemoteError) as err:
        Connection(target).connect()
    assert err.value.cause == "auth" and "ssh-agent holds no keys" in str(err.value)


def test_proxy_jump_goes_through_the_jump_host(sandbox_cluster, targets):
    head, _, far = targets
    target = dataclasses.replace(far, proxy_jump=f"nvidia@{head.address}")
    with Connection(target) as conn:
        client_ip = conn.run(["sh", "-c", "echo ${SSH_CONNECTION%% *}"]).stdout.strip()
    assert client_ip == head.address  # spark-3 saw the connection come from spark-1
    with pytest.raises(RemoteError) as err:
        Connection(dataclasses.replace(far, port=2222, proxy_jump=f"nvidia@{head.address}")).connect()
    assert err.value.cause == "refused" and "jump host" in str(err.value)
