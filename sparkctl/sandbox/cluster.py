"""The sandbox cluster: N hosts on this machine, each with its own network, sshd, dockerd and disk.

A host is a network namespace (two links: management on one bridge, a 9000-MTU "fabric" link on a
second bridge, named as on a DGX Spark) plus a private mount and UTS namespace held open by a
small "holder" process. Inside that mount namespace /mnt/nvme, /var/run (hence docker.sock),
/root, /usr/local/bin (the GB10 stand-in commands) and /etc/hosts are the host's own folders.
The host's OpenSSH server and Docker engine are started into those namespaces with nsenter.

Everything the sandbox starts is recorded in a pidfile and stopped by that PID (after checking the
process still belongs to the host), never by name. ``up`` is idempotent: healthy hosts are left
alone, a dead daemon is restarted, a host whose namespace or links are broken is "rebooted"
(its processes stopped, namespace rebuilt; its disk folders kept).

Public API: ``up``, ``down``, ``status``, ``load``, ``targets``, ``exec_in_host``,
``stop_sshd``/``start_sshd``, ``stop_service``/``start_service``, ``host_pids``, ``set_standin``.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence

from sparkctl.errors import EXIT_FAILED, EXIT_USAGE, SparkctlError
from sparkctl.fileio import atomic_write
from sparkctl.images.pipe import read_to_end
from sparkctl.sandbox import layout as L
from sparkctl.sandbox import hostetc, procs, standins
from sparkctl.sandbox.layout import HostLayout, SandboxLayout
from sparkctl.standin.rootfs import write_package

# The layout *is* what callers need to know about a running sandbox (paths, addresses, netns).
SandboxInfo = SandboxLayout

SERVICES = ("sshd", "dockerd")
REQUIRED_BINARIES = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "setsid": "util-linux",
    "ssh-keygen": "openssh-client",
    "sshd": "openssh-server",
    "dockerd": "docker.io",
    "containerd": "docker.io (containerd)",
    "runc": "docker.io (runc)",
    "sudo": "sudo",
    "chpasswd": "passwd",
}
_DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Log = Callable[[str], None]


class SandboxError(SparkctlError):
    """A sandbox operation could not be done; ``str()`` is one line for the user."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Preconditions


def require_root() -> None:
    if os.geteuid() != 0:
        raise SandboxError(
            "the sandbox needs root: it creates network namespaces, bridges, an sshd and a dockerd per host "
            "(run it with sudo)",
            EXIT_USAGE,
        )


def missing_binaries() -> list[str]:
    """Names of the programs the sandbox needs that are not installed (with their Debian package)."""
    missing = []
    for binary, package in REQUIRED_BINARIES.items():
        if _which(binary) is None:
            missing.append(f"{binary} ({package})")
    return missing


def _which(binary: str) -> str | None:
    return shutil.which(binary, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def require_binaries() -> None:
    missing = missing_binaries()
    if missing:
        raise SandboxError(
            "the sandbox needs programs that are not installed: " + ", ".join(missing)
            + " — apt-get install docker.io openssh-server iproute2 sudo",
            EXIT_USAGE,
        )


# ---------------------------------------------------------------------------------------------
# Small helpers


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 60, env: dict | None = None,
         input: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(list(argv), capture_output=True, timeout=timeout, env=env, input=input)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"`{' '.join(argv)}` did not finish within {timeout:.0f}s") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        raise SandboxError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {detail[-1] if detail else 'no output'}")
    return proc


def _ip_json(*args: str) -> list:
    out = _run(["ip", "-j", *args]).stdout.decode().strip()
    return json.loads(out) if out else []


def _link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    return subprocess.run(argv, capture_output=True).returncode == 0


