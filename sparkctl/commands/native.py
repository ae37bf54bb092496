"""The native launcher as data: the engine as a process on the host, not a container (pure, no I/O).

What the single-box engine's README does with ``start.sh`` / ``stop.sh`` ("Two ways to run it",
Native): ``nohup`` + a pidfile, port and memory guards, its own log; stop is SIGTERM, SIGKILL
after a grace period, then wait for the memory to come back.

Why a detached process and a pidfile rather than a transient systemd unit (``systemd-run``):
the same start works on every box, including those without systemd as PID 1 (containers, the
sandbox's hosts) and without root (a user unit needs a lingering user session); the README's
own launcher does exactly this, so its operators recognise the files; and everything about the
process (pid, log, settings) lives in one folder under the state dir, next to the container
path's files. What systemd would add (restart on failure) is what a 20-minute warm start makes
unwelcome anyway.

Under ``<state_dir>/<profile>/``: ``engine.env`` (the ``.env`` settings, mode 0600: it may hold
tokens), ``launch.sh`` (cd, read the settings, exec the engine), ``engine.pid`` and ``engine.log``
(the previous run's is kept as ``engine.log.1``). The process carries ``SPARKCTL_PROFILE=<name>``
in its environment: stop and status act on the pid only when ``/proc/<pid>/environ`` says so, so a
recycled pid is never signalled.

The host facts the guards need come from one probe (``ROOM_SCRIPT``, python3 on the host): who
listens on a port (pid, command, container via its cgroup or a published port), MemAvailable,
and the processes holding the most memory with their containers.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from sparkctl.commands import probes

ENV_NAME = "engine.env"
LAUNCH_NAME = "launch.sh"
PID_NAME = "engine.pid"
LOG_NAME = "engine.log"
PROFILE_MARK = "SPARKCTL_PROFILE"
ALREADY_RUNNING = 3


def _in_directory(name: str) -> property:
    """A file of the deployment, in its folder."""
    return property(lambda paths: f"{paths.directory}/{name}")


@dataclass(frozen=True)
class NativePaths:
    directory: str
    env_file = _in_directory(ENV_NAME)
    launch = _in_directory(LAUNCH_NAME)
    pidfile = _in_directory(PID_NAME)
    log = _in_directory(LOG_NAME)


def engine_env(profile) -> dict[str, str]:
    """The engine's ``.env`` settings from the profile (the README's env.example names), then ``env:``."""
    sb, serving = profile.single_box, profile.serving
    env = {
        "MODEL_DIR": sb.model_dir,
        "HOST": serving.host,
        "PORT": str(serving.port),
        "SERVED_MODEL_NAME": serving.served_model_name,
        "MAX_SEQ": str(profile.max_model_len),
        "SPEC": "1" if sb.spec else "0",
        "DEFAULT_THINKING": sb.default_thinking,
        "DEFAULT_EFFORT": str(sb.default_effort),
        "EXPERT_FORMAT": sb.expert_format,
        "DSV41_PRUNE_RANK": sb.prune_rank,
        "DSV41_PRUNE_SOURCE": sb.prune_source,
        "MIN_FREE_GIB": f"{sb.min_free_gib:g}",
    }
    if sb.prune_keep is not None:
        env["PRUNE_KEEP"] = f"{sb.prune_keep:g}"
    if sb.arena_gb is not None:
        env["ARENA_GB"] = f"{sb.arena_gb:g}"
    env.update(profile.env)
    env[PROFILE_MARK] = profile.name
    return env


# The engine writes its traces and bench results under ./results of its checkout (the README's
# "Layout"; the container path bind-mounts that folder at /app/results).
RESULTS_DIR = "results"


def engine_folders(workdir: str) -> list[str]:
    """The folders the engine writes, which the launcher makes before the start."""
    return [f"{workdir}/{RESULTS_DIR}"]


def make_folders_argv(workdir: str, folders: list[str]) -> list[str]:
    """As the login user, before the start: the engine's folders exist and are the user's (made by the
    engine or a container they could be root's). Only inside an existing checkout: a missing
    ``workdir`` fails here, naming it, rather than being made empty."""
    script = ('cd -- "$1" 2>/dev/null || { echo "$1 is not a folder this user can enter" >&2; exit 1; }; '
              'shift; mkdir -p -- "$@"')
    return ["sh", "-c", script, "sh", workdir, *folders]


def env_file_text(env: dict[str, str], title: str) -> str:
    lines = [f"# {title}", "# Rendered by sparkctl from the profile; `set -a; . this-file` reads it."]
    lines += [f"{key}={shlex.quote(value)}" for key, value in env.items()]
    return "\n".join(lines) + "\n"


def launch_script(workdir: str, command: list[str], env_file: str) -> str:
    """cd to the checkout, export the settings, exec the engine (so the pid is the engine's)."""
    program = command[0]
    if not program.startswith("/") and "/" in program:
        program = f"{workdir}/{program}"
    return (
        "#!/bin/sh\n"
        "# The engine, as the native launcher starts it (rendered by sparkctl).\n"
        f"cd {shlex.quote(workdir)} || exit 1\n"
        "set -a\n"
        f". {shlex.quote(env_file)}\n"
        "set +a\n"
        f"exec {shlex.join([program, *command[1:]])}\n"
    )


# $1 dir, $2 profile. Refuses (exit 3, "running PID") when this profile's engine already runs.
# setsid: a session of its own, so the ssh session's end does not reach it; as the background child
# of a non-interactive shell it is not a group leader, so setsid does not fork and $! is the engine.
_START_SCRIPT = r"""set -e
cd "$1"
if [ -f engine.pid ]; then
  pid=$(cat engine.pid)
  if [ -n "$pid" ] && tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "SPARKCTL_PROFILE=$2"; then
    echo "running $pid"; exit 3
  fi
fi
if [ -f engine.log ]; then mv -f engine.log engine.log.1; fi
setsid ./launch.sh > engine.log 2>&1 < /dev/null &
echo $! > engine.pid.tmp
mv -f engine.pid.tmp engine.pid
echo "started $!"
"""

# $1 pidfile, $2 profile. Prints one of: running PID / stale PID / stopped.
# No pidfile is "stopped"; a pidfile that cannot be read fails (never read as "stopped").
_STATE_FUNCS = r"""set -eu
pid=""
if [ -e "$1" ]; then pid=$(cat -- "$1"); fi
mark="SPARKCTL_PROFILE=$2"
ours() { tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx -- "$mark"; }
alive() { [ -r "/proc/$pid/stat" ] && [ "$(sed 's/.*) //' "/proc/$pid/stat" | cut -c1)" != Z ]; }
"""

_STATE_SCRIPT = _STATE_FUNCS + r"""if [ -z "$pid" ]; then echo stopped
elif alive && ours; then echo "running $pid"
else echo "stale $pid"; fi
"""

# $1 pidfile, $2 profile, $3 grace seconds. SIGTERM, wait up to the grace, SIGKILL, wait (bounded).
_STOP_SCRIPT = _STATE_FUNCS + r"""if [ -z "$pid" ]; then echo stopped; exit 0; fi
if ! alive || ! ours; then rm -f "$1"; echo "stale $pid"; exit 0; fi
kill -TERM "$pid" 2>/dev/null || true
i=0
while alive && [ "$i" -lt $(( $3 * 10 )) ]; do sleep 0.1; i=$((i + 1)); done
how=terminated
if alive; then
  how=killed
  kill -KILL "$pid" 2>/dev/null || true
  i=0
  while alive && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  if alive; then echo "unkillable $pid"; exit 1; fi
fi
rm -f "$1"
echo "$how $pid $(( i / 10 ))"
"""


def start_argv(paths: NativePaths, profile: str) -> list[str]:
    return ["sh", "-c", _START_SCRIPT, "sh", paths.directory, profile]


def state_argv(paths: NativePaths, profile: str) -> list[str]:
    return ["sh", "-c", _STATE_SCRIPT, "sh", paths.pidfile, profile]


def stop_argv(paths: NativePaths, profile: str, grace_s: int) -> list[str]:
    return ["sh", "-c", _STOP_SCRIPT, "sh", paths.pidfile, profile, str(int(grace_s))]


def log_tail_argv(paths: NativePaths, lines: int) -> list[str]:
    return ["tail", "-n", str(int(lines)), paths.log]


@dataclass(frozen=True)
class ProcessState:
    state: str  # running | stale | stopped | started | terminated | killed | unkillable
    pid: int | None = None

    @property
    def running(self) -> bool:
        return self.state in ("running", "started")


def parse_state(stdout: str) -> ProcessState:
    """The last line of the start/state/stop scripts: ``WORD [PID ...]``."""
    lines = stdout.strip().splitlines()
    words = lines[-1].split() if lines else []
    if not words:
        return ProcessState("stopped")
    pid = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    return ProcessState(words[0], pid)


# ----------------------------------------------------------------------------------------- the room

# Prints one JSON document: MemAvailable, who listens on each asked port (pid, command, RSS,
# container), the `top` processes by RSS, and the running containers (id -> name, published ports).
ROOM_SCRIPT = r"""
import json, os, re, subprocess, sys
ports = [int(p) for p in sys.argv[1].split(",") if p]
top = int(sys.argv[2])
def meminfo():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
def listening_inodes():
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A":
                port = int(f[1].rsplit(":", 1)[1], 16)
                if port in ports:
                    found[f[9]] = port
    return found
def proc(pid):
    info = {"pid": pid, "command": "", "rss": 0, "container_id": None}
    try:
        info["command"] = open("/proc/%d/comm" % pid).read().strip()
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                info["rss"] = int(line.split()[1]) * 1024
        m = re.search(r"([0-9a-f]{64})", open("/proc/%d/cgroup" % pid).read())
        info["container_id"] = m.group(1) if m else None
    except OSError:
        pass
    return info
inodes = listening_inodes()
holders = {}
pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
if inodes:
    for pid in pids:
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                if link.startswith("socket:["):
                    port = inodes.get(link[8:-1])
                    if port is not None:
                        holders.setdefault(str(port), [])
                        if all(h["pid"] != pid for h in holders[str(port)]):
                            holders[str(port)].append(proc(pid))
        except OSError:
            continue
for port in inodes.values():
    holders.setdefault(str(port), [])
rss = []
for pid in pids:
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                rss.append((int(line.split()[1]), pid))
    except OSError:
        pass
rss.sort(reverse=True)
containers = {}
try:
    out = subprocess.run(["docker", "ps", "--no-trunc", "--format", "{{.ID}}\t{{.Names}}\t{{.Ports}}"],
                         capture_output=True, text=True, timeout=20).stdout
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            containers[parts[0]] = {"name": parts[1], "ports": parts[2] if len(parts) > 2 else ""}
except Exception:
    pass
print(json.dumps({"mem_available": meminfo(), "listeners": holders,
                  "top": [proc(pid) for _, pid in rss[:top]], "containers": containers}))
"""


def room_argv(ports: list[int], top: int = 5) -> list[str]:
    return probes.stdlib_python_argv(ROOM_SCRIPT, ",".join(str(p) for p in ports), str(int(top)))


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    rss: int
    container: str | None  # the container's name, when the process runs in one

    def describe(self) -> str:
        where = f", container {self.container}" if self.container else ""
        return f"{self.command or '?'} (pid {self.pid}, {self.rss / 2**30:.1f} GiB{where})"


@dataclass
class Room:
    mem_available: int
    listeners: dict[int, list[Holder]] = field(default_factory=dict)
    top: list[Holder] = field(default_factory=list)
    published: dict[int, str] = field(default_factory=dict)  # host port -> container publishing it


def parse_room(stdout: str) -> Room:
    data = json.loads(stdout)
    containers = data.get("containers") or {}

    def holder(entry: dict) -> Holder:
        cid = entry.get("container_id")
        name = containers.get(cid, {}).get("name") if cid else None
        if cid and not name:
            name = cid[:12]
        return Holder(int(entry["pid"]), str(entry.get("command", "")), int(entry.get("rss") or 0), name)

    published: dict[int, str] = {}
    for info in containers.values():
        for port in re.findall(r":(\d+)->", info.get("ports", "")):
            published.setdefault(int(port), info["name"])
    return Room(
        mem_available=int(data["mem_available"]),
        listeners={int(port): [holder(h) for h in entries] for port, entries in (data.get("listeners") or {}).items()},
        top=[holder(h) for h in data.get("top") or []],
        published=published,
    )
