"""Probes: an argv to run on a host and a parser turning its output into a typed fact.

Parsers are pure and unit-tested on captured real output. An argv never carries a user value
inside a shell string: values travel as separate arguments (``sh -c SCRIPT NAME ARG...``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field


class ProbeError(ValueError):
    """The output could not be read: the check fails with this message."""


# ---------------------------------------------------------------- identity: user, OS, kernel

IDENTITY_ARGV = ["sh", "-c", 'id -un; uname -r; uname -m; . /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown}"']


@dataclass(frozen=True)
class Identity:
    user: str
    kernel: str
    arch: str
    os: str


def parse_identity(stdout: str) -> Identity:
    lines = [line.strip() for line in stdout.strip().splitlines()]
    if len(lines) < 4:
        raise ProbeError(f"expected user, kernel, arch and OS, got {len(lines)} lines")
    return Identity(user=lines[0], kernel=lines[1], arch=lines[2], os=lines[3])


# ---------------------------------------------------------------- GPU (nvidia-smi)

GPU_ARGV = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"]


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    compute_cap: str
    memory_total: str  # "[N/A]" on GB10: the memory is unified


def parse_gpus(stdout: str) -> list[Gpu]:
    gpus = []
    for line in stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            raise ProbeError(f"unexpected nvidia-smi line: {line!r}")
        gpus.append(Gpu(*parts))
    if not gpus:
        raise ProbeError("nvidia-smi listed no GPU")
    return gpus


# ---------------------------------------------------------------- Docker engine

DOCKER_ARGV = ["docker", "info", "--format", "{{json .}}"]


@dataclass(frozen=True)
class DockerInfo:
    server_version: str
    storage_driver: str
    runtimes: tuple[str, ...]
    default_runtime: str
    containerd_snapshotter: bool  # the containerd image store (thin archives need every layer)
    root_dir: str = ""  # DockerRootDir: where images and containers' layers are written


def parse_docker_info(stdout: str) -> DockerInfo:
    try:
        info = json.loads(stdout)
    except json.JSONDecodeError as err:
        raise ProbeError(f"docker info is not JSON: {err.msg}") from None
    if info.get("ServerErrors"):
        raise ProbeError("; ".join(info["ServerErrors"]))
    if not info.get("ServerVersion"):
        raise ProbeError("no Docker engine answered")
    driver_status = {str(k): str(v) for k, v in (info.get("DriverStatus") or [])}
    snapshotter = driver_status.get("driver-type", "").startswith("io.containerd.snapshotter")
    return DockerInfo(
        server_version=info["ServerVersion"],
        storage_driver=info.get("Driver", ""),
        runtimes=tuple(sorted((info.get("Runtimes") or {}).keys())),
        default_runtime=info.get("DefaultRuntime", ""),
        containerd_snapshotter=snapshotter,
        root_dir=str(info.get("DockerRootDir") or ""),
    )


# ---------------------------------------------------------------- ulimits of a login shell

ULIMIT_ARGV = ["sh", "-c", "for o in l n s; do ulimit -S$o; ulimit -H$o; done"]
ULIMIT_ORDER = ("memlock", "nofile", "stack")
# `ulimit -l` and `-s` report KiB; docker's --ulimit memlock/stack take bytes.
ULIMIT_UNIT = {"memlock": 1024, "nofile": 1, "stack": 1024}


@dataclass(frozen=True)
class Limit:
    soft: int  # -1: unlimited; in docker's units (bytes for memlock/stack)
    hard: int


def _limit_value(text: str, unit: int) -> int:
    text = text.strip()
    if text == "unlimited":
        return -1
    if not text.isdigit():
        raise ProbeError(f"unexpected ulimit value {text!r}")
    return int(text) * unit


def parse_ulimits(stdout: str) -> dict[str, Limit]:
    values = stdout.split()
    if len(values) != 2 * len(ULIMIT_ORDER):
        raise ProbeError(f"expected {2 * len(ULIMIT_ORDER)} ulimit values, got {len(values)}")
    out = {}
    for i, name in enumerate(ULIMIT_ORDER):
        unit = ULIMIT_UNIT[name]
        out[name] = Limit(_limit_value(values[2 * i], unit), _limit_value(values[2 * i + 1], unit))
    return out


# ---------------------------------------------------------------- RDMA devices and links

RDMA_ARGV = ["ibdev2netdev"]


def free_space_argv(path: str) -> list[str]:
    """Bytes free where ``path`` is (or would be created: its nearest existing parent)."""
    script = 'd="$1"; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; exec df -B1 --output=avail "$d"'
    return ["sh", "-c", script, "sh", path]


def read_file_argv(path: str) -> list[str]:
    """A file's content on stdout (a manifest, an index, an env file, a log)."""
    return ["cat", "--", path]


