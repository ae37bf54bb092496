"""Host-key policy: OpenSSH's rules, applied to ~/.ssh/known_hosts plus the inventory's file.

- a key that matches an entry in any file: accepted;
- the host is known (any file, any key type) but no entry matches: ``hostkey-changed``, always refused;
- the host is unknown: ``hostkey-unknown``, refused unless accept-new is on, in which case the key
  is appended to the inventory's known_hosts file (else ~/.ssh/known_hosts), like ``StrictHostKeyChecking=accept-new``.

Files are re-read at every check, so a key one connection records is seen by the next.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import re
import sys
import threading

import paramiko

from sparkctl.fileio import UserFileError, read_user_file
from sparkctl.remote.result import RemoteError

_record_lock = threading.Lock()

# known_hosts names a key by its type ("ssh-rsa"); the handshake asks for algorithms.
_ALGORITHMS_OF_TYPE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256")}


def user_known_hosts() -> str:
    return os.path.expanduser("~/.ssh/known_hosts")


def hostkey_name(address: str, port: int) -> str:
    """The name a host's key is filed under: ``addr`` on port 22, ``[addr]:port`` elsewhere."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _hashed_matches(name: str, hashed: str) -> bool:
    try:
        _, _, salt_b64, hash_b64 = hashed.split("|")
        salt, expected = base64.b64decode(salt_b64), base64.b64decode(hash_b64)
    except ValueError:
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), expected)


def _wildcard_match(name: str, pattern: str) -> bool:
    """OpenSSH patterns know only * and ? (brackets are literal: "[host]:2222")."""
    if "*" not in pattern and "?" not in pattern:
        return name.lower() == pattern.lower()
    regex = re.escape(pattern.lower()).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, name.lower()) is not None


def names_match(name: str, patterns: list[str]) -> bool:
    """OpenSSH known_hosts host field: names, |1| hashes, * ? wildcards, ! negation."""
    matched = False
    for pattern in patterns:
        if pattern.startswith("|1|"):
            matched = matched or _hashed_matches(name, pattern)
            continue
        negate = pattern.startswith("!")
        if _wildcard_match(name, pattern[1:] if negate else pattern):
            if negate:
                return False
            matched = True
    return matched


class KnownHostsFile:
    """Entries of one known_hosts file: (line number, host field, key). Unparseable lines are skipped."""

    def __init__(self, path: str):
        self.path = path
        self.entries: list[tuple[int, list[str], paramiko.PKey]] = []
        self.revoked: list[tuple[int, list[str], paramiko.PKey]] = []
        self.skipped: list[tuple[int, str]] = []  # (line number, why) of lines that are not a host key
        try:  # bounded, never blocking: a FIFO, a device or a folder gives no keys (so no host is trusted from it)
            lines = read_user_file(path).decode("utf-8", errors="replace").splitlines()
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return
        except UserFileError as err:
            self.skipped.append((0, f"the file {err}"))
            return
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            target = self.entries
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                if marker != "@revoked":
                    continue  # @cert-authority: host certificates are not supported, so not trusted either
                target = self.revoked
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
            except Exception as err:  # paramiko raises InvalidHostKey, binascii.Error, SSHException...
                cause = err.args[1] if isinstance(err, paramiko.hostkeys.InvalidHostKey) and len(err.args) > 1 else err
                self.skipped.append((number, f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"[:120]))
                continue
            if entry is None or entry.key is None:
                self.skipped.append((number, "not 'HOSTS KEYTYPE BASE64KEY'"))
                continue
            target.append((number, list(entry.hostnames), entry.key))

    def keys_for(self, names: list[str]) -> list[tuple[int, paramiko.PKey]]:
        return [(number, key) for number, patterns, key in self.entries if any(names_match(n, patterns) for n in names)]


class HostKeyPolicy:
    def __init__(self, extra_file: str | None, accept_new: bool):
        self.extra_file = os.path.expanduser(extra_file) if extra_file else None
        self.accept_new = accept_new

    @property
    def files(self) -> list[str]:
        files = [user_known_hosts()]
        if self.extra_file and self.extra_file not in files:
            files.append(self.extra_file)
        return files

    @property
    def record_file(self) -> str:
        return self.extra_file or user_known_hosts()

    def known(self, names: list[str]) -> list[tuple[str, int, paramiko.PKey]]:
        return [(f.path, number, key) for f in map(KnownHostsFile, self.files) for number, key in f.keys_for(names)]

    def preferred_algorithms(self, names: list[str], available: tuple[str, ...]) -> list[str] | None:
        """Host-key algorithms reordered so a type we already know is asked for first (as ssh does)."""
        known_types: list[str] = []
        for _, _, key in self.known(names):
            for algorithm in _ALGORITHMS_OF_TYPE.get(key.get_name(), (key.get_name(),)):
                if algorithm in available and algorithm not in known_types:
                    known_types.append(algorithm)
        if not known_types:
            return None
        return known_types + [a for a in available if a not in known_types]

    def verify(self, host: str, names: list[str], key: paramiko.PKey) -> bool:
        """Raise RemoteError unless ``key`` is acceptable for ``names``; True when it was just recorded."""
        for known_file in map(KnownHostsFile, self.files):
            for number, patterns, revoked in known_file.revoked:
                if revoked.asbytes() == key.asbytes():
                    raise RemoteError(host, "hostkey-changed",
                                      f"the host key of {names[0]} ({fingerprint(key)}) is marked @revoked in "
                                      f"{known_file.path}:{number}; refusing to connect")
        known = self.known(names)
        skipped = "".join(f"; {known_file.path}:{number} is not a valid host key line ({why}), skipped"
                          for known_file in map(KnownHostsFile, self.files) for number, why in known_file.skipped[:3])
        for _, _, candidate in known:
            if candidate.get_name() == key.get_name() and candidate.asbytes() == key.asbytes():
                return False
        if known:
            path, number, old = known[0]
            raise RemoteError(
                host,
                "hostkey-changed",
                f"HOST KEY CHANGED for {names[0]}: the server offers {key.get_name()} {fingerprint(key)} but "
                f"{path}:{number} records {old.get_name()} {fingerprint(old)}; refusing to connect "
                f"(if the host was reinstalled, remove that line: ssh-keygen -R {names[0]} -f {path}){skipped}",
            )
        if not self.accept_new:
            raise RemoteError(
                host,
                "hostkey-unknown",
                f"unknown host key for {names[0]} ({key.get_name()} {fingerprint(key)}); check it and re-run "
                f"with --accept-new-host-keys to record it in {self.record_file}{skipped}",
            )
        if self.record(names[0], key):
            # As OpenSSH's accept-new says it: the user sees what they now trust (stderr: --json stays one document).
            sys.stderr.write(f"{host}: permanently added {names[0]} ({key.get_name()} {fingerprint(key)}) "
                             f"to {self.record_file}\n")
            sys.stderr.flush()
        return True

    def record(self, name: str, key: paramiko.PKey) -> bool:
        """Append the key for ``name``; False when another thread or process recorded it a moment ago."""
        path = self.record_file
        directory = os.path.dirname(path)
        if directory and not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700, exist_ok=True)
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        with _record_lock:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "r+", encoding="utf-8") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    handle.seek(0)
                    content = handle.read()
                    if line in content.splitlines(keepends=True):
                        return False  # another thread or process recorded it a moment ago
                    if content and not content.endswith("\n"):
                        handle.write("\n")
                    handle.write(line)
                    handle.flush()
                    os.fsync(handle.fileno())
                    return True
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
