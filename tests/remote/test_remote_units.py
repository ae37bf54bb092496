"""The remote layer's pure parts: argv quoting, errors, known_hosts matching, ssh_config resolution."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import pickle
import shlex
import subprocess
import sys

import paramiko
import pytest

from sparkctl.remote.connection import join_argv
from sparkctl.remote.hostkeys import HostKeyPolicy, KnownHostsFile, hostkey_name, names_match
from sparkctl.remote.result import CAUSES, CommandResult, HostResult, RemoteError
from sparkctl.remote.sshconfig import jump_hops, resolve
from sparkctl.remote.target import SSHTarget


def test_join_argv_quotes_every_element():
    argv = ["printf", "%s\n", "a b", "$HOME", "it's", "x;y", "", "*"]
    line = join_argv(argv)
    assert shlex.split(line) == argv
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True).stdout
    assert out == "a b\n$HOME\nit's\nx;y\n\n*\n"


@pytest.mark.parametrize("bad, error", [("ls -l", TypeError), ([], ValueError), (["echo", 3], TypeError)])
def test_join_argv_refuses_what_is_not_an_argv(bad, error):
    with pytest.raises(error):
        join_argv(bad)


def test_remote_error_is_one_line_naming_host_and_cause():
    err = RemoteError("spark-2", "refused", "connection to 10.0.0.2:22\nrefused")
    assert str(err) == "spark-2: connection to 10.0.0.2:22 refused [refused]"
    assert (err.host, err.cause, err.exit_code) == ("spark-2", "refused", 1)
    with pytest.raises(ValueError):
        RemoteError("h", "exploded", "x")
    copied = pickle.loads(pickle.dumps(err))
    assert (str(copied), copied.cause, copied.host) == (str(err), "refused", "spark-2")
    assert set(CAUSES) == {"refused", "timeout", "auth", "hostkey-unknown", "hostkey-changed", "dns", "closed", "other"}


def test_result_types():
    assert CommandResult(0, "", "", 0.1).ok and not CommandResult(1, "", "", 0.1).ok
    result = HostResult(name="a", ok=True, value=3, error=None, cause=None, seconds=0.0)
    assert result.value == 3


def test_hostkey_names_and_patterns():
    assert hostkey_name("10.0.0.1", 22) == "10.0.0.1"
    assert hostkey_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"
    assert names_match("[10.0.0.1]:2222", ["[10.0.0.1]:2222"])
    assert not names_match("10.0.0.1", ["[10.0.0.1]:2222"])
    assert names_match("10.0.0.7", ["10.0.0.*", "!10.0.0.2"])
    assert not names_match("10.0.0.2", ["10.0.0.*", "!10.0.0.2"])
    assert names_match("Spark-1", ["spark-1"])  # host names are case-insensitive
    salt = os.urandom(20)
    hashed = "|1|{}|{}".format(base64.b64encode(salt).decode(),
                               base64.b64encode(hmac.new(salt, b"10.0.0.9", hashlib.sha1).digest()).decode())
    assert names_match("10.0.0.9", [hashed]) and not names_match("10.0.0.8", [hashed])


def _pubkey(tmp_path, name="k") -> tuple[str, paramiko.PKey]:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    kind, b64 = (tmp_path / f"{name}.pub").read_text().split()[:2]
    return f"{kind} {b64}", paramiko.PKey.from_path(str(path))


def test_policy_known_changed_unknown_revoked_and_accept_new(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    good_line, good = _pubkey(tmp_path, "good")
    _, other = _pubkey(tmp_path, "other")
    inventory_kh = tmp_path / "kh"
    inventory_kh.write_text(f"# comment\n\ngarbage line\n10.0.0.1 {good_line}\n")
    policy = HostKeyPolicy(str(inventory_kh), accept_new=False)
    assert policy.verify("spark-1", ["10.0.0.1"], good) is False
    with pytest.raises(RemoteError) as changed:
        policy.verify("spark-1", ["10.0.0.1"], other)
    assert changed.value.cause == "hostkey-changed" and f"{inventory_kh}:4" in str(changed.value)
    with pytest.raises(RemoteError) as unknown:
        policy.verify("spark-2", ["10.0.0.2"], good)
    assert unknown.value.cause == "hostkey-unknown" and "--accept-new-host-keys" in str(unknown.value)
    # accept-new records into the inventory's file, once, and never overrides a changed key.
    accepting = HostKeyPolicy(str(inventory_kh), accept_new=True)
    assert accepting.verify("spark-2", ["10.0.0.2"], other) is True
    assert accepting.verify("spark-2", ["10.0.0.2"], other) is False
    assert inventory_kh.read_text().count("10.0.0.2 ssh-ed25519") == 1
    with pytest.raises(RemoteError, match="CHANGED"):
        accepting.verify("spark-1", ["10.0.0.1"], other)
    # ~/.ssh/known_hosts counts as well, and @revoked wins over any match.
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text(f"10.0.0.3 {good_line}\n@revoked * {good_line}\n")
    with pytest.raises(RemoteError, match="revoked") as revoked:
        policy.verify("spark-3", ["10.0.0.3"], good)
    assert revoked.value.cause == "hostkey-changed"


def test_known_hosts_file_reads_ssh_keygen_hashed_entries(tmp_path):
    line, key = _pubkey(tmp_path)
    path = tmp_path / "kh"
    path.write_text(f"10.0.0.5 {line}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], check=True, capture_output=True)
    assert path.read_text().startswith("|1|")
    assert [k.asbytes() for _, k in KnownHostsFile(str(path)).keys_for(["10.0.0.5"])] == [key.asbytes()]
    assert KnownHostsFile(str(path)).keys_for(["10.0.0.6"]) == []


def test_resolve_prefers_target_then_ssh_config_then_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "config"
    config.write_text(
        "Host spark-1\n  User nvidia\n  Port 2200\n  IdentityFile ~/keys/spark\n  ProxyJump bastion\n"
        "Host 10.9.9.*\n  User fromaddress\n"
        "Host *\n  HostKeyAlias shared-alias\n"
    )
    r = resolve(SSHTarget(name="spark-1", address="10.9.9.1"), str(config))
    assert (r.address, r.user, r.port, r.proxy_jump) == ("10.9.9.1", "nvidia", 2200, "bastion")
    assert r.identity_files == (str(tmp_path / "keys" / "spark"),) and not r.default_identities
    assert r.host_key_alias == "shared-alias"
    r = resolve(SSHTarget(name="spark-1", address="10.9.9.1", user="root", port=22, identity_file="/k",
                          proxy_jump="none"), str(config))
    assert (r.user, r.port, r.identity_files[0], r.proxy_jump) == ("root", 22, "/k", None)
    r = resolve(SSHTarget(name="spark-7", address="10.9.9.7"), str(config))
    assert (r.user, r.port, r.identity_files, r.default_identities) == ("fromaddress", 22, (), True)
    r = resolve(SSHTarget(name="x", address="192.0.2.99"), str(tmp_path / "absent"))
    assert (r.port, r.proxy_jump, r.host_key_alias) == (22, None, None) and r.user


MATCH_EXEC_CHILD = r"""
import json, sys, threading
from sparkctl.remote.sshconfig import resolve
from sparkctl.remote.target import SSHTarget
before = sorted(m for m in sys.modules if m.split(".")[0] in ("invoke", "unittest", "asyncio") and m != "invoke")
users = {}
def one(name):
    users[name] = resolve(SSHTarget(name=name, address="10.9.9.1"), sys.argv[1]).user
