"""The commands `sparkctl setup` runs on a host: what it looks at (as the login user) and what it
changes (as root, through sudo). Pure argv builders and parsers; ``ops/setup`` runs them.

What DGX OS needs on a rack's first day, as NVIDIA's two- and three-Spark playbooks do it by hand:
the user in the docker group, the ConnectX-7 twins addressed with MTU 9000 through a netplan file
(``netplan apply``), passwordless SSH between the boxes, and the NVIDIA runtime registered with
Docker (``nvidia-ctk runtime configure --runtime=docker``, then the engine reloaded).
"""

from __future__ import annotations

import json
import shlex

NETPLAN_FILE = "/etc/netplan/40-sparkctl-fabric.yaml"
FABRIC_MTU = 9000
KEY_FILE = "~/.ssh/id_ed25519"


def sudo_argv(argv: list[str], *, with_password: bool) -> list[str]:
    """``argv`` as root. ``-n`` never prompts (fails when sudo wants a password); with a password,
    ``-k -S -p ''`` makes sudo read it from the first line of stdin every time (``-k``: a cached
    credential would leave the line for the command to read)."""
    if with_password:
        return ["sudo", "-k", "-S", "-p", "", "--", *argv]
    return ["sudo", "-n", "--", *argv]


SUDO_PROBE = ["sudo", "-n", "true"]


def sudo_wants_password(stderr: str) -> bool:
    return "password is required" in stderr or "a terminal is required" in stderr


# --- docker group -----------------------------------------------------------------------------

GROUPS_ARGV = ["sh", "-c", 'id -un; id -Gn; getent group docker >/dev/null && echo has-docker-group || echo no-docker-group']


def parse_groups(stdout: str) -> tuple[str, set[str], bool]:
    """(user, their groups, does a docker group exist on the host)."""
    lines = stdout.splitlines() + ["", "", ""]
    return lines[0].strip(), set(lines[1].split()), lines[2].strip() == "has-docker-group"


def add_to_group_argv(user: str, group: str) -> list[str]:
    return ["usermod", "-aG", group, user]


# --- folders ----------------------------------------------------------------------------------

def folders_look_argv(paths: list[str]) -> list[str]:
    """One line per path: ``ok`` (a folder this user can write), ``creatable`` (absent, but its nearest
    existing ancestor is a folder the user can write), ``not-writable``, ``not-a-folder`` or ``missing``.
    Creatable is not ok: a folder a container bind-mounts that does not exist yet is created by
    Docker, as root, and the user can no longer write it."""
    script = ('for p in "$@"; do if [ -d "$p" ]; then if [ -w "$p" ]; then echo ok; else echo not-writable; fi; '
              'elif [ -e "$p" ]; then echo not-a-folder; else a="$p"; while [ ! -e "$a" ]; do a=$(dirname "$a"); done; '
              'if [ -d "$a" ] && [ -w "$a" ]; then echo creatable; else echo missing; fi; fi; done')
    return ["sh", "-c", script, "sh", *paths]


def make_own_folders_argv(paths: list[str]) -> list[str]:
    """As the login user (no root): each folder created with its parents, so every one is the user's."""
    return ["mkdir", "-p", "--", *paths]


def make_folders_argv(paths: list[str], user: str) -> list[str]:
    """One root command: each folder created (with its parents) and owned by ``user`` and their group."""
    return ["install", "-d", "-o", user, "-g", user, "-m", "0755", *paths]


# --- fabric -----------------------------------------------------------------------------------

LINKS_ARGV = ["sh", "-c", "command -v netplan >/dev/null && echo netplan || echo no-netplan; ip -j addr show"]


def parse_links(stdout: str) -> tuple[bool, dict[str, dict]]:
    """(does the host use netplan, interface -> {"mtu": int, "addresses": ["a.b.c.d/p", ...]})."""
    first, _, rest = stdout.partition("\n")
    links = {}
    for link in json.loads(rest or "[]"):
        addresses = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet"]
        links[link["ifname"]] = {"mtu": link.get("mtu"), "addresses": addresses}
    return first.strip() == "netplan", links


def netplan_yaml(plan: list[tuple[str, str]]) -> str:
    """The netplan file for the fabric: each interface its address and MTU 9000 (JSON is YAML)."""
    ethernets = {name: {"dhcp4": False, "addresses": [address], "mtu": FABRIC_MTU} for name, address in plan}
    return "# Written by sparkctl setup: the ConnectX-7 fabric interfaces.\n" + json.dumps(
        {"network": {"version": 2, "ethernets": ethernets}}, indent=2) + "\n"


