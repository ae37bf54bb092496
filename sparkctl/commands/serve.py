"""serve / status / logs / stop as data: the remote commands as argv lists and their output parsed.

Pure (no I/O), like the rest of ``sparkctl.commands``: file writes (temporary name, sync, rename;
content on stdin), the profile's containers as ``docker inspect`` JSON, ``docker stop``/``rm``/``logs``
and the deployment record on each host. The parsers turn ``docker inspect`` and ``ss -p`` into values
(``Container``, port -> holder); ``sparkctl.commands.facts`` pairs them. The deploy lock and the audit
log are ``sparkctl.commands.lock``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sparkctl.commands import probes
from sparkctl.commands.docker import remote_profile_dir

DEPLOYMENT_FILE = "deployment.json"
STOP_TIMEOUT_S = 30  # docker stop's grace period before SIGKILL
LABEL_PROFILE = "sparkctl.profile"
LABEL_RANK = "sparkctl.rank"


def url_host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


_WRITE_SCRIPT = r"""set -e
dir=$1; name=$2; mode=$3
mkdir -p "$dir"
tmp=$(mktemp "$dir/.$name.XXXXXX")
trap 'rm -f "$tmp"' EXIT
cat > "$tmp"
chmod "$mode" "$tmp"
sync "$tmp" 2>/dev/null || true
mv -f "$tmp" "$dir/$name"
sync "$dir" 2>/dev/null || true
"""

# Containers of a profile (by label), any container of the plan's name, and every running
# sparkctl container (to name who holds a port): `docker inspect` JSON, "[]" when there are none.
# One listing of every container picks them, so a host runs one docker for the listing and one for
# the inspect (none when nothing was picked). A line of the listing (docker 20.10's `ps --format`
# fields): full ID, state, names (comma-separated, no leading slash), "+" when the container carries
# the sparkctl.profile label at all (its value may be empty), "-", then that label's value as JSON
# ("" when unset; JSON keeps a value with spaces or newlines in one field of one line).
CONTAINER_LINE_FORMAT = ('{{.ID}} {{.State}} {{.Names}} '
                         '{{range split .Labels ","}}{{if eq (index (split . "=") 0) "sparkctl.profile"}}+{{end}}{{end}}- '
                         '{{json (.Label "sparkctl.profile")}}')
_CONTAINERS_SCRIPT = r"""set -eu
# One docker at a time, never in a pipeline: a docker that fails (engine down, socket refused) fails
# the script with its own stderr, instead of reading as "no containers".
profile=$1; name=$2; format=$3
list=$(docker ps -a --no-trunc --format "$format")
ids=""
while read -r id state names labelled value; do
  [ -n "$id" ] || continue
  # this profile's: the label's value is the profile (profile names need no JSON escape)
  if [ "$value" = "\"$profile\"" ]; then ids="$ids $id"; continue; fi
  # the plan's name, exactly (names: the container's own, then any legacy link alias "other/alias")
  if [ -n "$name" ]; then case ",$names," in *",$name,"*) ids="$ids $id"; continue;; esac; fi
  # labelled and running: what `docker ps` lists without -a (running, paused, restarting)
  case "$labelled $state" in +*" running"|+*" paused"|+*" restarting") ids="$ids $id";; esac