threads = [threading.Thread(target=one, args=(f"spark-{i}",)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"before": before, "users": users, "loaded": "invoke.context" in sys.modules}))
"""


def test_match_exec_works_though_invoke_is_imported_only_when_a_config_needs_it(tmp_path):
    # paramiko runs ``Match exec`` through invoke, which sparkctl.remote imports on first use
    # (it costs a third of paramiko's import): the lookups still run it, from parallel threads
    config = tmp_path / "config"
    config.write_text('Match host spark-1,spark-3 exec "true"\n  User matched\n'
                      'Match host spark-2 exec "false"\n  User never\nHost *\n  User plain\n')
    proc = subprocess.run([sys.executable, "-c", MATCH_EXEC_CHILD, str(config)], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["before"] == []  # importing the transport loaded none of invoke, unittest, asyncio
    assert found["users"] == {"spark-0": "plain", "spark-1": "matched", "spark-2": "plain", "spark-3": "matched"}
    assert found["loaded"]


def test_jump_hops_parse_openssh_syntax(tmp_path):
    config = tmp_path / "config"
    config.write_text("Host bastion\n  HostName 10.1.1.1\n  IdentityFile /keys/bastion\n")
    via = SSHTarget(name="spark-2", address="10.0.0.2", identity_file="/keys/inv", known_hosts="/kh")
    hops = jump_hops("admin@bastion:2222,10.0.0.1", via, str(config))
    assert [(h.address, h.user, h.port, h.identity_file, h.known_hosts) for h in hops] == [
        ("10.1.1.1", "admin", 2222, None, "/kh"),
        ("10.0.0.1", None, None, "/keys/inv", "/kh"),
    ]
    with pytest.raises(RemoteError, match="cannot parse"):
        jump_hops("a b", via, str(config))


class _ChannelOfADroppedLink:
    """A command's channel whose output the sink refuses, on a link that is gone by the time the channel
    closes: closing sends a message, which paramiko then fails with EOFError."""

    closed = eof_received = False
    exit_status = -1

    def __init__(self):
        self.close_attempts = 0

    def exec_command(self, wire):
        pass

    def recv_stderr_ready(self):
        return False

    def recv_ready(self):
        return True

    def recv(self, size):
        return b"\0" * size

    def close(self):
        self.close_attempts += 1
        raise EOFError()


def test_a_failing_sink_is_the_error_reported_though_closing_the_channel_fails(tmp_path):
    from sparkctl.remote.connection import Connection

    channel = _ChannelOfADroppedLink()
    conn = Connection(SSHTarget(name="h1", address="192.0.2.1", user="u", known_hosts=str(tmp_path / "known_hosts")))
    conn._open_session = lambda deadline: channel

    def sink(_: bytes) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):  # not the EOFError of the close after it
        conn.run_stream_out(["cat", "/dev/zero"], sink, timeout=10)
    assert channel.close_attempts == 1
