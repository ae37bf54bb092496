"""Constrained field types shared by the inventory and the profiles.

Anything that ends up on a remote command line is checked here first, so a value with spaces or
shell metacharacters is refused with a clear message long before it could reach a shell.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Annotated, Any

from pydantic import AfterValidator

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
_DNS_RE = re.compile(r"^(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\Z")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,14}\Z")
VARIABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # an environment variable's or a build argument's name


def _name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid name (letters, digits, '.', '_', '-'; no spaces or shell characters)"
        )
    return value


def _address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not _DNS_RE.match(value) or value.replace(".", "").isdigit():
        raise ValueError(f"{value!r} is neither an IP address nor a valid hostname")
    return value


def _user(value: str) -> str:
    if not _USER_RE.match(value):
        raise ValueError(f"{value!r} is not a valid user name")
    return value


def _ifname(value: str) -> str:
    if not _IFNAME_RE.match(value):
        raise ValueError(f"{value!r} is not a valid interface/device name (at most 15 characters, no spaces)")
    return value


def _abs_path(value: str) -> str:
    expanded = os.path.expanduser(value)
    if not os.path.isabs(expanded):
        raise ValueError(f"{value!r} is a relative path; use an absolute path (or ~/...)")
    if any(ch in expanded for ch in "\n\r\0"):
        raise ValueError("path contains control characters")
    return os.path.normpath(expanded)


def _host_path(value: str) -> str:
    """A path on the hosts that may become half of a ``docker run -v SRC:DST[:MODE]``: ':' would split it
    there (docker then reads the rest as a mode), ',' would in a ``--mount``."""
    path = _abs_path(value)
    for ch in ":,":
        if ch in path:
            raise ValueError(f"{value!r} contains {ch!r}, which docker reads as a separator in -v/--mount; "
                             "rename or link the folder")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        raise ValueError("path contains control characters")
    return path


def scalar_strings(value: Any, *, name: str, value_is: str, true_false: tuple[str, str]) -> Any:
    """A YAML mapping of variables (``env:``, a layer's ``args:``) as names to strings, before the
    model's own type check: a name that is not a variable's (``name``: what the key is called) or a
    value that is a mapping, a list or empty (``value_is``: what the value is called) is refused,
    naming it; a YAML boolean becomes ``true_false[0]`` or ``[1]`` (what the reader of the value
    expects: ``1``/``0`` for an engine's environment, ``true``/``false`` for a Dockerfile).
    Anything but a mapping is left for the type check to refuse."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not VARIABLE_RE.match(key):
            raise ValueError(f"{key!r} is not a valid {name} name")
        if isinstance(item, (dict, list)) or item is None:
            raise ValueError(f"{key}: {value_is} must be a string or a number")
        out[key] = true_false[0 if item else 1] if isinstance(item, bool) else str(item)
    return out


def matching(pattern: str, refusal: str) -> Any:
    """A string type that must match ``pattern`` whole, refused as ``refusal`` (``{value!r}`` names it)."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(refusal.format(value=value))
        return value

    return Annotated[str, AfterValidator(check)]


Name = Annotated[str, AfterValidator(_name)]
Address = Annotated[str, AfterValidator(_address)]
UserName = Annotated[str, AfterValidator(_user)]
InterfaceName = Annotated[str, AfterValidator(_ifname)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
HostPath = Annotated[str, AfterValidator(_host_path)]  # a path on the hosts, mounted into containers


# No number a profile holds comes near this (the largest real ones: router.max_payload_bytes 512 MiB,
# a 1M-token context): a bigger one is a slip of the keyboard, and the memory plan's arithmetic on
# 1e308 overflows to inf and then nan (it crashed with "cannot convert float NaN to integer").
MAX_SETTING = 10**15


def not_huge(value: Any) -> Any:
    """A profile number within +-MAX_SETTING (a field validator for every field of a model)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > MAX_SETTING:
        digits = str(value)
        shown = digits if len(digits) <= 24 else f"{value:.3g}" if isinstance(value, float) else f"a {len(digits)}-digit number"
        raise ValueError(f"{shown} is beyond any real setting (at most 1e15)")
    return value
