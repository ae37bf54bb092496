"""YAML loading that remembers where every value came from, so errors can name a line."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from sparkctl.errors import ConfigError, config_error

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


# Limits on what one YAML file may hold, so that no file, however hostile, costs more than about a
# second and a few tens of MB to refuse. Each is far above what a real inventory or profile needs:
# - 256 KiB: the built-in recipes are 0.3-3 KB and an inventory line per host field makes ~6,000
#   hosts fit; PyYAML (pure Python, for the limits below) needs seconds for that (bench/yaml_limits.py).
# - 32 levels of nesting: the deepest real path is 4 (container.ulimits.nofile.soft); Python's
#   stack, not the file, would otherwise set the limit (a RecursionError, i.e. a traceback).
# - 100,000 values counting every alias as a copy of what it names: aliases are fine for sharing
#   host defaults, but nine nested levels of nine aliases ("billion laughs") would be 387 million.
_OPEN_STREAMS = ("/dev/fd/", "/proc/self/fd/", "/dev/stdin")
MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 32
MAX_YAML_VALUES = 100_000
MAX_INT_DIGITS = 100  # int() of a 10,000-digit scalar raises ValueError (CPython's own 4300-digit cap)


class _TooBig(Exception):
    """A limit was exceeded: message and the node where it was noticed."""

    def __init__(self, message: str, node=None):
        super().__init__(message)
        self.node = node


def _count_values(root) -> int:
    """How many values the document holds once aliases are expanded, without expanding them: each
    node is sized once (memoised), so this is linear in the file. Refuses a node that contains itself."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk (no recursion: depth is capped while composing, but be safe anyway).
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            children = _children(node, yaml)
            total = 1 + sum(sizes[id(c)] for c in children)
            sizes[key] = total
            if total > MAX_YAML_VALUES:
                raise _TooBig(f"holds more than {MAX_YAML_VALUES:,} values counting each alias as a copy "
                              "(nested aliases?)", node)
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise _TooBig("an alias refers to a value that contains it (recursive alias)", node)
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node, yaml):
            if id(child) in on_path:
                raise _TooBig("an alias refers to a value that contains it (recursive alias)", child)
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node, yaml) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _walk(root, lines: dict[Loc, int]) -> None:
    """Record the line of every mapping key and sequence item, visiting each node once: a value
    reached again through an alias keeps the location where it was first written."""
    seen: set[int] = set()
    stack = [(root, ())]
    while stack:
        node, loc = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a collection as a key: refused when constructed
                child = loc + (key_node.value,)
                lines.setdefault(child, key_node.start_mark.line + 1)
                stack.append((value_node, child))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = loc + (index,)
                lines.setdefault(child, item.start_mark.line + 1)
                stack.append((item, child))


class _BoundedLoader:
    """Built lazily: a SafeLoader that refuses duplicate and unhashable mapping keys (PyYAML keeps
    the last / raises TypeError), nesting deeper than MAX_YAML_DEPTH and absurdly long integers."""

    _cls = None

    @classmethod
    def get(cls):
        if cls._cls is None:
            class Loader(yaml.SafeLoader):
                _depth = 0

                def compose_node(self, parent, index):
                    self._depth += 1
                    try:
                        if self._depth > MAX_YAML_DEPTH:
                            raise yaml.composer.ComposerError(
                                None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", self.peek_event().start_mark)
                        return super().compose_node(parent, index)
                    finally:
                        self._depth -= 1

                def construct_mapping(self, node, deep=False):
                    seen = {}
                    for key_node, _ in node.value:
                        if key_node.tag == "tag:yaml.org,2002:merge":
                            continue  # `<<: *anchor`: merged below; the keys written here win over its keys
                        key = self.construct_object(key_node, deep=deep)
                        try:
                            duplicate = key in seen
                        except TypeError:
                            raise yaml.constructor.ConstructorError(
                                None, None, "a mapping key must be a plain value, not a list or mapping", key_node.start_mark
                            ) from None
                        if duplicate:
                            raise yaml.constructor.ConstructorError(
                                None, None, f"duplicate key {key!r}", key_node.start_mark
                            )
                        seen[key] = True
                    if isinstance(node, yaml.MappingNode):
                        self.flatten_mapping(node)  # YAML merge keys, as PyYAML's SafeLoader reads them
                    return super().construct_mapping(node, deep=deep)

                def construct_object(self, node, deep=False):
                    try:
                        return super().construct_object(node, deep=deep)
                    except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError):
                        # PyYAML's own constructors fail this way on e.g. `!!timestamp x`, `!!binary ~`
                        tag = str(node.tag).rsplit(":", 1)[-1]
                        raise yaml.constructor.ConstructorError(
                            None, None, f"cannot read this value as {tag}", node.start_mark) from None

                def construct_yaml_int(self, node):
                    if len(str(node.value)) > MAX_INT_DIGITS:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"a number longer than {MAX_INT_DIGITS} digits", node.start_mark)
                    return super().construct_yaml_int(node)

            Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
            cls._cls = Loader
        return cls._cls


