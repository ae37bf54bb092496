"""The transport layer without a host: the local process transport, the fake, shipping an agent,
the one place ssh argv are built, and routes probed in parallel."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from sparkctl.errors import OperationFailed
from sparkctl.remote import openssh
from sparkctl.remote.fake import Answer, FakeTransport
from sparkctl.remote.process import ProcessTransport, local
from sparkctl.remote.result import RemoteError
from sparkctl.remote.target import SSHTarget
from sparkctl.remote.transport import ship_agent

TARGET = SSHTarget(name="spark-2", address="10.0.0.12", port=22, user="root", known_hosts="/inv/known_hosts")


def test_local_process_streams_in_and_out_with_byte_counts():
    transport = local()
    chunks = [b"a" * 70000, b"b" * 5]
    seen = []
    result = transport.run_stream_in([sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))"],
                                     iter(chunks), on_progress=seen.append)
    assert result.exit_code == 0 and result.stdout.strip() == "70005"
    assert result.bytes_sent == 70005 and seen[-1] == 70005
    blocks = []
    result = transport.run_stream_out([sys.executable, "-c", "import sys; sys.stdout.write('x' * 300000)"], blocks.append)
    assert result.stdout == "" and result.bytes_received == 300000 and b"".join(blocks) == b"x" * 300000


def test_local_process_keeps_the_exit_status_and_stderr():
    result = local().run([sys.executable, "-c", "import sys; sys.stderr.write('no\\n'); sys.exit(3)"])
    assert (result.exit_code, result.stderr.strip()) == (3, "no")


def test_an_ssh_client_that_fails_to_connect_is_a_remote_error_not_an_exit_status():
    fake_ssh = ProcessTransport("spark-2", wrap=lambda argv: [sys.executable, "-c",
                                                              "import sys; sys.stderr.write('refused\\n'); sys.exit(255)"],
                                where="10.0.0.12")
    with pytest.raises(RemoteError) as caught:
        fake_ssh.run(["true"])
    assert caught.value.cause == "closed" and "ssh to 10.0.0.12: refused" in str(caught.value)
    # Without an ssh client in between, 255 is just the command's status.
    assert local().run([sys.executable, "-c", "import sys; sys.exit(255)"]).exit_code == 255


def test_close_kills_a_running_stream():
    transport = local()
    outcome = {}

    def run():
        outcome["result"] = transport.run([sys.executable, "-c", "import time; time.sleep(60)"])

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    transport.close()
    thread.join(30)
    assert not thread.is_alive() and outcome["result"].exit_code != 0


def test_a_timeout_is_a_remote_error():
    with pytest.raises(RemoteError) as caught:
        local().run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert caught.value.cause == "timeout"


def test_ship_agent_writes_the_zip_runs_it_and_removes_its_folder():
    fake = FakeTransport("spark-1", {
        ("mktemp",): Answer(stdout="/tmp/sparkctl-x.abc\n"),
        ("sh", "-c"): Answer(),
        ("python3",): Answer(stdout='noise\n{"free": 5}\n'),
        ("rm",): Answer(),
    })
    agent = ship_agent(fake, b"PK-zip", prefix="sparkctl-x")
    assert agent.path == "/tmp/sparkctl-x.abc/agent.pyz"
    assert fake.ran("sh", "-c")[0].stdin == b"PK-zip" and fake.ran("sh", "-c")[0].argv[-1] == agent.path
    assert agent.json(["probe", "/d"]) == {"free": 5}
    assert fake.ran("python3")[0].argv == ["python3", agent.path, "probe", "/d"]
    agent.remove()
    assert fake.ran("rm")[0].argv == ["rm", "-rf", "--", "/tmp/sparkctl-x.abc"]


def test_ship_agent_cleans_up_when_the_copy_fails_and_says_which_host():
    fake = FakeTransport("spark-1", {
        ("mktemp",): Answer(stdout="/tmp/sparkctl-x.abc\n"),
        ("sh", "-c"): Answer(exit_code=1, stderr="No space left on device"),
        ("rm",): Answer(),
    })
    with pytest.raises(OperationFailed, match="spark-1: could not write .*No space left"):
        ship_agent(fake, b"zip", prefix="sparkctl-x")
    assert fake.ran("rm")


def test_an_agent_without_python3_says_so():
    fake = FakeTransport("spark-1", {("mktemp",): Answer(stdout="/tmp/d\n"), ("sh",): Answer(),
                                     ("python3",): Answer(exit_code=127, stderr="python3: not found")})
    with pytest.raises(OperationFailed, match="python3 is needed on the host for model sync"):
        ship_agent(fake, b"zip", prefix="p").json(["probe"], purpose="model sync")


def test_the_fake_refuses_an_unrecorded_command_and_plays_a_dead_host():
    with pytest.raises(AssertionError, match="no recorded answer"):
        FakeTransport("h").run(["uptime"])
    with pytest.raises(RemoteError) as caught:
        FakeTransport("h", unreachable="refused").run(["uptime"])
    assert caught.value.cause == "refused"


def test_peer_argv_pins_the_verified_key_and_quotes_the_remote_command():
    host = type("Host", (), {"fabric_address": "10.1.0.12"})()
    argv = openssh.peer_argv(host, TARGET, "spark-2", ["python3", "/tmp/a b/agent.pyz", "receive", "/m"])
    assert argv[:3] == ["ssh", "-o", "UserKnownHostsFile={known_hosts}"]
    assert "StrictHostKeyChecking=yes" in argv and "StrictHostKeyChecking=no" not in argv
    assert "HostKeyAlias=spark-2" in argv
    assert argv[-3:] == ["--", "10.1.0.12", "python3 '/tmp/a b/agent.pyz' receive /m"]
    check = openssh.peer_check_argv("spark-2 ssh-ed25519 AAAA", host, TARGET, "spark-2")
    assert check[:2] == ["sh", "-c"] and check[-3:] == ["--", "10.1.0.12", "true"]


def test_routes_are_probed_in_parallel():
    """Eight hosts whose fabric address hangs cost one probe's wait, not eight."""
    waits = []

    def slow_probe(address, port):
        started = time.monotonic()
        time.sleep(0.3)
        waits.append(time.monotonic() - started)
        return False

    hosts = [(f"s{i}", SSHTarget(name=f"s{i}", address=f"10.0.0.{i}"), (f"10.1.0.{i}",)) for i in range(8)]
    started = time.monotonic()
    routes = openssh.choose_routes(hosts, probe=slow_probe)
    elapsed = time.monotonic() - started
    assert sorted(routes) == [f"s{i}" for i in range(8)]
    assert all(not r.via_fabric and r.address == r.target.address for r in routes.values())
    assert elapsed < sum(waits) / 2  # a ratio: serial probing would take the sum