def surface_probe_argv(image: str, program: str, *args: str) -> list[str]:
    """``program`` (python) run inside ``image`` with the image's python3, no network (a host's docker CLI)."""
    return ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", program, *args]

# init's: no ibdev2netdev (not a Spark, or the OFED tools missing) answers nothing, not a failure
RDMA_IF_ANY_ARGV = ["sh", "-c", "command -v ibdev2netdev >/dev/null || exit 0; ibdev2netdev"]
HOSTNAME_ARGV = ["hostname"]
IPV4_ARGV = ["ip", "-o", "-4", "addr", "show"]
_IPV4_LINE = re.compile(r"^\d+:\s+(\S+)\s+inet\s+(\d+\.\d+\.\d+\.\d+)/\d+")


def parse_ipv4(stdout: str) -> dict[str, list[str]]:
    """``ip -o -4 addr show`` -> {netdev: [address, ...]} (loopback left out)."""
    found: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        match = _IPV4_LINE.match(line.strip())
        if match and match[1] != "lo":
            found.setdefault(match[1], []).append(match[2])
    return found
_IBDEV = re.compile(r"^(\S+) port (\d+) ==> (\S+) \((\w+)\)")


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    netdev: str
    up: bool


def parse_ibdev2netdev(stdout: str) -> list[RdmaPort]:
    ports = []
    for line in stdout.strip().splitlines():
        match = _IBDEV.match(line.strip())
        if not match:
            raise ProbeError(f"unexpected ibdev2netdev line: {line!r}")
        ports.append(RdmaPort(match[1], int(match[2]), match[3], match[4].lower() == "up"))
    return ports


# The RDMA character devices (uverbsN, rdma_cm) the engine container gets; no folder is no device.
RDMA_DEVICES_ARGV = ["sh", "-c", "ls -1A /dev/infiniband 2>/dev/null || true"]


def parse_rdma_devices(stdout: str) -> list[str]:
    return sorted(line.strip() for line in stdout.splitlines() if line.strip())


LINKS_ARGV = ["ip", "-o", "link", "show"]
_LINK = re.compile(r"^\d+:\s+([^:@\s]+)(?:@\S+)?:\s+<([^>]*)>.*?\smtu\s+(\d+)")


@dataclass(frozen=True)
class Link:
    name: str
    mtu: int
    up: bool


def parse_links(stdout: str) -> dict[str, Link]:
    links = {}
    for line in stdout.splitlines():
        match = _LINK.match(line)
        if match:
            flags = match[2].split(",")
            links[match[1]] = Link(match[1], int(match[3]), "UP" in flags and "LOWER_UP" in flags)
    if not links:
        raise ProbeError("ip link listed no interface")
    return links


# ---------------------------------------------------------------- disk, memory, ports

def disk_argv(path: str) -> list[str]:
    # The folder may not exist yet: measure the nearest existing parent.
    script = 'p=$1; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -B1 --output=avail,target "$p"'
    return ["sh", "-c", script, "disk", path]


@dataclass(frozen=True)
class Disk:
    available: int
    mountpoint: str


