"""One SSH connection to one host (paramiko), reused by every step that runs there.

The transport's paramiko implementation (sparkctl.remote.transport). A command is an argv list, joined with shlex.quote
(never formatted by hand), run in its own session channel; stdout/stderr are read concurrently,
so a chatty command can never deadlock a large stdin stream. Failures to reach, trust or log
into a host become ``RemoteError`` with one of ``result.CAUSES``; a command that runs and fails
is not an error: it is a ``CommandResult`` with a non-zero exit code.

Thread-safe: several threads may run commands on one Connection at once (one channel each).
"""

from __future__ import annotations

import errno
import itertools
import os
import select
import socket
import threading
import time
from dataclasses import replace
from typing import Callable, Iterable, Sequence

import paramiko

from sparkctl.remote import echo
from sparkctl.remote.argv import join_argv  # noqa: F401  (also imported from here)
from sparkctl.remote.hostkeys import HostKeyPolicy, hostkey_name
from sparkctl.remote.result import CommandResult, RemoteError
from sparkctl.remote.sshconfig import DEFAULT_IDENTITIES, Resolved, jump_hops, resolve
from sparkctl.remote.target import SSHTarget

# paramiko's default. Measured on the sandbox: larger windows make streams slower and erratic
# (paramiko's receive buffer deletes from its front on every read, so a big backlog costs O(n)
# per read), and 2 MiB already covers a LAN's bandwidth-delay product many times over.
WINDOW_SIZE = 2 * 1024 * 1024
MAX_PACKET_SIZE = 32 * 1024
READ_SIZE = 1024 * 1024
SEND_PIECE = 1024 * 1024  # stdin is sent in pieces of at most this, so progress and timeouts stay fine-grained
KEEPALIVE_SECONDS = 30
# A host that let its connect time out (a hung sshd: TCP open, no banner) is not asked again for this
# long: a verb that touches it in several steps then waits connect_timeout once, not once per step.
TIMEOUT_MEMORY_SECONDS = 60.0

# paramiko's transport thread logs a failed handshake with a traceback; with no handler configured,
# Python's last-resort handler would print it on stderr. The failure reaches the user as one
# RemoteError line instead (SPARKCTL_SSH_LOG still gets everything: it adds its own handler).
import logging  # noqa: E402

from sparkctl.fileio import UserFileError, check_user_file

logging.getLogger("paramiko").addHandler(logging.NullHandler())

Progress = Callable[[int], None]


def _remaining(deadline: float | None, floor: float = 0.05) -> float | None:
    if deadline is None:
        return None
    return max(floor, deadline - time.monotonic())


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


