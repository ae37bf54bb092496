"""Every file the user names is read as a regular file of bounded size: a FIFO, /dev/zero or a folder
is refused at once, in one line naming the setting (exit 2), never a hang, a MemoryError or a
traceback. (The YAML loader does the same for the inventory and profiles themselves.)"""

from __future__ import annotations

import os
import stat
import threading

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.errors import ConfigError
from sparkctl.fileio import SMALL_FILE_BYTES, UserFileError, read_named_file, read_user_file


def _bounded(fn, seconds: float = 20.0):
    """Run ``fn`` in a thread; a hang is a test failure, not a stuck test run."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 (handed back to the test)
            box["error"] = err

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{fn} still runs after {seconds}s (blocked on a FIFO or an endless file?)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def hostile(tmp_path):
    """Each private to its owner (mode 0600/0700), so no check on permissions refuses them first."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    big = tmp_path / "big"
    big.write_bytes(b"x" * (SMALL_FILE_BYTES + 1))
    big.chmod(0o600)
    zero = "/dev/zero"
    if os.geteuid() == 0:  # a private /dev/zero: the same device node, mode 0600
        zero = str(tmp_path / "zero")
        os.mknod(zero, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    return {"fifo": str(fifo), "zero": zero, "folder": str(folder), "big": str(big)}


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder", "big"])
def test_the_bounded_reader_refuses_what_is_not_a_small_regular_file(hostile, kind):
    with pytest.raises(UserFileError):
        _bounded(lambda: read_user_file(hostile[kind]))


def test_the_bounded_reader_reads_a_regular_file(tmp_path):
    path = tmp_path / "ok"
    path.write_bytes(b"abc")
    assert read_user_file(path) == b"abc"
    with pytest.raises(FileNotFoundError):
        read_user_file(tmp_path / "absent")
    with pytest.raises(ConfigError, match="field: .*no such file"):
        read_named_file(tmp_path / "absent", field="field")


def _inventory(tmp_path, line: str):
    path = tmp_path / "inv.yaml"
    path.write_text(line + "\nhosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n")
    return path


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder", "big"])
@pytest.mark.parametrize("setting, field", [
    ("known_hosts: {path}", "known_hosts"),
    ("defaults:\n  ssh: {{identity_file: {path}}}", "defaults.ssh.identity_file"),
])
def test_inventory_files_are_refused_naming_the_field(tmp_path, hostile, kind, setting, field):
    path = _inventory(tmp_path, setting.format(path=hostile[kind]))
    with pytest.raises(ConfigError) as err:
        _bounded(lambda: load_inventory(path))
    assert err.value.field == field, str(err.value)
    assert hostile[kind] in str(err.value)


def test_a_host_identity_file_is_named_by_its_host(tmp_path, hostile):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n"
                    f"  - name: b\n    address: 10.0.0.2\n    ssh: {{identity_file: {hostile['fifo']}}}\n")
    with pytest.raises(ConfigError) as err:
        _bounded(lambda: load_inventory(path))
    assert "hosts[1].ssh.identity_file" in str(err.value) or "hosts.1.ssh.identity_file" in str(err.value), str(err.value)


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder"])
def test_the_api_key_file_is_refused_naming_the_field(hostile, kind, cli, example_inventory):
    result = _bounded(lambda: cli("-i", example_inventory, "render", "--profile", "sandbox", "--set",
                                  f"serving.api_key_file={hostile[kind]}", "--out", "/dev/null/x", timeout=60), 90)
    assert result.code == 2, result
    assert "serving.api_key_file" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_known_hosts_read_for_keys_gives_none_from_a_fifo(hostile):
    from sparkctl.remote.hostkeys import KnownHostsFile

    found = _bounded(lambda: KnownHostsFile(hostile["fifo"]))
    assert found.entries == [] and found.skipped, found.skipped


def test_an_identity_fifo_is_a_note_not_a_hang(hostile):
    from sparkctl.remote.connection import _load_key

    notes: list[str] = []
    assert _bounded(lambda: _load_key(hostile["fifo"], notes)) is None
    assert notes and "not a regular file" in notes[0], notes


def test_accepting_a_new_host_key_says_what_was_added(tmp_path, capsys):
    """As OpenSSH's accept-new prints "Permanently added ...": the key and the file it went to."""
    import paramiko

    from sparkctl.remote.hostkeys import HostKeyPolicy, fingerprint

    key = paramiko.RSAKey.generate(1024)
    known = tmp_path / "known_hosts"
    policy = HostKeyPolicy(str(known), accept_new=True)
    assert policy.verify("spark-9", ["10.0.0.9"], key) is True
    err = capsys.readouterr().err
    assert "spark-9: permanently added 10.0.0.9" in err and fingerprint(key) in err and str(known) in err, err
    assert policy.verify("spark-9", ["10.0.0.9"], key) is False  # known now: nothing added, nothing said
    assert capsys.readouterr().err == ""