def write_netplan_argv(content: str) -> list[str]:
    """Root: the netplan file (mode 0600, as netplan wants), then applied."""
    script = 'umask 077 && printf %s "$1" > "$2.tmp" && mv "$2.tmp" "$2" && netplan apply'
    return ["sh", "-c", script, "sh", content, NETPLAN_FILE]


def ip_fabric_argv(plan: list[tuple[str, str]]) -> list[str]:
    """Root, without netplan: the same result with iproute2 (MTU, the address, the link up)."""
    lines = []
    for name, address in plan:
        dev = shlex.quote(name)
        lines.append(f"ip link set dev {dev} mtu {FABRIC_MTU} && ip addr replace {shlex.quote(address)} dev {dev} "
                     f"&& ip link set dev {dev} up")
    return ["sh", "-c", " && ".join(lines)]


# --- SSH mesh ---------------------------------------------------------------------------------

OWN_KEY_ARGV = ["sh", "-c", f'set -e; umask 077; mkdir -p ~/.ssh; [ -f {KEY_FILE} ] || '
                f'{{ ssh-keygen -q -t ed25519 -N "" -C "$(id -un)@$(hostname)-sparkctl" -f {KEY_FILE} && echo created >&2; }}; '
                f'cat {KEY_FILE}.pub']


def append_lines_argv(path: str, lines: list[str]) -> list[str]:
    """Add each line missing from ``path`` (under ~); prints how many it added."""
    script = ('set -e; umask 077; mkdir -p ~/.ssh; f="$HOME/$1"; shift; touch "$f"; n=0; '
              'for l in "$@"; do grep -qxF -- "$l" "$f" || { printf "%s\\n" "$l" >> "$f"; n=$((n+1)); }; done; echo $n')
    return ["sh", "-c", script, "sh", path, *lines]


# --- NVIDIA runtime ---------------------------------------------------------------------------

# "no-access" when this user may not use the engine's socket (docker's own --format output hides why).
# One docker info: its runtimes, or the reason the engine did not answer on stderr (docker 20.10 exits
# 0 with its daemon down and keeps the reason in ServerErrors; a template reading a field of an engine
# that did not answer fails and hides it, so the template reads none then).
RUNTIMES_FORMAT = '{{if .ServerErrors}}E {{join .ServerErrors "; "}}{{else}}R {{json .Runtimes}}{{end}}'
RUNTIMES_ARGV = ["sh", "-c", '[ -S /var/run/docker.sock ] && [ ! -w /var/run/docker.sock ] && { echo no-access; exit 0; }; '
                 'out=$(docker info --format "$1") || exit; '
                 'case $out in "R "*) printf "%s\\n" "${out#R }";; *) printf "%s\\n" "${out#E }" >&2; exit 1;; esac',
                 "sh", RUNTIMES_FORMAT]
CTK_PRESENT_ARGV = ["sh", "-c", "command -v nvidia-ctk"]
CONFIGURE_RUNTIME_ARGV = ["nvidia-ctk", "runtime", "configure", "--runtime=docker"]
# systemd's docker.service when the host runs systemd, else the engine's own pidfile (SIGHUP
# reloads daemon.json's runtimes without stopping containers).
RELOAD_DOCKER_ARGV = ["sh", "-c", 'if [ -d /run/systemd/system ]; then systemctl restart docker; '
                      'else kill -HUP "$(cat /var/run/docker.pid)"; fi']


def parse_runtimes(stdout: str) -> set[str] | None:
    """Docker's runtimes, or None when this user cannot use Docker yet."""
    if stdout.strip() == "no-access":
        return None
    return set(json.loads(stdout or "{}") or {})


AUTHORIZED = ".ssh/authorized_keys"
KNOWN_HOSTS = ".ssh/known_hosts"
# the mesh's one read of a host: its own public key, then its authorized keys, then its known hosts
MESH_READ_ARGV = ["sh", "-c", f'cat {KEY_FILE}.pub 2>/dev/null; echo "--"; cat ~/{AUTHORIZED} 2>/dev/null; '
                  f'echo "--"; cat ~/{KNOWN_HOSTS} 2>/dev/null; true']
