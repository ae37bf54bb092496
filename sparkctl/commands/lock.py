"""The deploy lock and the audit log as data: their remote scripts as argv lists, their text parsed.

Pure (no I/O). The lock is a folder ``<state_dir>/deploy.lock`` on the inventory's head holding
``info.json``: who took it, when, for what, a random token (only its holder releases it) and the
holder's process (control machine, pid, process start time), so a later run can tell a live
holder from a dead one. ``sparkctl.ops.lock`` runs these.
"""

from __future__ import annotations

import json

LOCK_NAME = "deploy.lock"
AUDIT_NAME = "audit.log"

# Exit codes of the scripts below (the shell's own failures use 1 and 2).
LOCK_HELD = 3  # lock script: someone else holds it (its info.json on stdout)
NOT_HOLDER = 4  # unlock script: the lock is not (or no longer) ours; it is left alone


def lock_dir(state_dir: str) -> str:
    """Where the deploy lock lives under the inventory's ``paths.state_dir``."""
    return f"{state_dir}/{LOCK_NAME}"


def audit_log(state_dir: str) -> str:
    """Where the audit log lives under the inventory's ``paths.state_dir``."""
    return f"{state_dir}/{AUDIT_NAME}"


# The lock appears with its details already inside: a private folder holding info.json is
# renamed into place (rename is atomic and fails onto a non-empty folder), so a second run never
# sees a lock without details.
_LOCK_SCRIPT = r"""set -eu
mkdir -p "$(dirname "$1")"
tmp=$(mktemp -d "$1.XXXXXX")
trap 'rm -rf -- "$tmp"' EXIT
printf '%s\n' "$2" > "$tmp/info.json"
if mv -T -- "$tmp" "$1" 2>/dev/null; then exit 0; fi
if [ -d "$1" ]; then
  cat "$1/info.json" 2>/dev/null || true
  exit 3
fi
mv -T -- "$tmp" "$1"
"""

# rm's own status: a lock it could not remove (another user's files) is a failure, never "released".
_UNLOCK_SCRIPT = r"""if grep -q -F -- "$2" "$1/info.json" 2>/dev/null; then exec rm -rf -- "$1"; fi
exit 4
"""

# No lock is an empty answer, a lock being taken (no details yet) "{}"; a lock that cannot be read
# (permissions, I/O) is a failure, never "no lock".
_READ_SCRIPT = r"""set -eu
if [ -e "$1/info.json" ]; then exec cat -- "$1/info.json"; fi
if [ -d "$1" ]; then echo '{}'; fi
"""

_AUDIT_SCRIPT = r"""set -eu
mkdir -p "$(dirname "$1")"
printf '%s\n' "$2" >> "$1"
"""


def lock_argv(info: dict, path: str) -> list[str]:
    return ["sh", "-c", _LOCK_SCRIPT, "sparkctl-lock", path, json.dumps(info, sort_keys=True)]


def unlock_argv(token: str, path: str) -> list[str]:
    return ["sh", "-c", _UNLOCK_SCRIPT, "sparkctl-unlock", path, token]


def read_lock_argv(path: str) -> list[str]:
    """The lock's info.json; ``{}`` for a lock folder without one; nothing when there is no lock."""
    return ["sh", "-c", _READ_SCRIPT, "sparkctl-read-lock", path]


def break_lock_argv(path: str) -> list[str]:
    return ["rm", "-rf", "--", path]


def parse_lock_info(stdout: str) -> dict | None:
    """The lock's details; None when no lock is held; {} when one is held without readable details."""
    text = stdout.strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def audit_argv(line: str, path: str) -> list[str]:
    return ["sh", "-c", _AUDIT_SCRIPT, "sparkctl-audit", path, line]


def audit_line(when: str, who: str, verb: str, fields: dict) -> str:
    """``2026-11-30T12:00:00Z root@ctl serve profile=tp4 hosts=a,b result=ok ...`` (values without spaces)."""
    parts = [when, who, verb] + [f"{k}={_audit_value(v)}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


def _audit_value(value) -> str:
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return "_".join(text.split()) or "-"
