"""A sandbox host's own /etc and the user's home: who may log in, with which groups and sudo rights.

A host gets a copy of this machine's /etc when it is created (then it is the host's: `usermod`,
`netplan` or `nvidia-ctk` inside the host change only that host), with the sandbox's user added as
DGX OS has it: ``nvidia``, an ordinary user with sudo. A prepared host also has the user in the
docker group and sparkctl's folders owned by the user; a bare host has neither (``sparkctl setup``
gives them).
"""

from __future__ import annotations

import os
import shutil

from sparkctl.fileio import atomic_write
from sparkctl.sandbox import layout as L

SUDOERS_FILE = "sudoers.d/90-sparkctl-sandbox"
# Folders under the host's /mnt/nvme a prepared host has (the sandbox inventory's paths).
PREPARED_NVME_FOLDERS = ("models", "engram", "hf-cache")


def _skip_secrets(folder: str, names: list[str]) -> set[str]:
    """This machine's SSH host keys stay here; each host has its own (``cluster._keygen``)."""
    if os.path.basename(folder) == "ssh":
        return {n for n in names if n.startswith("ssh_host_")}
    return set()


def create(layout, host) -> None:
    """Make ``host.etc_dir``: a copy of /etc with the sandbox's user, groups, shadow and sudoers."""
    staging = host.etc_dir + ".new"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree("/etc", staging, symlinks=True, ignore=_skip_secrets, ignore_dangling_symlinks=True)
    _rewrite(os.path.join(staging, "passwd"), _passwd_lines)
    _rewrite(os.path.join(staging, "group"), lambda lines: _group_lines(lines, in_docker=not layout.bare))
    _rewrite(os.path.join(staging, "gshadow"), lambda lines: _gshadow_lines(lines, in_docker=not layout.bare))
    _rewrite(os.path.join(staging, "shadow"), _shadow_lines)
    sudo_rule = "ALL=(ALL:ALL) ALL" if layout.password_sudo else "ALL=(ALL:ALL) NOPASSWD: ALL"
    os.makedirs(os.path.join(staging, "sudoers.d"), exist_ok=True)
    atomic_write(os.path.join(staging, SUDOERS_FILE), f"{L.USER} {sudo_rule}\n", mode=0o440)
    with open(os.path.join(staging, "hostname"), "w") as handle:
        handle.write(host.name + "\n")
    for leftover in ("docker/daemon.json", "docker/key.json"):  # this machine's engine settings are not the host's
        try:
            os.unlink(os.path.join(staging, leftover))
        except FileNotFoundError:
            pass
    os.rename(staging, host.etc_dir)


def _rewrite(path: str, change) -> None:
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        lines = []
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o644
    atomic_write(path, "\n".join(change(lines)) + "\n", mode=mode)


def _without(lines: list[str], name: str, number: int | None) -> list[str]:
    """``lines`` of a colon file minus the entry named ``name`` and any whose id (field 3) is ``number``."""
    kept = []
    for line in lines:
        fields = line.split(":")
        if fields[0] == name or (number is not None and len(fields) > 2 and fields[2] == str(number)):
            continue
        kept.append(line)
    return kept


def _passwd_lines(lines: list[str]) -> list[str]:
    uid = L.USER_UID
    return _without(lines, L.USER, uid) + [f"{L.USER}:x:{uid}:{uid}:{L.USER}:{L.USER_HOME}:/bin/bash"]


def _group_lines(lines: list[str], in_docker: bool) -> list[str]:
    out = _without(lines, L.USER, L.USER_UID) + [f"{L.USER}:x:{L.USER_UID}:"]
    if not any(line.startswith("docker:") for line in out):
        used = {int(f[2]) for f in (line.split(":") for line in out) if len(f) > 2 and f[2].isdigit()}
        out.append(f"docker:x:{next(g for g in range(990, 100, -1) if g not in used)}:")
    return [_with_member(line, in_docker) if line.startswith("docker:") else line for line in out]


def _gshadow_lines(lines: list[str], in_docker: bool) -> list[str]:
    out = [line for line in lines if line.split(":")[0] != L.USER] + [f"{L.USER}:!::"]
    if not any(line.startswith("docker:") for line in out):
        out.append("docker:!::")
    return [_with_member(line, in_docker) if line.startswith("docker:") else line for line in out]