done <<LISTING
$list
LISTING
if [ -z "$ids" ]; then echo '[]'; else docker inspect $ids; fi
"""

# No record is an empty answer; a record that exists but cannot be read is a failure.
_RECORD_SCRIPT = r"""set -eu
if [ -e "$1" ]; then exec cat -- "$1"; fi
"""


def write_file_argv(directory: str, name: str, mode: int) -> list[str]:
    return ["sh", "-c", _WRITE_SCRIPT, "sparkctl-write", directory, name, f"{mode:o}"]


def containers_argv(profile: str, name: str = "") -> list[str]:
    return ["sh", "-c", _CONTAINERS_SCRIPT, "sparkctl-containers", profile, name, CONTAINER_LINE_FORMAT]


# `docker inspect` of a name that is no container (docker 20.10.24: "Error: No such container: NAME" on
# stderr, "[]" on stdout, exit 1); an engine that is down says "Cannot connect to the Docker daemon".
NO_SUCH_CONTAINER = ("No such container",)


def container_argv(name: str) -> list[str]:
    """One container by its name, as ``docker inspect`` JSON: one docker, no shell. What a wait that
    knows its container asks every few seconds (the listing is two dockers and a shell)."""
    return ["docker", "inspect", "--type", "container", "--", name]


def stop_argv(names: list[str], timeout_s: int = STOP_TIMEOUT_S) -> list[str]:
    return ["docker", "stop", "--time", str(timeout_s), *names]


def remove_argv(names: list[str]) -> list[str]:
    return ["docker", "rm", "-f", *names]


def logs_argv(name: str, tail: int | None, follow: bool = False) -> list[str]:
    """``docker logs`` with stderr merged into stdout (the engines log to both)."""
    options = ["--tail", str(tail) if tail is not None else "all"] + (["--follow"] if follow else [])
    return ["sh", "-c", 'exec docker logs "$@" 2>&1', "sparkctl-logs", *options, name]


def image_layers_argv(image: str) -> list[str]:
    """The layer diff IDs of ``image``: its content, whatever its ID (an import or a rebuild of the
    same files gets another ID but the same layers)."""
    return probes.image_inspect_argv(image, "{{json .RootFS.Layers}}")


def parse_image_layers(stdout: str) -> tuple[str, ...]:
    try:
        layers = json.loads(stdout.strip() or "null")
    except json.JSONDecodeError:
        raise probes.ProbeError(f"unexpected image layers {stdout.strip()[:80]!r}") from None
    if not isinstance(layers, list) or not all(isinstance(layer, str) for layer in layers):
        raise probes.ProbeError(f"unexpected image layers {stdout.strip()[:80]!r}")
    return tuple(layers)


def record_argv(profile: str, state_dir: str) -> list[str]:
    return ["sh", "-c", _RECORD_SCRIPT, "sparkctl-record", f"{remote_profile_dir(profile, state_dir)}/{DEPLOYMENT_FILE}"]


def remove_record_argv(profile: str, state_dir: str) -> list[str]:
    return ["rm", "-f", "--", f"{remote_profile_dir(profile, state_dir)}/{DEPLOYMENT_FILE}"]


PORTS_WITH_USERS_ARGV = [*probes.PORTS_ARGV, "-p"]


# ---------------------------------------------------------------------------------------------
# Parsers (pure)


@dataclass
class Container:
    id: str
    name: str
    image: str
    status: str  # docker's State.Status: created, running, exited, dead, ...
    exit_code: int
    started_at: str
    finished_at: str
    error: str
    labels: dict[str, str]
    image_id: str = ""  # the image the container runs (its tag may name another by now)
    cmd: list[str] = field(default_factory=list)  # the engine argv it was started with
    env: dict[str, str] = field(default_factory=dict)  # its environment (engine.env's values among it)
    host_config: dict = field(default_factory=dict)  # docker inspect's HostConfig: limits, mounts, network
    restart_count: int = 0  # times docker restarted it (its restart policy)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def profile(self) -> str | None:
        return self.labels.get(LABEL_PROFILE)

    @property
    def rank(self) -> int | None:
        raw = self.labels.get(LABEL_RANK)
        return int(raw) if raw is not None and raw.isdigit() else None

    @property
    def restart_policy(self) -> str:
        """docker's restart policy for it (``no`` when none was given)."""
        return (self.host_config.get("RestartPolicy") or {}).get("Name") or "no"

    def describe(self) -> str:
        restarted = f" (restarted {self.restart_count} time{'s' if self.restart_count != 1 else ''})" if self.restart_count else ""
        if self.running:
            return f"running since {self.started_at[:19]}{restarted}"
        if self.status == "exited":
            return (f"exited with code {self.exit_code} at {self.finished_at[:19]}" + (f" ({self.error})" if self.error else "")
                    + restarted)
        return self.status + (f" ({self.error})" if self.error else "") + restarted

    def to_json(self) -> dict:
        return {"id": self.id[:12], "name": self.name, "image": self.image, "state": self.status,
                "exit_code": self.exit_code, "started_at": self.started_at, "finished_at": self.finished_at,
                "error": self.error or None, "rank": self.rank, "restart_count": self.restart_count}


def parse_containers(stdout: str) -> list[Container]:
    try:
        data = json.loads(stdout or "[]")
    except json.JSONDecodeError:
        raise probes.ProbeError("docker inspect printed no JSON") from None
    out = []
    for item in data:
        state = item.get("State") or {}
        config = item.get("Config") or {}
        out.append(Container(
            id=item.get("Id", ""),
            name=(item.get("Name") or "").lstrip("/"),
            image=config.get("Image", ""),
            status=state.get("Status", "unknown"),
            exit_code=int(state.get("ExitCode") or 0),
            started_at=state.get("StartedAt", ""),
            finished_at=state.get("FinishedAt", ""),
            error=state.get("Error", "") or ("OOM-killed" if state.get("OOMKilled") else ""),
            labels=dict(config.get("Labels") or {}),
            image_id=item.get("Image", ""),
            cmd=list(config.get("Cmd") or []),
            env=dict(entry.partition("=")[::2] for entry in config.get("Env") or []),
            host_config=dict(item.get("HostConfig") or {}),
            restart_count=int(item.get("RestartCount") or 0),
        ))
    return out


def parse_port_users(stdout: str) -> dict[int, str]:
    """``ss -Htlnp`` lines -> port -> "python3 (pid 123)" (or "" when ss cannot name the process)."""
    users: dict[int, str] = {}
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        port = fields[3].rsplit(":", 1)[-1]
        if not port.isdigit():
            continue
        match = re.search(r'\(\("([^"]+)",pid=(\d+)', line)
        users.setdefault(int(port), f"{match.group(1)} (pid {match.group(2)})" if match else "")
    return users