class Connection:
    def __init__(
        self,
        target: SSHTarget,
        *,
        connect_timeout: float = 10.0,
        accept_new_host_keys: bool = False,
        ssh_config_path: str | None = None,
    ):
        self.target = target
        self.connect_timeout = connect_timeout
        self.accept_new_host_keys = accept_new_host_keys
        self.ssh_config_path = ssh_config_path
        self.recorded_host_key = False  # True once accept-new wrote this host's key to known_hosts
        self._policy = HostKeyPolicy(target.known_hosts, accept_new_host_keys)
        self._transport: paramiko.Transport | None = None
        self._jumps: list[Connection] = []
        self._via: Connection | None = None  # set on jump hosts after the first: reach them through this one
        self._is_hop = False
        self._lock = threading.Lock()
        self._timed_out: tuple[float, RemoteError] | None = None  # (when, error) of the last connect timeout
        # Commands run so far that may have changed the host, and -- when the run keeps them (its
        # pool's ``remember_facts``: ``up``) -- the fact runner's answers kept against that count
        # (sparkctl.ops.ask): an answer is reused only while it is unchanged. None: always ask
        # (a verb that polls, such as ``status --watch``, must see every change).
        self._counter = itertools.count(1)
        self._count_lock = threading.Lock()
        self.changes = 0
        self.memo: dict | None = None

    @classmethod
    def for_route(cls, route, *, accept_new_host_keys: bool = False, connect_timeout: float = 10.0) -> "Connection":
        """A connection of its own to ``route`` (a ``sparkctl.remote.openssh.Route``): its fabric
        address when the route goes there, the host key still checked under the management name."""
        target = route.target
        if route.via_fabric:
            target = replace(target, address=route.address, host_key_alias=route.host_key_alias())
        return cls(target, accept_new_host_keys=accept_new_host_keys, connect_timeout=connect_timeout)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.target.name

    def __repr__(self) -> str:
        return f"<Connection {self.name} {self.target.address} {'open' if self.connected else 'closed'}>"

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._transport is not None and self._transport.is_active()

    def server_key(self) -> paramiko.PKey:
        """The host key this connection verified (connecting first if needed)."""
        return self._ensure_transport().get_remote_server_key()

    def connect(self) -> "Connection":
        """Open the connection now (it otherwise opens on first use). Raises RemoteError."""
        self._ensure_transport()
        return self

    def close(self) -> None:
        with self._lock:
            self._close_transport()

    def _close_transport(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._close_jumps()

    def _close_jumps(self) -> None:
        for jump in reversed(self._jumps):
            jump.close()
        self._jumps = []

    def _ensure_transport(self) -> paramiko.Transport:
        with self._lock:
            if self._transport is not None and self._transport.is_active():
                return self._transport
            self._close_transport()
            if self._timed_out is not None and time.monotonic() - self._timed_out[0] < TIMEOUT_MEMORY_SECONDS:
                raise self._timed_out[1]
            try:
                self._transport = self._open()
            except RemoteError as err:
                if err.cause == "timeout":
                    self._timed_out = (time.monotonic(), err)
                raise
            self._timed_out = None
            return self._transport

    # -- connecting --------------------------------------------------------------------------

    def _open(self) -> paramiko.Transport:
        deadline = time.monotonic() + self.connect_timeout
        resolved = resolve(self.target, self.ssh_config_path)
        where = f"{resolved.address}:{resolved.port}"
        try:
            sock = self._open_socket(resolved, deadline)
        except BaseException:
            self._close_jumps()
            raise
        transport = None
        try:
            transport = paramiko.Transport(sock, default_window_size=WINDOW_SIZE, default_max_packet_size=MAX_PACKET_SIZE)
            names = [resolved.host_key_alias or hostkey_name(resolved.address, resolved.port)]
            options = transport.get_security_options()
            preferred = self._policy.preferred_algorithms(names, tuple(options.key_types))
            if preferred:
                options.key_types = preferred
            transport.banner_timeout = _remaining(deadline)
            transport.handshake_timeout = _remaining(deadline)
            try:
                transport.start_client(timeout=_remaining(deadline))
                # start_client returns quietly when its timeout passes before the key exchange is
                # done (a stopped sshd accepts TCP and says nothing): this then says "No existing session".
                server_key = transport.get_remote_server_key()
            except (paramiko.SSHException, EOFError, OSError) as err:
                raise self._handshake_error(err, deadline, where) from None
            self.recorded_host_key = self._policy.verify(self.name, names, server_key)
            self._authenticate(transport, resolved, deadline)
            transport.set_keepalive(KEEPALIVE_SECONDS)
            return transport
        except BaseException:
            if transport is not None:
                transport.close()
            else:
                sock.close()
            self._close_jumps()
            raise

    def _open_socket(self, resolved: Resolved, deadline: float):
        where = f"{resolved.address}:{resolved.port}"
        if self._via is not None:
            return self._via._direct_tcpip(self.name, resolved.address, resolved.port, deadline)
        if resolved.proxy_jump and not self._is_hop:
            via: Connection | None = None
            for hop in jump_hops(resolved.proxy_jump, self.target, self.ssh_config_path):
                jump = Connection(hop, connect_timeout=max(0.1, deadline - time.monotonic()),
                                  accept_new_host_keys=self.accept_new_host_keys, ssh_config_path=self.ssh_config_path)
                jump._is_hop, jump._via = True, via
                self._jumps.append(jump)
                try:
                    jump.connect()
                except RemoteError as err:
                    raise RemoteError(self.name, err.cause, f"via jump host {hop.address}: {err.detail}") from None
                via = jump
            assert via is not None
            return via._direct_tcpip(self.name, resolved.address, resolved.port, deadline)
        try:
            sock = socket.create_connection((resolved.address, resolved.port), timeout=_remaining(deadline))
            # Each command is a few small packets each way; with Nagle's algorithm and the peer's
            # delayed ACKs every one of them would wait ~40 ms (as OpenSSH, we turn it off).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except socket.gaierror as err:
            raise RemoteError(self.name, "dns", f"cannot resolve {resolved.address}: {err.strerror or err}") from None
        except ConnectionRefusedError:
            raise RemoteError(self.name, "refused", f"connection to {where} refused (is sshd running?)") from None
        except (socket.timeout, TimeoutError):
            raise RemoteError(self.name, "timeout", f"no answer from {where} within {self.connect_timeout:g}s") from None
        except OSError as err:
            reason = os.strerror(err.errno) if err.errno else str(err)
            if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                reason += " (host down or not on this network?)"
            raise RemoteError(self.name, "other", f"cannot connect to {where}: {reason}") from None

    def _direct_tcpip(self, for_host: str, address: str, port: int, deadline: float) -> paramiko.Channel:
        """A TCP stream to ``address:port`` opened by this (jump) host."""
        transport = self._ensure_transport()
        try:
            return transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=_remaining(deadline))
        except paramiko.ChannelException as err:
            raise RemoteError(for_host, "refused",
                              f"jump host {self.target.address} could not connect to {address}:{port}: {err.text}") from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            cause = "timeout" if _expired(deadline) else "closed"
            raise RemoteError(for_host, cause, f"jump host {self.target.address} did not open a tunnel to {address}:{port}: {err}") from None

    def _handshake_error(self, err: BaseException, deadline: float, where: str) -> RemoteError:
        text = str(err) or type(err).__name__
        if _expired(deadline - 0.1) or "timed out" in text.lower() or "timeout" in text.lower():
            why = "" if text == "No existing session" else f" ({text})"  # paramiko's words for "never got that far"
            return RemoteError(self.name, "timeout", f"SSH handshake with {where} did not finish within {self.connect_timeout:g}s{why}")
        return RemoteError(self.name, "closed", f"{where} closed the connection during the SSH handshake ({text})")

    def _authenticate(self, transport: paramiko.Transport, resolved: Resolved, deadline: float) -> None:
        who = f"{resolved.user}@{resolved.address}:{resolved.port}"
        notes: list[str] = []
        offered: list[str] = []

        def attempt(key: paramiko.PKey, label: str) -> bool:
            offered.append(label)
            transport.auth_timeout = _remaining(deadline)
            try:
                transport.auth_publickey(resolved.user, key)
            except paramiko.AuthenticationException as err:
                if "timeout" in str(err).lower():
                    raise RemoteError(self.name, "timeout", f"{who}: authentication did not finish within {self.connect_timeout:g}s") from None
                if not transport.is_active():
                    raise RemoteError(self.name, "auth", f"{who} closed the connection after {len(offered)} rejected key(s): "
                                      + ", ".join(offered)) from None
                return False
            except (paramiko.SSHException, EOFError, OSError) as err:
                if _expired(deadline):
                    raise RemoteError(self.name, "timeout", f"{who}: authentication did not finish within {self.connect_timeout:g}s") from None
                raise RemoteError(self.name, "closed", f"{who} dropped the connection during authentication ({err})") from None
            return transport.is_authenticated()

        for path in resolved.identity_files:
            key = _load_key(path, notes)
            if key is not None and attempt(key, path):
                return
        if os.environ.get("SSH_AUTH_SOCK"):
            agent = None
            try:
                agent = paramiko.Agent()
                agent_keys = agent.get_keys()
                if not agent_keys:
                    notes.append("ssh-agent holds no keys")
                for key in agent_keys:
                    if attempt(key, f"agent key {key.get_name()} {key.fingerprint}"):
                        return
            except paramiko.SSHException as err:
                notes.append(f"ssh-agent unusable ({err})")
            finally:
                if agent is not None:
                    agent.close()
        if resolved.default_identities:
            for path in map(os.path.expanduser, DEFAULT_IDENTITIES):
                if os.path.exists(path):
                    key = _load_key(path, notes)
                    if key is not None and attempt(key, path):
                        return
        tried = ", ".join(offered) if offered else "no key at all (no identity file, no ssh-agent, no ~/.ssh/id_*)"
        raise RemoteError(self.name, "auth", f"{who} accepted none of the keys offered: {tried}"
                          + ("; " + "; ".join(notes) if notes else ""))

    # -- running commands --------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None,
            reads_only: bool = False) -> CommandResult:
        """Run ``argv``; collect stdout and stderr. ``stdin`` (if given) is sent, then EOF; without it the command reads /dev/null.
        ``reads_only``: the command changes nothing on the host (a fact), so answers kept stay valid."""
        if not reads_only:
            self._changed()
        return self._exec(argv, timeout=timeout, chunks=[stdin] if stdin else None, sink=None,
                          on_sent=None, on_received=None)

    def _changed(self) -> None:
        with self._count_lock:
            self.changes = next(self._counter)

    def run_stream_in(self, argv: Sequence[str], chunks: Iterable[bytes], *, timeout: float | None = None,
                      on_progress: Progress | None = None) -> CommandResult:
        """Run ``argv`` with ``chunks`` streamed to its stdin; ``on_progress(total_bytes_sent)``."""
        self._changed()
        return self._exec(argv, timeout=timeout, chunks=chunks, sink=None, on_sent=on_progress, on_received=None)

    def run_stream_out(self, argv: Sequence[str], sink: Callable[[bytes], None], *, timeout: float | None = None,
                       on_progress: Progress | None = None) -> CommandResult:
        """Run ``argv`` with its stdout handed to ``sink`` chunk by chunk; ``on_progress(total_bytes_received)``.

        The result's ``stdout`` is "" (the bytes went to the sink); ``bytes_received`` counts them.
        """
        self._changed()
        return self._exec(argv, timeout=timeout, chunks=None, sink=sink, on_sent=None, on_received=on_progress)

    def _open_session(self, deadline: float | None) -> paramiko.Channel:
        for attempt in (1, 2):
            transport = self._ensure_transport()
            try:
                return transport.open_session(timeout=_remaining(deadline) or self.connect_timeout)
            except (paramiko.SSHException, EOFError, OSError) as err:
                if transport.is_active() or attempt == 2:
                    cause = "timeout" if _expired(deadline) else ("other" if transport.is_active() else "closed")
                    raise RemoteError(self.name, cause, f"could not open an SSH session: {str(err) or type(err).__name__}") from None
                # The host dropped us since the last step (rebooted, sshd restarted): reconnect once.
                with self._lock:
                    if self._transport is transport:
                        self._close_transport()
        raise AssertionError("unreachable")

    def _exec(self, argv, *, timeout, chunks, sink, on_sent, on_received) -> CommandResult:
        command = join_argv(argv)  # as the messages show it
        echo.command(self.name, argv, stdin=chunks is not None)
        wire = command
        if chunks is None:
            # Nothing to send: the command reads /dev/null and we never send EOF. An EOF could reach
            # sshd after paramiko's transport thread already answered the server's CLOSE (paramiko
            # sends both outside the channel lock), and OpenSSH then drops the whole connection:
            # "ieof packet referred to nonexistent channel".
            # ``exec`` keeps the command the direct child of sshd, as without the redirection.
            wire = f"exec {command} </dev/null"
        started = time.monotonic()
        deadline = started + timeout if timeout is not None else None
        channel = self._open_session(deadline)
        reader = _Reader(channel, sink, on_received)
        try:
            try:
                channel.exec_command(wire)
            except (paramiko.SSHException, EOFError, OSError) as err:
                raise RemoteError(self.name, "closed" if not channel.get_transport().is_active() else "other",
                                  f"the server would not run the command: {err}") from None
            reader.start()
            sent = self._send(channel, chunks, deadline, reader, on_sent, command, timeout)
            reader.join(_remaining(deadline))
            if reader.is_alive():
                raise self._timeout(command, timeout)
            if reader.error is not None:
                raise reader.error
            if not channel.status_event.wait(_remaining(deadline)):
                raise self._timeout(command, timeout)
            transport = channel.get_transport()
            if channel.exit_status == -1 and (transport is None or not transport.is_active()):
                raise RemoteError(self.name, "closed", f"the connection dropped{_why_dropped(transport)} while running: {_short(command)}")
            return CommandResult(
                exit_code=channel.exit_status,
                stdout=b"".join(reader.out).decode("utf-8", "replace"),
                stderr=b"".join(reader.err).decode("utf-8", "replace"),
                seconds=time.monotonic() - started,
                bytes_sent=sent,
                bytes_received=reader.received,
            )
        finally:
            reader.stop = True
            _close_quietly(channel)

    def _send(self, channel, chunks, deadline, reader, on_sent, command, timeout) -> int:
        sent = 0
        if chunks is not None:
            for chunk in chunks:
                view = memoryview(chunk)
                for offset in range(0, len(view), SEND_PIECE):
                    if reader.error is not None or channel.closed or channel.exit_status_ready():
                        return sent  # the command stopped reading (exited, or our sink failed)
                    piece = view[offset:offset + SEND_PIECE]
                    channel.settimeout(_remaining(deadline))
                    try:
                        channel.sendall(piece)
                    except socket.timeout:
                        raise self._timeout(command, timeout) from None
                    except OSError:
                        return sent  # channel closed by the remote end: the exit status tells why
                    sent += len(piece)
                    if on_sent is not None:
                        on_sent(sent)
        if chunks is None or channel.closed or channel.exit_status_ready():
            return sent  # no EOF to a command that has exited (see _exec)
        try:
            channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass
        return sent

    def _timeout(self, command: str, timeout: float | None) -> RemoteError:
        return RemoteError(self.name, "timeout", f"command did not finish within {timeout:g}s: {_short(command)}")


