"""The engines' command lines, rebuilt as real argparse parsers from the flags files.

``engine_flags/<engine>-<version>.json`` lists every option the released parser has, whether it
takes a value, and its fixed ``choices``. Building an ``argparse`` parser from exactly that list
gives the real parser's behaviour for free: an unknown option is ``unrecognized arguments`` and
exit 2, a value-taking option without a value is ``expected one argument``, a switch given
``=VALUE`` is ``ignored explicit argument``, a value outside ``choices`` is ``invalid choice``.

Abbreviated options are refused (``allow_abbrev=False``): sparkctl never renders one and a prefix
that happens to be unique hides typos. vLLM's own argv rewriting is reproduced (its
FlexibleArgumentParser): ``--max_model_len`` means ``--max-model-len``, ``--model M`` moves to the
positional model, and ``--json-opt.key value`` builds the JSON of ``--json-opt``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Dict, List, Optional

PROGS = {"vllm": "vllm serve", "sglang": "launch_server.py"}
USAGE = {
    "vllm": "vllm serve [model_tag] [options]",
    "sglang": "launch_server.py [-h] --model-path MODEL_PATH [options]",
}
# Short spellings whose long option the stand-in reads (the flags file lists names, not aliases).
ALIASES = {
    "vllm": {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size"},
    "sglang": {"--tensor-parallel-size": "--tp-size", "--model": "--model-path"},
}
_VERSION_PART = re.compile(r"(\d+)")


class FlagsError(Exception):
    """The flags data itself is missing or unreadable (not a user's argv error)."""


def flags_dirs() -> List[Path]:
    """Where the flags files may be: $SPARKCTL_STANDIN_FLAGS_DIR, next to this package (the image),
    then sparkctl's own engine_flags/ (a checkout)."""
    here = Path(__file__).resolve().parent
    found = []
    if os.environ.get("SPARKCTL_STANDIN_FLAGS_DIR"):
        found.append(Path(os.environ["SPARKCTL_STANDIN_FLAGS_DIR"]))
    found += [here / "engine_flags", here.parent / "engine_flags"]
    return found


def _version_key(version: str):
    return [int(p) if p.isdigit() else p for p in _VERSION_PART.split(version) if p]


def find_flags_file(engine: str, version: Optional[str] = None) -> Path:
    """The flags file of ``engine`` at ``version`` (default: $SPARKCTL_STANDIN_<ENGINE>_VERSION, else
    the newest version present)."""
    version = version or os.environ.get(f"SPARKCTL_STANDIN_{engine.upper()}_VERSION") or None
    for folder in flags_dirs():
        if not folder.is_dir():
            continue
        if version:
            path = folder / f"{engine}-{version}.json"
            if path.is_file():
                return path
            continue
        candidates = sorted(folder.glob(f"{engine}-*.json"), key=lambda p: _version_key(p.stem[len(engine) + 1:]))
        if candidates:
            return candidates[-1]
    wanted = f"{engine}-{version}.json" if version else f"{engine}-*.json"
    raise FlagsError(f"no flags file {wanted} in " + ", ".join(str(p) for p in flags_dirs()))


def load_flags(path: Path) -> Dict[str, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise FlagsError(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise FlagsError(f"{path}: expected a JSON object of options")
    return data


def version_of(path: Path, engine: str) -> str:
    return path.stem[len(engine) + 1:]


def dest_of(flag: str) -> str:
    return "opt_" + flag.lstrip("-").replace("-", "_")


class _Parser(argparse.ArgumentParser):
    """argparse with the real engines' error shape (usage line, ``prog: error: ...``, exit 2)."""


def build_parser(engine: str, flags: Dict[str, dict]) -> argparse.ArgumentParser:
    parser = _Parser(prog=PROGS[engine], usage=USAGE[engine], allow_abbrev=False, add_help=True)
    if engine == "vllm":
        parser.add_argument("model_tag", nargs="?", default=None)
    for flag, spec in flags.items():
        if flag in ("-h", "--help"):
            continue  # argparse's own
        choices = spec.get("choices") or None
        if spec.get("takes_value"):
            parser.add_argument(flag, dest=dest_of(flag), default=None, choices=[str(c) for c in choices] if choices else None)
        else:
            parser.add_argument(flag, dest=dest_of(flag), action="store_true", default=False)
    return parser


def _nest(keys: List[str], value):
    for key in reversed(keys):
        value = {key: value}
    return value


def _merge(into: dict, update: dict) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def normalize_vllm_argv(argv: List[str], flags: Dict[str, dict]) -> List[str]:
    """vLLM's rewriting before argparse sees the argv (see the module docstring)."""
    out: List[str] = []
    dotted: Dict[str, dict] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out.extend(argv[i:])
            break
        if arg.startswith("--") and len(arg) > 2:
            key, eq, value = arg.partition("=")
            base, dot, path = key.partition(".")
            base = "--" + base[2:].replace("_", "-")
            if dot and base in flags and flags[base].get("takes_value"):
                if not eq:
                    if i + 1 >= len(argv):
                        out.append(base + "." + path)  # argparse reports it
                        i += 1
                        continue
                    value = argv[i + 1]
                    i += 1
                _merge(dotted.setdefault(base, {}), _nest(path.split("."), _json_or_text(value)))
                i += 1
                continue
            out.append(base + ("." + path if dot else "") + (eq + value if eq else ""))
        else:
            out.append(arg)
        i += 1
    for base, value in dotted.items():
        out += [base, json.dumps(value, separators=(",", ":"))]
    # `--model M` (or --model=M) becomes the positional model, as vLLM does.
    for index, arg in enumerate(out):
        if arg == "--model" and index + 1 < len(out) and not out[index + 1].startswith("-"):
            return [out[index + 1]] + out[:index] + out[index + 2:]
        if arg.startswith("--model="):
            return [arg[len("--model="):]] + out[:index] + out[index + 1:]
    return out


def parse_engine_argv(engine: str, argv: List[str], flags: Dict[str, dict]) -> argparse.Namespace:
    """Parse like the engine's own parser: exits 2 with an argparse error on anything it would refuse."""
    parser = build_parser(engine, flags)
    if engine == "vllm":
        argv = normalize_vllm_argv(argv, flags)
    namespace = parser.parse_args(argv)
    namespace._parser = parser
    return namespace


def value(namespace: argparse.Namespace, engine: str, flag: str, default=None):
    """The value given for ``flag`` (or one of its aliases), else ``default``."""
    names = [flag] + [short for short, long in ALIASES.get(engine, {}).items() if long == flag]
    for name in names:
        got = getattr(namespace, dest_of(name), None)
        if got not in (None, False):
            return got
    return default


def int_value(namespace: argparse.Namespace, engine: str, flag: str, default: int) -> int:
    """An integer option, with argparse's error for a bad one (vLLM also takes 32k / 1M / 1K)."""
    raw = value(namespace, engine, flag)
    if raw is None:
        return default
    try:
        return human_int(raw) if engine == "vllm" else int(raw)
    except ValueError:
        namespace._parser.error(f"argument {flag}: invalid int value: {raw!r}")
    raise AssertionError("unreachable")


def human_int(text: str) -> int:
    """vLLM's human-readable integers: 32k = 32000, 32K = 32768, 1M = 1048576."""
    text = str(text).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    if not match:
        return int(text)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
    return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