def parse_df(stdout: str) -> Disk:
    lines = stdout.strip().splitlines()
    if len(lines) < 2:
        raise ProbeError("df printed no filesystem")
    avail, _, target = lines[-1].strip().partition(" ")
    if not avail.isdigit():
        raise ProbeError(f"unexpected df line: {lines[-1]!r}")
    return Disk(int(avail), target.strip())


def state_dir_argv(path: str) -> list[str]:
    """Can this user write sparkctl's folder on the host (deployed files, the deploy lock, the audit log)?"""
    # A missing folder is creatable when its nearest existing ancestor is a folder this user may write
    # (serve makes the whole path with mkdir -p), not only when its parent is.
    script = ('d=$1; if [ -d "$d" ]; then if [ -w "$d" ]; then echo writable; else echo read-only; fi; exit 0; fi; '
              'p=$d; while [ ! -e "$p" ] && [ ! -L "$p" ]; do p=$(dirname -- "$p"); done; '
              'if [ -d "$p" ] && [ -w "$p" ]; then echo creatable; else echo denied; fi')
    return ["sh", "-c", script, "state", path]


def parse_state_dir(stdout: str) -> str:
    state = stdout.strip()
    if state not in ("writable", "read-only", "creatable", "denied"):
        raise ProbeError(f"unexpected answer {state!r}")
    return state


MEMINFO_ARGV = ["cat", "/proc/meminfo"]


def parse_meminfo(stdout: str) -> dict[str, int]:
    """Bytes per /proc/meminfo field."""
    out = {}
    for line in stdout.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    if "MemAvailable" not in out:
        raise ProbeError("no MemAvailable in /proc/meminfo")
    return out


PORTS_ARGV = ["ss", "-Htln"]


def parse_listening_ports(stdout: str) -> set[int]:
    ports = set()
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            local = fields[3]
            port = local.rsplit(":", 1)[-1]
            if port.isdigit():
                ports.add(int(port))
    return ports


# ---------------------------------------------------------------- checkpoint, image, clock, fabric

# Lists the checkpoint as JSON: config present, and for every shard the index names, its size and
# the size it must have: the one in the manifest `model sync` keeps with the copy when there is one
# (whose "left_out" files were not copied on purpose), else what its safetensors header adds up to
# (8 + header + the end of the last tensor), so a truncated shard is caught either way.
CHECKPOINT_SCRIPT = r"""
import json, os, struct, sys
d = sys.argv[1]
out = {"dir": os.path.isdir(d), "config": os.path.isfile(os.path.join(d, "config.json")), "index": None, "files": {},
       "expected": {}, "manifest": None, "left_out": []}
try:
    m = json.load(open(os.path.join(d, ".sparkctl-manifest.json")))
    out["manifest"] = True
    out["left_out"] = sorted(m.get("left_out") or {})
    sizes = {k: v["size"] for k, v in m["files"].items()}
except FileNotFoundError:
    sizes = None
except Exception as e:
    out["manifest"] = "unreadable: %s" % e.__class__.__name__
    sizes = None
def header_size(p):
    try:
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 * 1024 * 1024:
                return None
            h = json.loads(f.read(n))
        return 8 + n + max([0] + [t["data_offsets"][1] for k, t in h.items() if k != "__metadata__"])
    except Exception:
        return None
idx = os.path.join(d, "model.safetensors.index.json")
if os.path.isfile(idx):
    try:
        names = sorted(set(json.load(open(idx))["weight_map"].values()))
        out["index"] = True
        for n in names:
            p = os.path.join(d, n)
            out["files"][n] = os.path.getsize(p) if os.path.isfile(p) else None
            if sizes is not None and n in sizes:
                out["expected"][n] = sizes[n]
            elif out["files"][n]:
                out["expected"][n] = header_size(p)
    except Exception as e:
        out["index"] = "unreadable: %s" % e.__class__.__name__
print(json.dumps(out))
"""