def _why_dropped(transport: paramiko.Transport | None) -> str:
    """Why the transport ended, as ' (Type: message)' when it kept a record, else ''."""
    reason = transport.get_exception() if transport is not None else None
    return f" ({type(reason).__name__}: {reason})" if reason is not None else ""


def _short(command: str, limit: int = 120) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


def _load_key(path: str, notes: list[str]) -> paramiko.PKey | None:
    try:
        check_user_file(path, missing_ok=False)  # a FIFO or /dev/zero would hang or fill memory in from_path
    except UserFileError as err:
        notes.append(f"identity file {path} {err}")
        return None
    try:
        return paramiko.PKey.from_path(path)
    except FileNotFoundError:
        notes.append(f"identity file {path} does not exist")
    except paramiko.PasswordRequiredException:
        notes.append(f"{path} is passphrase-protected (load it into ssh-agent)")
    except (paramiko.SSHException, OSError, ValueError) as err:
        notes.append(f"cannot use {path}: {err}")
    return None


def _close_quietly(channel: paramiko.Channel) -> None:
    """Close a command's channel without letting the closing hide what happened. Closing sends a
    message, which fails on a transport that already dropped: the command's own error (a failing
    sink, a timeout) is the one to report, and a result already read stays true. The next command
    finds the drop and reconnects (``_open_session``)."""
    try:
        channel.close()
    except (paramiko.SSHException, EOFError, OSError):
        pass