def _daemon_env(host: HostLayout) -> dict[str, str]:
    """A clean environment for daemons, tagged with the host's marker (see procs.owned)."""
    return {
        "PATH": _DAEMON_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        procs.MARKER_ENV: host.dir,
    }


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One `up`/`down` of a given sandbox at a time (flock on a file beside its state folder)."""
    root = L.state_root()
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f".{name}.lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _network_claim() -> Iterator[None]:
    """One sandbox at a time picks subnets and interface names and creates its bridges, machine-wide
    (the lock file is outside every state root: sandboxes under different roots share the network)."""
    os.makedirs(os.path.dirname(L.NETWORK_LOCK), exist_ok=True)
    with open(L.NETWORK_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _parallel(fn, items: Sequence, max_workers: int = 8) -> list:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        return list(pool.map(fn, items))


def _public_key(path: str) -> str:
    with open(path + ".pub") as handle:
        kind, b64 = handle.read().split()[:2]
    return f"{kind} {b64}"


def _keygen(path: str, comment: str) -> None:
    if os.path.exists(path) and os.path.exists(path + ".pub"):
        return
    for stale in (path, path + ".pub"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


# ---------------------------------------------------------------------------------------------
# State


def load(name: str = L.DEFAULT_NAME) -> SandboxLayout:
    """The recorded layout of sandbox ``name`` (raises SandboxError when there is none)."""
    layout = _load_state(name)
    if layout is None:
        raise SandboxError(f"there is no sandbox named {name!r} under {L.state_root()} (run `sparkctl sandbox up`)")
    return layout


def _load_state(name: str) -> SandboxLayout | None:
    L.check_name(name)
    path = os.path.join(L.state_root(), name, "state.json")
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise SandboxError(f"{path}: unreadable sandbox state ({err}); remove the folder by hand") from None
    return SandboxLayout.from_state(data)


def _save_state(layout: SandboxLayout) -> None:
    atomic_write(layout.state_file, json.dumps(layout.to_state(), indent=2) + "\n")


def _as_layout(sandbox: str | SandboxLayout) -> SandboxLayout:
    return sandbox if isinstance(sandbox, SandboxLayout) else load(sandbox)


# ---------------------------------------------------------------------------------------------
# Networking


class SubnetClash(SandboxError):
    """A wanted subnet overlaps a route or address this machine already has."""

    def __init__(self, message: str):
        super().__init__(message, EXIT_USAGE)


def _check_clash(layout: SandboxLayout) -> None:
    """Refuse subnets that overlap a route or address this machine already has (other than ours)."""
    ours = {layout.bridge_mgmt, layout.bridge_fabric}
    wanted = [("management", ipaddress.ip_network(layout.mgmt_subnet)), ("fabric", ipaddress.ip_network(layout.fabric_subnet))]
    for route in _ip_json("-4", "route", "show", "table", "main"):
        dst = route.get("dst", "")
        if dst in ("", "default") or route.get("dev") in ours:
            continue
        try:
            net = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
        except ValueError:
            continue
        for what, subnet in wanted:
            if net.overlaps(subnet):
                raise SubnetClash(
                    f"the {what} subnet {subnet} clashes with the existing route {dst} via {route.get('dev', '?')}; "
                    f"choose another with --{'mgmt' if what == 'management' else 'fabric'}-subnet"
                )
    for link in _ip_json("-4", "addr", "show"):
        if link.get("ifname") in ours:
            continue
        for info in link.get("addr_info", []):
            addr = ipaddress.ip_address(info["local"])
            for what, subnet in wanted:
                if addr in subnet:
                    raise SubnetClash(
                        f"the {what} subnet {subnet} clashes with address {addr} on {link.get('ifname')}; "
                        f"choose another with --{'mgmt' if what == 'management' else 'fabric'}-subnet"
                    )


def _check_names_free(layout: SandboxLayout, existing: SandboxLayout | None) -> None:
    """Namespaces and interfaces this `up` will create must not belong to someone else (such as a
    sandbox of the same name under another state root): refuse rather than take them over."""
    recorded = {h.name for h in existing.hosts} if existing else set()
    taken = []
    if existing is None:
        taken += [b for b in (layout.bridge_mgmt, layout.bridge_fabric) if _link_exists(b)]
    for host in layout.hosts:
        if host.name in recorded:
            continue
        if os.path.exists(host.netns_path):
            taken.append(f"netns {host.netns}")
        taken += [v for v in (host.veth_mgmt, host.veth_fabric, host.veth_fabric_twin) if _link_exists(v)]
    if taken:
        raise SandboxError(
            f"{', '.join(taken)} already exist(s) but are not recorded under {layout.root} "
            f"(a sandbox named {layout.name!r} under another SPARKCTL_SANDBOX_ROOT?); refusing to take them over",
            EXIT_USAGE,
        )


def _ensure_bridges(layout: SandboxLayout) -> None:
    control = f"{layout.control_address}/{L.prefix_len(layout.mgmt_subnet)}"
    for bridge, mtu in ((layout.bridge_mgmt, 1500), (layout.bridge_fabric, L.FABRIC_MTU)):
        if not _link_exists(bridge):
            _run(["ip", "link", "add", bridge, "mtu", str(mtu), "type", "bridge"])
        else:
            kind = _ip_json("-d", "link", "show", "dev", bridge)[0].get("linkinfo", {}).get("info_kind")
            if kind != "bridge":
                raise SandboxError(f"interface {bridge} exists and is not a bridge; it is not this sandbox's", EXIT_USAGE)
            _run(["ip", "link", "set", bridge, "mtu", str(mtu)])
        _run(["ip", "link", "set", bridge, "up"])
    addrs = [a["local"] + "/" + str(a["prefixlen"]) for link in _ip_json("-4", "addr", "show", "dev", layout.bridge_mgmt)
             for a in link.get("addr_info", [])]
    if control not in addrs:
        _run(["ip", "addr", "add", control, "dev", layout.bridge_mgmt])
    # An address nobody answers for: frames to it go to a MAC no port owns and vanish.
    _run(["ip", "neigh", "replace", layout.blackhole_address, "lladdr", L.BLACKHOLE_MAC,
          "dev", layout.bridge_mgmt, "nud", "permanent"])


def _links_ok(layout: SandboxLayout, host: HostLayout) -> bool:
    if not os.path.exists(host.netns_path):
        return False
    try:
        inside = {link["ifname"]: link for link in _ip_json("-n", host.netns, "addr", "show")}
        outside = {link["ifname"]: link for link in _ip_json("link", "show")}
    except SandboxError:
        return False
    mgmt = inside.get(L.MGMT_IFACE)
    if mgmt is None or "UP" not in mgmt.get("flags", []):
        return False
    plen = L.prefix_len(layout.mgmt_subnet)
    if not any(a.get("local") == host.address and a.get("prefixlen") == plen for a in mgmt.get("addr_info", [])):
        return False
    # The fabric netdevs' addresses and MTU are the host's own business (a bare host has none,
    # `sparkctl setup` gives them): only the cable counts here.
    for _, netdev, _ in host.fabric_links:
        if "UP" not in inside.get(netdev, {}).get("flags", []):
            return False
    if "UP" not in inside.get("lo", {}).get("flags", []):
        return False
    fabric = [(veth, layout.bridge_fabric) for veth, _, _ in host.fabric_links]
    for veth, bridge in [(host.veth_mgmt, layout.bridge_mgmt)] + fabric:
        link = outside.get(veth)
        if link is None or link.get("master") != bridge or "UP" not in link.get("flags", []):
            return False
    return True


def _create_netns(layout: SandboxLayout, host: HostLayout) -> None:
    for veth in (host.veth_mgmt,) + tuple(v for v, _, _ in host.fabric_links):
        if _link_exists(veth):
            _run(["ip", "link", "del", veth])
    if os.path.exists(host.netns_path):
        _run(["ip", "netns", "del", host.netns])
    _run(["ip", "netns", "add", host.netns])
    ns = host.netns
    _add_link(host, host.veth_mgmt, L.MGMT_IFACE, layout.bridge_mgmt, 1500)
    _run(["ip", "-n", ns, "addr", "add", f"{host.address}/{L.prefix_len(layout.mgmt_subnet)}", "dev", L.MGMT_IFACE])
    for veth, netdev, _ in host.fabric_links:
        # The switch side takes jumbo frames; the host's end starts at a fresh box's MTU.
        _add_link(host, veth, netdev, layout.bridge_fabric, L.FABRIC_MTU, inner_mtu=L.DEFAULT_MTU)
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    if not layout.bare:
        configure_fabric(layout, host)
    # The MACs are stable, so neighbours' caches stay right; drop ours anyway in case an older
    # build of this host had other ones.
    _run(["ip", "neigh", "flush", "to", host.address, "dev", layout.bridge_mgmt], check=False)


def _add_link(host: HostLayout, veth: str, inner: str, bridge: str, mtu: int, inner_mtu: int | None = None) -> None:
    """A veth from ``bridge`` into the host, named ``inner`` there and up (no address)."""
    peer = L.peer_name(veth)
    _run(["ip", "link", "add", veth, "mtu", str(mtu), "type", "veth", "peer", "name", peer, "mtu", str(inner_mtu or mtu),
          "address", L.stable_mac(host.netns, inner)])
    _run(["ip", "link", "set", peer, "netns", host.netns])
    _run(["ip", "-n", host.netns, "link", "set", peer, "name", inner])
    _run(["ip", "link", "set", veth, "master", bridge, "up"])
    _run(["ip", "-n", host.netns, "link", "set", inner, "up"])


def configure_fabric(layout: SandboxLayout, host: HostLayout) -> None:
    """What a prepared host has and a bare one lacks: both twins at MTU 9000 with their addresses."""
    plen = L.prefix_len(layout.fabric_subnet)
    for _, netdev, address in host.fabric_links:
        _run(["ip", "-n", host.netns, "link", "set", netdev, "mtu", str(L.FABRIC_MTU)])
        _run(["ip", "-n", host.netns, "addr", "replace", f"{address}/{plen}", "dev", netdev])


# ---------------------------------------------------------------------------------------------
# Per-host files


def _prepare_host_files(layout: SandboxLayout, host: HostLayout) -> None:
    for folder in (host.nvme_dir, os.path.join(host.run_dir, "sshd"), os.path.join(host.run_dir, "lock"),
                   host.bin_dir, host.docker_data, host.pid_dir, host.log_dir, host.var_lib_dir):
        os.makedirs(folder, exist_ok=True)
    os.makedirs(host.root_home, mode=0o700, exist_ok=True)
    os.chmod(os.path.join(host.run_dir, "sshd"), 0o755)
    if not os.path.exists(host.etc_dir):
        hostetc.create(layout, host)
    hostetc.write_user_home(layout, host)
    _keygen(host.host_key, f"root@{host.name}")
    standins.make_rdma_nodes(host.infiniband_dir)
    runc = _which("runc") or "/usr/sbin/runc"
    for filename, content in standins.scripts(runc).items():
        atomic_write(os.path.join(host.bin_dir, filename), content, mode=0o755)
    write_package(os.path.join(host.bin_dir, standins.STANDIN_SITE))  # this checkout's stand-in
    env_file = os.path.join(host.bin_dir, standins.ENV_FILE)
    if not os.path.exists(env_file):
        values = dict(standins.GB10_DEFAULTS, SPARK_GPU_UUID=standins.gpu_uuid(f"{layout.name}/{host.name}"))
        atomic_write(env_file, standins.render_env(values))
    if not os.path.exists(host.docker_config):
        _write_daemon_json(layout, host)
    _write_etc_hosts(layout, host)


def _write_daemon_json(layout: SandboxLayout, host: HostLayout) -> None:
    """The host's /etc/docker/daemon.json; a bare host's has no nvidia runtime (``nvidia-ctk runtime
    configure`` adds it, as on a box where the container toolkit was installed but not registered)."""
    daemon_json: dict = {
        # Bounded stop on `down`: containers get this long after SIGTERM before SIGKILL.
        "shutdown-timeout": 3,
    }
    if not layout.bare:
        daemon_json["runtimes"] = {"nvidia": {"path": "nvidia-container-runtime", "args": []}}
    if _dockerd_major() < 23:
        # Before Docker 23 the engine ID derives from this key; the default (/etc/docker/key.json)
        # would be shared by every host and written on the control machine. (23+ keeps the ID in
        # the data root, and no longer knows this option.)
        daemon_json["deprecated-key-path"] = os.path.join(host.dir, "docker-key.json")
    os.makedirs(os.path.dirname(host.docker_config), exist_ok=True)
    atomic_write(host.docker_config, json.dumps(daemon_json, indent=2) + "\n", mode=0o644)


_DOCKERD_MAJOR: list[int] = []


def _dockerd_major() -> int:
    if not _DOCKERD_MAJOR:
        out = _run([_which("dockerd") or "dockerd", "--version"], check=False).stdout.decode()
        match = re.search(r"version (\d+)\.", out)
        _DOCKERD_MAJOR.append(int(match.group(1)) if match else 0)
    return _DOCKERD_MAJOR[0]


def _write_etc_hosts(layout: SandboxLayout, host: HostLayout) -> None:
    # Written in place, not renamed: the file is bind-mounted over the host's /etc/hosts, and a
    # rename would leave the mount pointing at the old inode.
    content = L.render_etc_hosts(layout)
    try:
        with open(host.etc_hosts) as handle:
            if handle.read() == content:
                return
    except FileNotFoundError:
        pass
    with open(host.etc_hosts, "w") as handle:
        handle.write(content)


# ---------------------------------------------------------------------------------------------
# Processes of one host


def _pid(host: HostLayout, service: str) -> int | None:
    """The recorded PID of ``service`` ("holder", "sshd", "dockerd") if it is alive and this host's."""
    pid = procs.read_pidfile(host.pidfile(service))
    return pid if procs.owned(pid, netns_path=host.netns_path, marker=host.dir) else None


