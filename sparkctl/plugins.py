"""The one lookup the plugin registries share (engines, launchers): a name to its module's object."""

from __future__ import annotations

from importlib import import_module

from sparkctl.errors import ConfigError


def load(modules: dict[str, str], name: str, kind: str, attribute: str):
    """``attribute`` of the module registered for ``name``; ConfigError on field ``kind`` naming the known ones.
    Modules load on first use, so a registry can be asked from below the layers its plugins import."""
    module = modules.get(name)
    if module is None:
        raise ConfigError(f"sparkctl knows no {kind} {name!r} (known: {', '.join(modules)})", field=kind)
    return getattr(import_module(module), attribute)