def _with_member(line: str, member: bool) -> str:
    fields = line.split(":")
    members = [m for m in fields[-1].split(",") if m and m != L.USER]
    if member:
        members.append(L.USER)
    return ":".join(fields[:-1] + [",".join(members)])


def _shadow_lines(lines: list[str]) -> list[str]:
    """Every account without a usable password (this machine's hashes stay here); the user's is "*"
    (no password, key login only) until a password-sudo sandbox sets one with chpasswd."""
    out = []
    for line in _without(lines, L.USER, None):
        fields = line.split(":")
        if len(fields) > 1 and fields[1] not in ("", "*") and not fields[1].startswith("!"):
            fields[1] = "*"
        out.append(":".join(fields))
    return out + [f"{L.USER}:*:19000:0:99999:7:::"]


def has_password(host) -> bool:
    try:
        with open(os.path.join(host.etc_dir, "shadow")) as handle:
            for line in handle:
                fields = line.split(":")
                if fields[0] == L.USER:
                    return fields[1] not in ("*", "", "!") and not fields[1].startswith("!")
    except FileNotFoundError:
        pass
    return False


def _own(path: str, mode: int) -> None:
    os.chown(path, L.USER_UID, L.USER_UID)
    os.chmod(path, mode)


def write_user_home(layout, host) -> None:
    """The user's home with this machine's key authorized; a prepared host's user also has the
    cluster's host-to-host key and sparkctl's folders. Lines setup added are kept."""
    ssh_dir = os.path.join(host.user_home, ".ssh")
    os.makedirs(ssh_dir, exist_ok=True)
    os.chmod(host.home_dir, 0o755)
    _own(host.user_home, 0o750)
    _own(ssh_dir, 0o700)
    wanted = [_public_key(layout.identity_file)]
    if not layout.bare:
        wanted.append(_public_key(layout.hosts_identity_file))
        for suffix, mode in (("", 0o600), (".pub", 0o644)):
            target = os.path.join(ssh_dir, "id_ed25519" + suffix)
            if not os.path.exists(target):
                with open(layout.hosts_identity_file + suffix) as handle:
                    atomic_write(target, handle.read(), mode=mode)
                _own(target, mode)
    authorized = os.path.join(ssh_dir, "authorized_keys")
    try:
        with open(authorized) as handle:
            present = handle.read().splitlines()
    except FileNotFoundError:
        present = []
    lines = present + [key for key in wanted if key not in present]
    if lines != present or not os.path.exists(authorized):
        atomic_write(authorized, "\n".join(lines) + "\n", mode=0o600)
    _own(authorized, 0o600)
    if not layout.bare:
        prepare_folders(host)


def prepare_folders(host) -> None:
    """What a prepared host has: sparkctl's state folder and the NVMe folders owned by the user."""
    _own(host.var_lib_dir, 0o755)
    _own(host.nvme_dir, 0o755)
    for name in PREPARED_NVME_FOLDERS:
        path = os.path.join(host.nvme_dir, name)
        os.makedirs(path, exist_ok=True)
        _own(path, 0o755)


def _public_key(path: str) -> str:
    with open(path + ".pub") as handle:
        kind, b64 = handle.read().split()[:2]
    return f"{kind} {b64}"


def give_to_user(path: str) -> None:
    """Make what this machine wrote under a host's folder (``path``, recursively) the login user's,
    as if the user had put it there on the host (sparkctl on the host runs as that user)."""
    for folder, _, files in os.walk(path):
        os.chown(folder, L.USER_UID, L.USER_UID)
        for name in files:
            os.lchown(os.path.join(folder, name), L.USER_UID, L.USER_UID)


def write_peer_known_hosts(layout) -> None:
    """A prepared host's user has every other host's key pinned, under the names and addresses
    `sparkctl setup` pins them by (its ssh_mesh step then finds nothing to do)."""
    keys = {h.name: _public_key(h.host_key) for h in layout.hosts}
    for host in layout.hosts:
        lines = [f"{','.join(dict.fromkeys([p.name, p.address, *p.fabric_addresses]))} {keys[p.name]}"
                 for p in layout.hosts if p.name != host.name]
        path = os.path.join(host.user_home, ".ssh", "known_hosts")
        try:
            with open(path) as handle:
                present = handle.read().splitlines()
        except FileNotFoundError:
            present = []
        missing = [line for line in lines if line not in present]
        if missing or not os.path.exists(path):
            atomic_write(path, "\n".join(present + missing) + "\n", mode=0o600)
        _own(path, 0o600)