def _wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _log_tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, errors="replace") as handle:
            tail = [line.strip() for line in handle.read().splitlines() if line.strip()][-lines:]
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(tail) or "(empty log)"


_HOLDER_SCRIPT = r"""set -e
mount -t tmpfs -o mode=755 sandbox-mnt /mnt
mkdir -p /mnt/nvme
mount --bind "$1" /mnt/nvme
mount --bind "$2" /var/run
mount --bind "$3" /usr/local/bin
mount --bind "$4" /root
mount --bind "$5" /etc
mount --bind "${10}" /home
mkdir -p /var/lib/sparkctl
mount --bind "$8" /var/lib/sparkctl
mkdir -p /dev/infiniband
mount --bind "$9" /dev/infiniband
hostname "$6"
echo $$ > "$7.tmp"
mv "$7.tmp" "$7"
exec sleep infinity
"""


def _start_holder(host: HostLayout) -> int:
    pidfile = host.pidfile("holder")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pidfile)
    argv = [
        "setsid", "-f", "nsenter", f"--net={host.netns_path}",
        "unshare", "--mount", "--uts", "--propagation", "private",
        "sh", "-c", _HOLDER_SCRIPT, "sandbox-holder",
        host.nvme_dir, host.run_dir, host.bin_dir, host.root_home, host.etc_dir, host.name, pidfile, host.var_lib_dir,
        host.infiniband_dir, host.home_dir,
    ]
    with open(host.logfile("holder"), "ab") as log:
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=_daemon_env(host), check=True)
    if not _wait_for(lambda: _pid(host, "holder") is not None, 10):
        raise SandboxError(f"{host.name}: the namespace holder did not start: {_log_tail(host.logfile('holder'))}")
    return _pid(host, "holder")  # type: ignore[return-value]


