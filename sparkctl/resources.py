"""Where the data directories (templates/, recipes/, images/) are.

In a wheel they are copied into ``sparkctl/_data/``; in a checkout (or an editable install) they
sit at the top of the repository, next to the package.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    for candidate in (PACKAGE_DIR / "_data" / name, PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"sparkctl data directory {name!r} is missing from this installation")


def recipes_dir() -> Path:
    return data_dir("recipes")


def templates_dir() -> Path:
    return data_dir("templates")


def cache_dir() -> Path:
    """This user's sparkctl cache (``$XDG_CACHE_HOME/sparkctl``, else ``~/.cache/sparkctl``): the stand-in
    rootfs, the router's wheels, images' pyc sets, engine surfaces. Not created here."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkctl"


def images_dir() -> Path:
    return data_dir("images")


def engine_flags_dir() -> Path:
    return PACKAGE_DIR / "engine_flags"


def example_inventory() -> Path:
    """inventory.example.yaml: every field, commented (in the wheel under _data/, else the checkout's)."""
    for candidate in (PACKAGE_DIR / "_data" / "inventory.example.yaml", PACKAGE_DIR.parent / "inventory.example.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("inventory.example.yaml is missing from this installation")