class _Reader(threading.Thread):
    """Drains a channel's stdout and stderr until EOF (select on the channel wakes on either)."""

    def __init__(self, channel: paramiko.Channel, sink, on_progress):
        super().__init__(daemon=True, name="sparkctl-ssh-reader")
        self.channel, self.sink, self.on_progress = channel, sink, on_progress
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.received = 0
        self.error: BaseException | None = None
        self.stop = False

    def run(self) -> None:
        channel = self.channel
        try:
            while not self.stop:
                progressed = False
                if channel.recv_stderr_ready():
                    data = channel.recv_stderr(READ_SIZE)
                    if data:
                        self.err.append(data)
                        progressed = True
                if channel.recv_ready():
                    data = channel.recv(READ_SIZE)
                    if data:
                        self.received += len(data)
                        if self.sink is not None:
                            self.sink(data)
                        else:
                            self.out.append(data)
                        if self.on_progress is not None:
                            self.on_progress(self.received)
                        progressed = True
                if progressed:
                    continue
                if channel.eof_received or channel.closed:
                    if not channel.recv_ready() and not channel.recv_stderr_ready():
                        return
                    continue
                select.select([channel], [], [], 0.5)
        except BaseException as err:  # a failing sink must reach the caller, not die with this thread
            self.error = err