def _enter(holder: int) -> list[str]:
    return ["nsenter", f"--target={holder}", "--net", "--mount", "--uts", "--"]


def _sshd_argv(layout: SandboxLayout, host: HostLayout) -> list[str]:
    return [
        _which("sshd") or "/usr/sbin/sshd", "-f", "/dev/null",
        "-h", host.host_key,
        "-E", host.logfile("sshd"),
        "-o", f"PidFile={host.pidfile('sshd')}",
        # Each user's own file, as on a real box: the sandbox puts this machine's key in the
        # user's; root has none, so root cannot log in (what needs root goes through sudo).
        "-o", "AuthorizedKeysFile=.ssh/authorized_keys",
        "-o", "PermitRootLogin=prohibit-password",
        "-o", "PasswordAuthentication=no",
        "-o", "KbdInteractiveAuthentication=no",
        "-o", "StrictModes=no",
        "-o", "Subsystem=sftp internal-sftp",
        # Fan-out opens many connections at once; OpenSSH's default (10:30:100) drops some.
        "-o", "MaxStartups=200",
        "-o", "MaxSessions=64",
    ]


def _start_sshd(layout: SandboxLayout, host: HostLayout) -> int:
    holder = _pid(host, "holder")
    if holder is None:
        raise SandboxError(f"{host.name}: cannot start sshd, the host's namespaces are gone (run `sandbox up`)")
    pidfile = host.pidfile("sshd")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pidfile)
    proc = _run(_enter(holder) + _sshd_argv(layout, host), check=False, env=_daemon_env(host), timeout=20)
    if proc.returncode != 0:
        raise SandboxError(f"{host.name}: sshd did not start (exit {proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip() or _log_tail(host.logfile('sshd'))}")
    if not _wait_for(lambda: _pid(host, "sshd") is not None, 10):
        raise SandboxError(f"{host.name}: sshd did not write its pidfile: {_log_tail(host.logfile('sshd'))}")
    return _pid(host, "sshd")  # type: ignore[return-value]


def _dockerd_argv(host: HostLayout) -> list[str]:
    return [
        _which("dockerd") or "/usr/sbin/dockerd",
        "--config-file", "/etc/docker/daemon.json",
        "--data-root", host.docker_data,
        # Inside the host /var/run is its own folder; the short path keeps containerd's socket
        # paths well under the 108-byte limit whatever the state root is.
        "--exec-root", "/var/run/docker",
        "--pidfile", "/var/run/docker.pid",
        "--host", "unix:///var/run/docker.sock",
        "--bridge=none", "--iptables=false", "--ip-masq=false",
    ]


def _start_dockerd(host: HostLayout) -> int:
    holder = _pid(host, "holder")
    if holder is None:
        raise SandboxError(f"{host.name}: cannot start dockerd, the host's namespaces are gone (run `sandbox up`)")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(host.pidfile("dockerd"))
    with open(host.logfile("dockerd"), "ab") as log:
        _DOCKERD_LOG_START[host.dir] = log.tell()
        subprocess.run(["setsid", "-f"] + _enter(holder) + _dockerd_argv(host), stdin=subprocess.DEVNULL,
                       stdout=log, stderr=log, env=_daemon_env(host), check=True)
    return _pid(host, "dockerd") or 0


_DOCKERD_LOG_START: dict[str, int] = {}


def _dockerd_failed_early(host: HostLayout) -> str | None:
    """dockerd's own words when it gave up before writing its pidfile (bad option, no storage driver)."""
    try:
        with open(host.logfile("dockerd"), "rb") as handle:
            handle.seek(_DOCKERD_LOG_START.get(host.dir, 0))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if "failed to start daemon" in line or "level=fatal" in line or "unable to configure the Docker daemon" in line:
            return line.strip()
    return None


