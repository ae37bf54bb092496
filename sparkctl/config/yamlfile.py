"""YAML loading that remembers where every value came from, so errors can name a line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkctl.errors import ConfigError

Loc = tuple  # a path into the document: ("hosts", 2, "address")


class LocatedYaml:
    """A parsed YAML document plus the 1-based line of every mapping key and sequence item."""

    def __init__(self, data: Any, lines: dict[Loc, int], file: str):
        self.data, self.lines, self.file = data, lines, file

    def line_of(self, loc: Loc) -> int | None:
        """The line of ``loc`` or, failing that, of its nearest ancestor."""
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), None)


def _walk(node, loc: Loc, lines: dict[Loc, int]) -> None:
    import yaml

    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = loc + (key_node.value,)
            lines[child] = key_node.start_mark.line + 1
            _walk(value_node, child, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = loc + (index,)
            lines[child] = item.start_mark.line + 1
            _walk(item, child, lines)


class _UniqueKeyLoader:
    """Built lazily: a SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last)."""

    _cls = None

    @classmethod
    def get(cls):
        if cls._cls is None:
            import yaml

            class Loader(yaml.SafeLoader):
                def construct_mapping(self, node, deep=False):
                    seen = {}
                    for key_node, _ in node.value:
                        key = self.construct_object(key_node, deep=deep)
                        if key in seen:
                            raise yaml.constructor.ConstructorError(
                                None, None, f"duplicate key {key!r}", key_node.start_mark
                            )
                        seen[key] = True
                    return super().construct_mapping(node, deep=deep)

            cls._cls = Loader
        return cls._cls


def parse_yaml_text(text: str, file: str) -> LocatedYaml:
    import yaml

    loader_cls = _UniqueKeyLoader.get()
    try:
        node = yaml.compose(text, Loader=loader_cls)
        data = yaml.load(text, Loader=loader_cls)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"invalid YAML: {problem}", file=file, line=mark.line + 1 if mark else None) from None
    lines: dict[Loc, int] = {}
    if node is not None:
        lines[()] = node.start_mark.line + 1
        _walk(node, (), lines)
    return LocatedYaml(data, lines, file)


def load_yaml_file(path: str | Path) -> LocatedYaml:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read: {err.__class__.__name__}", file=str(path)) from None
    return parse_yaml_text(text, str(path))


def format_loc(loc: Loc) -> str:
    """("hosts", 2, "address") -> "hosts[2].address"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(document)"


def validation_error(err, doc: LocatedYaml, *, loc_prefix: Loc = ()) -> ConfigError:
    """Turn the first pydantic ValidationError entry into a one-line ConfigError."""
    first = err.errors()[0]
    loc = loc_prefix + tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    elif first["type"] == "missing":
        message = "required field is missing"
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    line = doc.line_of(loc)
    return ConfigError(message, file=doc.file, field=format_loc(loc), line=line)