# Documents already parsed in this process, by (file, text): the same text always gives the same
# document, so nothing here can go stale. The pure-Python loader (it must be, to bound nesting)
# takes ~60 ms for a recipe; a process that loads the same recipes many times (the tests, which
# call the CLI in process) reads each once. Each caller gets its own copy of the data.
_PARSED: dict[tuple[str, str], LocatedYaml] = {}
_PARSED_MAX = 64


def parse_yaml_text(text: str, file: str) -> LocatedYaml:
    """Parse one YAML document within the limits above; every failure is one ConfigError naming ``file``."""
    parsed = _PARSED.get((file, text))
    if parsed is None:
        parsed = _parse_yaml_text(text, file)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[(file, text)] = parsed
    return LocatedYaml(copy.deepcopy(parsed.data), dict(parsed.lines), parsed.file)


def _parse_yaml_text(text: str, file: str) -> LocatedYaml:
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{len(text.encode('utf-8', 'replace')):,} bytes is more than the {MAX_YAML_BYTES // 1024} KiB "
                          "an inventory or profile may be", file=file)
    loader = None
    try:
        loader = _BoundedLoader.get()(text)  # its reader already refuses control characters
        node = loader.get_single_node()
        if node is not None:
            _count_values(node)
        data = loader.construct_document(node) if node is not None else None
    except _TooBig as err:
        line = err.node.start_mark.line + 1 if err.node is not None else None
        raise ConfigError(str(err), file=file, line=line) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0].replace('"<unicode string>", ', "")
        context = getattr(err, "context", None)
        if context and problem.startswith("but "):  # "expected a single document ... but found another document"
            problem = f"{context} {problem}"
        raise ConfigError(f"invalid YAML: {problem}", file=file, line=mark.line + 1 if mark else None) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as err:  # a scalar PyYAML's own constructors choke on
        raise ConfigError(f"invalid YAML value: {str(err).splitlines()[0][:200]}", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[Loc, int] = {}
    if node is not None:
        lines[()] = node.start_mark.line + 1
        _walk(node, lines)
    return LocatedYaml(data, lines, file)


def load_yaml_file(path: str | Path) -> LocatedYaml:
    path = Path(path)
    try:
        # A named pipe with no writer, a terminal or a socket would block the open or the read for
        # ever: only regular files (and the pipes of `-i <(command)`, already open) are read.
        kind = os.stat(path).st_mode
        if not stat.S_ISREG(kind) and not stat.S_ISDIR(kind) and not str(path).startswith(_OPEN_STREAMS):
            raise ConfigError("not a regular file", file=str(path))
        with open(path, "rb") as handle:  # never more than the limit + 1 byte, whatever the file is
            raw = handle.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except ValueError:  # a NUL byte in the name
        raise ConfigError("not a valid path", file=repr(str(path))) from None
    except OSError as err:  # a directory, no permission, a symlink loop, a name too long...
        raise ConfigError(f"cannot read: {err.strerror or err.__class__.__name__}", file=str(path)) from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"more than the {MAX_YAML_BYTES // 1024} KiB an inventory or profile may be", file=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"not UTF-8 text (byte {err.start})", file=str(path)) from None
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
    """Every entry of a pydantic ValidationError as one line each (one ConfigError, or a ConfigErrors)."""
    return config_error(validation_errors(err, doc, loc_prefix=loc_prefix))


def validation_errors(err, doc: LocatedYaml, *, loc_prefix: Loc = ()) -> list[ConfigError]:
    """One ConfigError per field that failed, in the file's order (a union's alternatives that all
    failed for one field give one line: the first). Missing fields come last: they have no line of
    their own (they point at their mapping), and a typo in a key also makes the real key "missing"
    -- the line with the typo is the one that helps, so it is the first error."""
    found: dict[Loc, ConfigError] = {}
    missing: set[Loc] = set()
    for entry in err.errors():
        loc = loc_prefix + tuple(p for p in entry["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # a union names its branch in the loc (`list[...]`, `literal[...]`): the field is what the user wrote
        loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p and p.endswith("]"))))
        if loc in found:
            continue
        message = entry["msg"]
        if entry["type"] == "extra_forbidden":
            message = "unknown field"
        elif entry["type"] == "missing":
            message = "required field is missing"
            missing.add(loc)
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        found[loc] = ConfigError(message, file=doc.file, field=format_loc(loc), line=doc.line_of(loc))
    return [error for _, error in sorted(found.items(), key=lambda item: (item[0] in missing, item[1].line or 0))]