# A dockerd that fails says so at once (above); one that is only slow must not fail the sandbox: with
# several sandboxes starting their daemons together on 2 cores, one took just over 60 s to listen.
def _wait_dockerd(host: HostLayout, timeout: float = 180) -> int:
    def ready() -> bool:
        if not os.path.exists(host.pidfile("dockerd")):
            failure = _dockerd_failed_early(host)
            if failure:
                raise SandboxError(f"{host.name}: dockerd did not start: {failure}")
            return False
        if procs.read_pidfile(host.pidfile("dockerd")) is None:
            return False  # created but not yet written: dockerd writes its pidfile in place, not by rename
        if _pid(host, "dockerd") is None:
            raise SandboxError(f"{host.name}: dockerd exited: {_log_tail(host.logfile('dockerd'))}")
        return docker_ping(host.docker_socket)

    if not _wait_for(ready, timeout, interval=0.1):
        raise SandboxError(f"{host.name}: dockerd did not answer within {timeout:.0f}s: {_log_tail(host.logfile('dockerd'))}")
    return _pid(host, "dockerd")  # type: ignore[return-value]


def ssh_banner(address: str, port: int = 22, timeout: float = 1.0) -> str | None:
    """The server's SSH identification line, or None when nothing answers."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            data = sock.recv(256)
    except OSError:
        return None
    line = data.split(b"\r\n")[0].decode(errors="replace")
    return line if line.startswith("SSH-") else None


# Docker engine API over the host's unix socket: just enough for readiness and tear-down,
# without importing docker-py into the sandbox's hot path.

def _docker_api(sock_path: str, method: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(sock_path)
        sock.sendall(f"{method} {path} HTTP/1.0\r\nHost: docker\r\nContent-Length: 0\r\n\r\n".encode())
        raw = read_to_end(sock.recv)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body


def docker_ping(sock_path: str, timeout: float = 1.0) -> bool:
    try:
        status, body = _docker_api(sock_path, "GET", "/_ping", timeout)
    except OSError:
        return False
    return status == 200 and body.strip() == b"OK"


def _kill_containers(host: HostLayout) -> None:
    """Kill the host's running containers through its engine, so dockerd stops at once."""
    try:
        status, body = _docker_api(host.docker_socket, "GET", "/containers/json")
        if status != 200:
            return
        for container in json.loads(body):
            _docker_api(host.docker_socket, "POST", f"/containers/{container['Id']}/kill", timeout=10)
    except (OSError, ValueError):
        pass


def _stop_host(host: HostLayout, log: Log) -> set[int]:
    """Stop every process of ``host`` and remove its namespace. Returns PIDs that survived."""
    holder = _pid(host, "holder")
    dockerd = _pid(host, "dockerd")
    if dockerd:
        _kill_containers(host)
        procs.terminate([dockerd], grace=20)
    sshd = _pid(host, "sshd")
    if sshd:
        procs.terminate([sshd], grace=5)
    # What is left: sshd sessions, dockerd's containerd and shims, container processes, the holder.
    namespaces = [("net", procs.ns_inode(host.netns_path))]
    if holder:
        namespaces.append(("mnt", procs.process_ns(holder, "mnt")))
    mine = {os.getpid(), *_ancestors()}
    leftovers = procs.processes_in(namespaces, marker=host.dir) - mine
    survivors = procs.terminate(leftovers, grace=3)
    if survivors:
        log(f"{host.name}: processes {sorted(survivors)} did not exit")
    if os.path.exists(host.netns_path):
        _run(["ip", "netns", "del", host.netns], check=False)
    for veth in (host.veth_mgmt,) + tuple(v for v, _, _ in host.fabric_links):
        if veth and _link_exists(veth):
            _run(["ip", "link", "del", veth], check=False)
    for service in ("holder",) + SERVICES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(host.pidfile(service))
    return survivors


def _ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid and pid > 1:
        pid = procs.parent_of(pid) or 0
        found.add(pid)
    return found


@dataclass
class HostStatus:
    name: str
    address: str
    fabric_address: str
    netns: str
    netns_present: bool
    links: bool
    holder_pid: int | None
    sshd_pid: int | None
    dockerd_pid: int | None
    ssh_answers: bool
    docker_answers: bool

    @property
    def healthy(self) -> bool:
        return all((self.netns_present, self.links, self.holder_pid, self.sshd_pid, self.dockerd_pid,
                    self.ssh_answers, self.docker_answers))

    def to_json(self) -> dict:
        return {**asdict(self), "healthy": self.healthy}


def _host_status(layout: SandboxLayout, host: HostLayout) -> HostStatus:
    sshd = _pid(host, "sshd")
    dockerd = _pid(host, "dockerd")
    return HostStatus(
        name=host.name,
        address=host.address,
        fabric_address=host.fabric_address,
        netns=host.netns,
        netns_present=os.path.exists(host.netns_path),
        links=_links_ok(layout, host),
        holder_pid=_pid(host, "holder"),
        sshd_pid=sshd,
        dockerd_pid=dockerd,
        ssh_answers=bool(sshd) and ssh_banner(host.address) is not None,
        docker_answers=bool(dockerd) and docker_ping(host.docker_socket),
    )


