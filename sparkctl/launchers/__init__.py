"""The launchers, as plugins: how a profile's engine runs on its hosts (``launcher:`` in the profile).

``docker`` runs every engine in containers (one per host, or replicas behind a router); ``native``
runs the single-box engine as a process on its one host. Each is one ``Launcher`` (``base.py``) in
its own module; callers ask ``of(profile)`` instead of comparing the profile's ``launcher``.

Modules are imported when first asked for: a launcher uses ``ops/``, and ``ops/up`` asks this
registry, so importing it must not import them.
"""

from __future__ import annotations

from sparkctl import plugins
from sparkctl.launchers.base import Launcher, UpServe

# launcher name (the profile's ``launcher``) -> the module holding its ``LAUNCHER``
_MODULES = {
    "docker": "sparkctl.launchers.docker",
    "native": "sparkctl.launchers.native",
}

__all__ = ["Launcher", "UpServe", "get", "names", "of"]


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def get(name: str) -> Launcher:
    """The plugin of launcher ``name``; ConfigError naming the field for a launcher sparkctl does not know."""
    return plugins.load(_MODULES, name, "launcher", "LAUNCHER")


def of(profile) -> Launcher:
    """The launcher ``profile`` runs its engine with."""
    return get(profile.launcher)
