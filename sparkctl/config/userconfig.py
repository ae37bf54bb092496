"""The per-user defaults: an inventory and a profile that later commands use without -i/--profile.

They live in the XDG config folder (``$XDG_CONFIG_HOME/sparkctl``, else ``~/.config/sparkctl``):
``inventory.yaml`` (what ``sparkctl init`` writes) and ``config.yaml`` (``inventory:`` another
file to use instead, ``profile:`` the default profile). Where the inventory comes from, first hit
wins: ``-i``, ``$SPARKCTL_INVENTORY``, ``./inventory.yaml``, the per-user one.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from sparkctl.config.yamlfile import load_yaml_file
from sparkctl.errors import ConfigError

CONFIG_FILE = "config.yaml"
INVENTORY_FILE = "inventory.yaml"
_KEYS = ("inventory", "profile")


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    # The XDG spec: a relative $XDG_CONFIG_HOME is invalid and ignored.
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "sparkctl"


def read_config() -> dict:
    """``config.yaml`` as a dict ({} when absent). A broken one is an error naming it (exit 2)."""
    path = config_dir() / CONFIG_FILE
    if not path.exists():
        return {}
    doc = load_yaml_file(path)
    data = doc.data if doc.data is not None else {}
    if not isinstance(data, dict):
        raise ConfigError("a mapping with `inventory:` and/or `profile:`", file=str(path))
    for key, value in data.items():
        if key not in _KEYS:
            raise ConfigError(f"unknown key (known: {', '.join(_KEYS)})", file=str(path), field=str(key),
                              line=doc.line_of((key,)))
        if value is not None and not isinstance(value, str):
            raise ConfigError("a string", file=str(path), field=key, line=doc.line_of((key,)))
    return data


def write_config(**values: str | None) -> Path:
    """Set keys of ``config.yaml`` (``None`` leaves a key as it is), atomically."""
    data = read_config()
    data.update({k: v for k, v in values.items() if v is not None})
    path = config_dir() / CONFIG_FILE
    write_atomically(path, "# sparkctl's per-user defaults (written by `sparkctl init`).\n"
                     + yaml.safe_dump(data, sort_keys=True))
    return path


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """``text`` into ``path`` through a temporary file and a rename: a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def default_inventory() -> Path | None:
    """The per-user inventory: ``config.yaml``'s ``inventory:``, else ``inventory.yaml`` beside it."""
    configured = read_config().get("inventory")
    if configured:
        return Path(os.path.expanduser(configured))
    candidate = config_dir() / INVENTORY_FILE
    return candidate if candidate.exists() else None


def default_profile() -> str | None:
    """``$SPARKCTL_PROFILE``, then ``config.yaml``'s ``profile:`` (None: the verb asks for --profile)."""
    return os.environ.get("SPARKCTL_PROFILE") or read_config().get("profile") or None


def no_inventory_error(tried: list[str]) -> ConfigError:
    """What to say when no inventory was found anywhere: where we looked and how to make one."""
    return ConfigError(
        f"no inventory (looked for {', '.join(tried)}): write one with `sparkctl init --hosts HOST1,HOST2,...` "
        "(asks each host over SSH), or `sparkctl init --example` for the commented example to edit, "
        "or pass -i FILE",
        field="inventory",
    )