def _ensure_host(layout: SandboxLayout, host: HostLayout, log: Log) -> str:
    """Bring one host to running; returns what was done ("ok", "started", "repaired: ...")."""
    _prepare_host_files(layout, host)
    done: list[str] = []
    fresh = not os.path.exists(host.netns_path) and _pid(host, "holder") is None
    if not _links_ok(layout, host) or _pid(host, "holder") is None:
        if not fresh:
            log(f"{host.name}: namespace, links or holder broken; restarting the host")
            _stop_host(host, log)
            done.append("rebooted")
        _create_netns(layout, host)
        _start_holder(host)
    if _pid(host, "sshd") is None:
        _start_sshd(layout, host)
        done.append("sshd")
    if _pid(host, "dockerd") is None:
        _start_dockerd(host)
        done.append("dockerd")
    _wait_dockerd(host)
    if not _wait_for(lambda: ssh_banner(host.address) is not None, 10, interval=0.1):
        raise SandboxError(f"{host.name}: sshd runs but {host.address}:22 does not answer: {_log_tail(host.logfile('sshd'))}")
    if fresh:
        return "started"
    return "ok" if not done else "repaired (" + ", ".join(done) + ")"


# ---------------------------------------------------------------------------------------------
# The verbs


def up(
    name: str = L.DEFAULT_NAME,
    hosts: int | None = None,
    *,
    mgmt_subnet: str | None = None,
    fabric_subnet: str | None = None,
    bare: bool | None = None,
    password_sudo: bool | None = None,
    log: Log = _quiet,
) -> SandboxLayout:
    """Create sandbox ``name`` (or bring an existing one back to health) with ``hosts`` hosts.

    Idempotent: running hosts are left alone, dead daemons restarted, broken hosts rebuilt;
    ``hosts`` grows or shrinks an existing sandbox (default: 4 for a new one, else unchanged).
    ``bare`` hosts start unprepared (see ``SandboxLayout.bare``); ``password_sudo`` makes sudo ask
    the user's password. Both are decided when the sandbox is created.
    """
    require_root()
    require_binaries()
    try:
        L.check_name(name)
    except L.LayoutError as err:
        raise SandboxError(str(err), EXIT_USAGE) from None
    refuse_long_socket_paths(name, hosts)
    with _locked(name):
        existing = _load_state(name)
        started = time.monotonic()
        # Subnets and names are chosen from what the machine has now, so the choice and the bridges
        # that take them are one step for every sandbox on the machine: two `up`s at once (under
        # any state root) would otherwise both find the same pair free and both take it.
        with _network_claim():
            layout = _wanted_layout(name, existing, hosts, mgmt_subnet, fabric_subnet, bare, password_sudo, log)
            _check_names_free(layout, existing)
            # Record every host that may exist (old and new) before creating anything, so a failed
            # or interrupted `up` can always be undone by `down`.
            extra = [h for h in (existing.hosts if existing else ()) if h.name not in {x.name for x in layout.hosts}]
            os.makedirs(layout.root, exist_ok=True)
            _save_state(_with_hosts(layout, list(layout.hosts) + extra))
            _ensure_bridges(layout)
        _keygen(layout.identity_file, f"sparkctl-sandbox-{name}")
        _keygen(layout.hosts_identity_file, f"sparkctl-sandbox-{name}-hosts")
        if extra:
            log(f"removing hosts {', '.join(h.name for h in extra)}")
            _parallel(lambda h: _stop_host(h, log), extra)
            for host in extra:
                shutil.rmtree(host.dir, ignore_errors=True)
        outcomes = _parallel(lambda h: _ensure_host(layout, h, log), layout.hosts)
        for host, outcome in zip(layout.hosts, outcomes):
            log(f"{host.name}  {host.address}  {outcome}")
        if layout.password_sudo:
            _set_sudo_password(layout)
        keys = {h.name: _public_key(h.host_key) for h in layout.hosts}
        atomic_write(layout.known_hosts, L.render_known_hosts(layout, keys))
        if not layout.bare:
            hostetc.write_peer_known_hosts(layout)
        atomic_write(layout.inventory, L.render_inventory(layout))
        _save_state(layout)
        log(f"sandbox {name!r}: {len(layout.hosts)} hosts up in {time.monotonic() - started:.1f}s")
        return layout


def refuse_long_socket_paths(name: str, hosts: int | None) -> None:
    """Before anything is written: a state root under which a host's Docker socket path would pass the
    Unix limit (that dockerd could never be reached) is refused in one line, exit 2. A host count
    that cannot be planned is left to ``_wanted_layout`` to refuse in its own words."""
    existing = _load_state(name) if hosts is None else None
    count = hosts if hosts is not None else (len(existing.hosts) if existing else L.DEFAULT_HOSTS)
    try:
        layout = L.plan(name, count)
    except L.LayoutError:
        return
    try:
        L.check_socket_paths(layout)
    except L.LayoutError as err:
        raise SandboxError(str(err), EXIT_USAGE) from None


def _wanted_layout(name: str, existing: SandboxLayout | None, hosts: int | None, mgmt_subnet: str | None,
                   fabric_subnet: str | None, bare: bool | None, password_sudo: bool | None, log: Log) -> SandboxLayout:
    """The layout ``up`` makes: an existing sandbox keeps its subnets and kind (refusing others asked for)."""
    if existing is not None:
        for given, recorded, what in ((mgmt_subnet, existing.mgmt_subnet, "mgmt"), (fabric_subnet, existing.fabric_subnet, "fabric")):
            if given is not None and str(ipaddress.ip_network(given, strict=False)) != recorded:
                raise SandboxError(
                    f"sandbox {name!r} already uses {what} subnet {recorded}; run `sparkctl sandbox down --name {name}` to change it",
                    EXIT_USAGE,
                )
        mgmt_subnet, fabric_subnet = existing.mgmt_subnet, existing.fabric_subnet
        _check_same_kind(existing, bare, password_sudo)
        bare, password_sudo = existing.bare, existing.password_sudo
    kind = dict(bare=bool(bare), password_sudo=bool(password_sudo))
    count = hosts if hosts is not None else (len(existing.hosts) if existing else L.DEFAULT_HOSTS)
    if existing is None and mgmt_subnet is None and fabric_subnet is None:
        # None asked for: the defaults, else the first free pair (another sandbox may hold the defaults).
        return _plan_on_free_subnets(name, count, log, **kind)
    try:
        layout = L.plan(name, count, mgmt_subnet=mgmt_subnet or L.DEFAULT_MGMT_SUBNET,
                        fabric_subnet=fabric_subnet or L.DEFAULT_FABRIC_SUBNET, **kind)
    except L.LayoutError as err:
        raise SandboxError(str(err), EXIT_USAGE) from None
    _check_clash(layout)
    return layout


