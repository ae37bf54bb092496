""""Did you mean": the nearest known names to a mistyped one (a profile, a profile field)."""

from __future__ import annotations

import difflib
import typing
from typing import Iterable

from pydantic import BaseModel


def nearest(word: str, known: Iterable[str], limit: int = 3) -> list[str]:
    """Names that start with ``word`` first (``tp8`` -> tp8-1m, tp8-300k), then the closest spellings."""
    known = [k for k in known if not k.startswith("_")]
    starting = sorted(k for k in known if k.startswith(word) and k != word)
    close = [k for k in difflib.get_close_matches(word, known, n=limit, cutoff=0.6) if k not in starting]
    return (starting + close)[:limit]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean X or Y?)``, or "" when nothing is close."""
    options = nearest(word, known)
    if not options:
        return ""
    return " (did you mean " + " or ".join(options) + "?)"


def model_fields_at(model, path: list[str]) -> list[str]:
    """The field names of the pydantic model reached by ``path`` from ``model`` ([] when the path
    leaves the models: a dict of free keys, a list, a scalar)."""
    current = model
    for part in path:
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *typing.get_args(annotation)]
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is None:
            return []
        current = nested
    return list(getattr(current, "model_fields", {}))