def stdlib_python_argv(program: str, *args: str) -> list[str]:
    """``program`` (standard library only) run by the host's python3, started as cheaply and as safely as it
    can be: ``-I`` (isolated: no PYTHON* variables, no user site folder, and neither the login folder nor
    the script's on sys.path, so a json.py lying in a home folder cannot stand in for the standard
    library's) and ``-S`` (no ``site``: no site-packages, .pth files or sitecustomize read at start,
    ~5 ms of CPU less on Debian 12's python3.11; the standard library is found all the same). Both exist
    in every python3 (Ubuntu 24.04's 3.12 included). Not for programs that may import a package (the
    agents' optional xxhash lives in site-packages, or the user's site folder)."""
    return ["python3", "-I", "-S", "-c", program, *args]


def checkpoint_argv(model_dir: str) -> list[str]:
    return stdlib_python_argv(CHECKPOINT_SCRIPT, model_dir)


@dataclass(frozen=True)
class Checkpoint:
    dir_exists: bool
    config: bool
    index: bool | str | None
    files: dict[str, int | None] = field(default_factory=dict)
    expected: dict[str, int | None] = field(default_factory=dict)  # the size each file must have (None: unknown)
    manifest: bool | str | None = None  # True: model sync's manifest is there; a string: it is unreadable
    left_out: tuple[str, ...] = ()  # files model sync left out on purpose (Engram tables, engram.mode=disk)

    @property
    def missing(self) -> list[str]:
        return sorted(name for name, size in self.files.items() if not size and name not in self.left_out)

    @property
    def wrong_size(self) -> list[str]:
        return sorted(name for name, size in self.files.items()
                      if size and self.expected.get(name) is not None and size != self.expected[name])


def parse_checkpoint(stdout: str) -> Checkpoint:
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        raise ProbeError("checkpoint probe printed no JSON") from None
    return Checkpoint(data["dir"], data["config"], data["index"], data["files"], data.get("expected") or {},
                      data.get("manifest"), tuple(data.get("left_out") or ()))


# What docker prints when the image asked about is not there (20.10: "Error: No such image: X";
# 25+: "Error response from daemon: No such image: X"; "No such object" for an ID). Anything else
# (the engine down, no permission on the socket) is a failure of the question, not a "no".
NO_SUCH_IMAGE = ("No such image", "No such object")


def image_inspect_argv(ref: str, fmt: str = "{{.Id}}", docker: str = "docker") -> list[str]:
    """The one ``docker image inspect`` (every fact about an image reads it through this)."""
    return [docker, "image", "inspect", "--format", fmt, ref]


def parse_image_inspect(stdout: str) -> dict | None:
    """``docker image inspect --format '{{json .}}'``: the whole document (None: no such image)."""
    if not stdout.strip():
        return None
    try:
        doc = json.loads(stdout)
    except ValueError:
        raise ProbeError(f"unexpected docker image inspect output {stdout.strip()[:80]!r}") from None
    if not isinstance(doc, dict) or "Id" not in doc:
        raise ProbeError("docker image inspect gave no image ID")
    return doc


def parse_image_id(stdout: str) -> str:
    image_id = stdout.strip()
    if not image_id.startswith("sha256:"):
        raise ProbeError(f"unexpected image id {image_id!r}")
    return image_id


CLOCK_ARGV = ["date", "+%s.%N"]


def parse_clock(stdout: str) -> float:
    try:
        return float(stdout.strip())
    except ValueError:
        raise ProbeError(f"unexpected date output {stdout.strip()!r}") from None


def tcp_reach_argv(address: str, port: int, timeout_s: int = 3) -> list[str]:
    """From one host, open a TCP connection to another (bash's /dev/tcp; no ping needed)."""
    return ["timeout", str(timeout_s), "bash", "-c", 'exec 3<>"/dev/tcp/$1/$2"', "reach", address, str(port)]