def _check_same_kind(existing: SandboxLayout, bare: bool | None, password_sudo: bool | None) -> None:
    for given, recorded, what in ((bare, existing.bare, "--bare"), (password_sudo, existing.password_sudo, "--password-sudo")):
        if given is not None and bool(given) != recorded:
            state = "with" if recorded else "without"
            raise SandboxError(f"sandbox {existing.name!r} was created {state} {what}; run `sparkctl sandbox down "
                               f"--name {existing.name}` to change it", EXIT_USAGE)


def _set_sudo_password(layout: SandboxLayout) -> None:
    """One random password for the user on every host (given to chpasswd on stdin, kept 0600 here)."""
    import secrets

    if not os.path.exists(layout.sudo_password_file):
        atomic_write(layout.sudo_password_file, secrets.token_urlsafe(18) + "\n", mode=0o600)
    with open(layout.sudo_password_file) as handle:
        password = handle.read().strip()
    for host in layout.hosts:
        if not hostetc.has_password(host):
            exec_in_host(layout, host.name, ["chpasswd"], input=f"{L.USER}:{password}\n".encode(), check=True)


def _plan_on_free_subnets(name: str, hosts: int, log: Log, **kind) -> SandboxLayout:
    """The layout on the default subnets, or on the first pair 10.229/10.230 downwards that clashes
    with no route or address of this machine."""
    candidates = [(L.DEFAULT_MGMT_SUBNET, L.DEFAULT_FABRIC_SUBNET)] + subnet_pairs(229, 149)
    for mgmt, fabric in candidates:
        try:
            layout = L.plan(name, hosts, mgmt_subnet=mgmt, fabric_subnet=fabric, **kind)
            _check_clash(layout)
        except L.LayoutError as err:
            raise SandboxError(str(err), EXIT_USAGE) from None
        except SubnetClash:
            continue
        if mgmt != L.DEFAULT_MGMT_SUBNET:
            log(f"the default subnets are in use: sandbox {name!r} takes {mgmt} and {fabric}")
        return layout
    raise SandboxError(f"no free subnet pair among {len(candidates)} candidates (10.231/10.232 and 10.229..10.150); "
                       "name one with --mgmt-subnet and --fabric-subnet", EXIT_USAGE)


def subnet_pairs(first: int, last: int) -> list[tuple[str, str]]:
    """Candidate (management, fabric) /24 pairs 10.a.0.0 and 10.a+1.0.0, a from ``first`` towards ``last`` in steps of 2."""
    step = -2 if last < first else 2
    return [(f"10.{a}.0.0/24", f"10.{a + 1}.0.0/24") for a in range(first, last, step)]


def up_on_free_subnets(name: str, hosts: int, candidates: Sequence[tuple[str, str]], *, log: Log = _quiet,
                       **kind) -> SandboxLayout:
    """``up`` on the first candidate subnet pair that clashes with nothing on this machine
    (for tests and benchmarks that must coexist with whatever else runs here)."""
    last: SubnetClash | None = None
    for mgmt, fabric in candidates:
        try:
            return up(name, hosts, mgmt_subnet=mgmt, fabric_subnet=fabric, log=log, **kind)
        except SubnetClash as err:
            last = err
    raise SandboxError(f"no free subnet pair among {len(candidates)} candidates: {last}")


def _with_hosts(layout: SandboxLayout, hosts: list[HostLayout]) -> SandboxLayout:
    data = layout.to_state()
    data["hosts"] = [asdict(h) for h in hosts]
    return SandboxLayout.from_state(data)


@dataclass
class DownReport:
    name: str
    existed: bool
    hosts: list[str] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    removed_state: bool = False

    @property
    def ok(self) -> bool:
        return not self.survivors

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def down(name: str = L.DEFAULT_NAME, *, log: Log = _quiet) -> DownReport:
    """Stop every process of sandbox ``name`` by its recorded PID, delete its namespaces, links,
    bridges and state folder. A sandbox that does not exist is not an error."""
    require_root()
    try:
        L.check_name(name)
    except L.LayoutError as err:
        raise SandboxError(str(err), EXIT_USAGE) from None
    with _locked(name):
        layout = _load_state(name)
        if layout is None:
            return DownReport(name=name, existed=False)
        survivors: set[int] = set()
        for host_survivors in _parallel(lambda h: _stop_host(h, log), layout.hosts):
            survivors |= host_survivors
        for bridge in (layout.bridge_mgmt, layout.bridge_fabric):
            if _link_exists(bridge):
                _run(["ip", "link", "del", bridge], check=False)
        report = DownReport(name=name, existed=True, hosts=[h.name for h in layout.hosts], survivors=sorted(survivors))
        if not survivors and os.path.exists(layout.state_file):
            # With every process gone, no mount of the hosts' private namespaces remains, so
            # the folder holds only plain files (docker's layers included).
            shutil.rmtree(layout.root)
            report.removed_state = True
        elif survivors:
            log(f"keeping {layout.root}: some processes survived, run `sandbox down` again")
        return report


@dataclass
class SandboxStatus:
    name: str
    exists: bool
    layout: SandboxLayout | None = None
    hosts: list[HostStatus] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.exists and bool(self.hosts) and all(h.healthy for h in self.hosts)

    def to_json(self) -> dict:
        if not self.exists or self.layout is None:
            return {"name": self.name, "exists": False, "healthy": False, "hosts": []}
        return {
            "name": self.name,
            "exists": True,
            "healthy": self.healthy,
            "inventory": self.layout.inventory,
            "known_hosts": self.layout.known_hosts,
            "mgmt_subnet": self.layout.mgmt_subnet,
            "fabric_subnet": self.layout.fabric_subnet,
            "hosts": [h.to_json() for h in self.hosts],
        }


