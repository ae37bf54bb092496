"""The jinja2 templates of ``templates/`` (env file, compose file, launch script, sparkrun recipe).

Reading happens once, when a ``TemplateSet`` is made; rendering is pure. The ``yaml`` filter keeps
YAML output safe whatever the values: it writes a scalar that reads back as the same value.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import yaml

from sparkctl.resources import templates_dir

_PLAIN = re.compile(r"^(?:[A-Za-z_/]|-(?![0-9.]))[A-Za-z0-9_./:@+=-]*\Z")  # no ',': safe inside [flow, lists] too


def yaml_scalar(value: Any) -> str:
    """A YAML scalar that reads back as exactly ``value``.

    Numbers and booleans bare; a string plain when it is unambiguous (it starts with a letter,
    '/', '_' or a '-' not followed by a digit, and PyYAML reads it back as the same string: YAML 1.1 resolves more implicit
    types than 1.2, so compose's parser agrees), else single-quoted (JSON values stay readable),
    and JSON-style double-quoted only when it holds control characters.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.match(text) and _reads_back_plain(text):
        return text
    if text.isprintable():
        return "'" + text.replace("'", "''") + "'"  # YAML single quotes: no escapes but ''
    return json.dumps(text, ensure_ascii=False)


@functools.lru_cache(maxsize=4096)
def _reads_back_plain(text: str) -> bool:
    """Whether PyYAML reads ``text`` back as the same string. Remembered: a render asks it of every
    value of every host's files, mostly the same few hundred, and each ask runs PyYAML's pure-Python
    scanner (most of a render's time before)."""
    try:
        return yaml.safe_load(text) == text
    except yaml.YAMLError:
        return False


def compose_scalar(value: Any) -> str:
    """As ``yaml_scalar``, with '$' doubled: compose interpolates ``$VAR`` in every string value."""
    if isinstance(value, str):
        value = value.replace("$", "$$")
    return yaml_scalar(value)


class TemplateSet:
    def __init__(self, folder: Path):
        # here, not at the top: jinja2 is needed only where files are rendered, and status, logs
        # and stop import this module (through ops/render) for their plans without rendering
        import jinja2

        self.folder = folder
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(folder)),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            autoescape=False,
        )
        self._env.filters["yaml"] = yaml_scalar
        self._env.filters["compose"] = compose_scalar
        # Load (and compile) every template now, so a broken one fails before anything is written.
        self._templates = {path.name: self._env.get_template(path.name) for path in sorted(folder.glob("*.j2"))}

    @classmethod
    @functools.lru_cache(maxsize=None)
    def default(cls) -> "TemplateSet":
        """The shipped templates, read and compiled once per process (rendering is pure, so one
        set serves every render; a process that renders many times, the tests, pays once)."""
        return cls(templates_dir())

    def render(self, name: str, **context: Any) -> str:
        return self._templates[name].render(**context)
