"""The engines sparkctl serves, as plugins: one module per engine, one line per engine here.

An engine module (``vllm.py``, ``sglang.py``, ``singlebox.py``) holds everything that differs
between engines -- which argv builder of ``commands/`` runs it, its environment, its metric names,
its answers' shapes, its sparkrun runtime, its memory plan, its Engram shard layout -- as one
``Engine`` object (``base.py``). Callers ask ``get(profile.engine)`` instead of comparing names.

Modules are imported when first asked for: an engine module uses ``commands/``, and
``commands/`` asks this registry, so importing it must not import them.
"""

from __future__ import annotations

from sparkctl import plugins
from sparkctl.engines.base import Engine

# engine name (the profile's ``engine``) -> the module holding its ``ENGINE``
_MODULES = {
    "vllm": "sparkctl.engines.vllm",
    "sglang": "sparkctl.engines.sglang",
    "single-box": "sparkctl.engines.singlebox",
}

__all__ = ["Engine", "get", "names", "served_by_flags"]


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def get(name: str) -> Engine:
    """The plugin of engine ``name``; ConfigError naming the field for an engine sparkctl does not know."""
    return plugins.load(_MODULES, name, "engine", "ENGINE")


def served_by_flags() -> tuple[Engine, ...]:
    """The engines whose options and variables sparkctl checks against a flag surface (vLLM, SGLang)."""
    return tuple(engine for engine in map(get, _MODULES) if engine.has_flag_surface)