def status(name: str = L.DEFAULT_NAME) -> SandboxStatus:
    require_root()
    try:
        layout = _load_state(name)
    except L.LayoutError as err:
        raise SandboxError(str(err), EXIT_USAGE) from None
    if layout is None:
        return SandboxStatus(name=name, exists=False)
    return SandboxStatus(name=name, exists=True, layout=layout,
                         hosts=_parallel(lambda h: _host_status(layout, h), layout.hosts))


# ---------------------------------------------------------------------------------------------
# Helpers for tests and later verbs


def targets(sandbox: str | SandboxLayout, **overrides) -> list:
    """SSHTargets for every host, as the sandbox's inventory describes them."""
    from sparkctl.remote.target import SSHTarget

    layout = _as_layout(sandbox)
    base = dict(port=22, user=L.USER, identity_file=layout.identity_file, known_hosts=layout.known_hosts)
    base.update(overrides)
    return [SSHTarget(name=h.name, address=h.address, **base) for h in layout.hosts]


def host_pids(sandbox: str | SandboxLayout, host: str) -> dict[str, int | None]:
    """The live, verified PIDs of a host's holder, sshd and dockerd (None when not running)."""
    h = _as_layout(sandbox).host(host)
    return {service: _pid(h, service) for service in ("holder",) + SERVICES}


def exec_in_host(sandbox: str | SandboxLayout, host: str, argv: Sequence[str], *, input: bytes | None = None,
                 timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``argv`` inside host ``host`` (its network, mount and UTS namespaces), not over SSH."""
    h = _as_layout(sandbox).host(host)
    holder = _pid(h, "holder")
    if holder is None:
        raise SandboxError(f"{host}: the host is not running (run `sparkctl sandbox up`)")
    return _run(_enter(holder) + list(argv), check=check, timeout=timeout, input=input,
                env={"PATH": _DAEMON_PATH, "HOME": "/root", "LANG": "C.UTF-8"})


def stop_service(sandbox: str | SandboxLayout, host: str, service: str) -> int | None:
    """Stop a host's sshd or dockerd (by its recorded PID). Returns the PID stopped, if any.

    Stopping sshd leaves sessions already open alive, as on a real box; new connections are refused.
    """
    if service not in SERVICES:
        raise ValueError(f"service must be one of {SERVICES}")
    h = _as_layout(sandbox).host(host)
    pid = _pid(h, service)
    if pid is None:
        return None
    if service == "dockerd":
        _kill_containers(h)
    if procs.terminate([pid], grace=20):
        raise SandboxError(f"{host}: {service} (pid {pid}) did not stop")
    return pid


def start_service(sandbox: str | SandboxLayout, host: str, service: str) -> int:
    """Start a host's sshd or dockerd again (no-op when it runs). Returns its PID."""
    layout = _as_layout(sandbox)
    h = layout.host(host)
    pid = _pid(h, service)
    if pid is not None:
        return pid
    if service == "sshd":
        pid = _start_sshd(layout, h)
        if not _wait_for(lambda: ssh_banner(h.address) is not None, 10, interval=0.05):
            raise SandboxError(f"{host}: sshd started but does not answer")
        return pid
    if service == "dockerd":
        _start_dockerd(h)
        return _wait_dockerd(h)
    raise ValueError(f"service must be one of {SERVICES}")


def stop_sshd(sandbox: str | SandboxLayout, host: str) -> int | None:
    return stop_service(sandbox, host, "sshd")


def start_sshd(sandbox: str | SandboxLayout, host: str) -> int:
    return start_service(sandbox, host, "sshd")


def drop_ssh_sessions(sandbox: str | SandboxLayout, host: str) -> list[int]:
    """Kill every SSH session a host's sshd serves (the listener stays): each open connection to
    the host drops mid-command, as when a session process dies on a real box. Returns the PIDs."""
    listener = _pid(_as_layout(sandbox).host(host), "sshd")
    if listener is None:
        return []
    sessions = [pid for pid in procs.descendants(listener) if procs.process_name(pid) == "sshd"]
    procs.signal_pids(sessions, signal.SIGKILL)
    return sessions


def set_rdma_devices(sandbox: str | SandboxLayout, host: str, present: bool) -> list[str]:
    """Give ``host`` its stand-in /dev/infiniband nodes back, or take them away (a box whose RDMA
    modules are not loaded). Seen at once inside the host: the folder is bind-mounted there."""
    return standins.make_rdma_nodes(_as_layout(sandbox).host(host).infiniband_dir, present)


def set_standin(sandbox: str | SandboxLayout, host: str, **values: str) -> dict[str, str]:
    """Change what a host's stand-in nvidia-smi / ibdev2netdev print (keys of standins.GB10_DEFAULTS).

    ``set_standin(sb, "spark-2", SPARK_DRIVER_VERSION="550.54.14")`` makes spark-2 look out of date;
    ``reset=True``-style restore: call with the values from ``standins.GB10_DEFAULTS``.
    """
    h = _as_layout(sandbox).host(host)
    path = os.path.join(h.bin_dir, standins.ENV_FILE)
    with open(path) as handle:
        current = standins.parse_env(handle.read())
    unknown = set(values) - set(standins.GB10_DEFAULTS) - {"SPARK_GPU_UUID"}
    if unknown:
        raise ValueError(f"unknown stand-in setting(s): {', '.join(sorted(unknown))}")
    current.update({k: str(v) for k, v in values.items()})
    atomic_write(path, standins.render_env(current))
    return current
