"""What an engine version accepts on its command line, and the check every rendered argv passes.

The data is ``sparkctl/engine_flags/<engine>-<version>.json`` (each option: ``takes_value`` and
``choices``), ``<engine>-<version>-envs.txt`` (every environment variable the engine reads) plus
``parsers.json`` (tool-call and reasoning parser names): the shipped lists, used when no surface
was read from the image itself (``sparkctl.images.surface`` builds the same object from it). Loading reads files;
everything else here is pure. A profile's ``engine_args`` are turned into argv tokens here, so the
rules (dict/list -> compact JSON, ``true`` -> bare flag, ``false``/``null`` -> omitted) live in one
place for both engines.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from sparkctl import engines
from sparkctl.errors import ConfigError
from sparkctl.resources import engine_flags_dir
from sparkctl.secrets import is_secret_name

# Options whose value must be a parser the engine registers (parsers.json key per option).
PARSER_OPTIONS = {"--tool-call-parser": "tool_call_parsers", "--reasoning-parser": "reasoning_parsers"}


@dataclass(frozen=True)
class FlagSpec:
    takes_value: bool
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class EngineFlags:
    """The command-line surface of one engine version."""

    engine: str
    version: str
    flags: Mapping[str, FlagSpec]
    parsers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = ""  # the flags file (or the image), for messages
    envs: frozenset[str] | None = None  # the variables the engine reads; None: not known
    layout: tuple[str, ...] | None = None  # files of the engine's package (relative), when read from an image
    # The image overlay's own variables (its adapters' switches) and the prefixes it owns; the
    # source of that list for messages (the image's adapter folders, or the chain's switch list).
    switches: frozenset[str] = frozenset()
    switch_prefixes: tuple[str, ...] = ()
    switches_source: str = ""

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}"


def load_engine_flags(engine: str, version: str, folder: Path | None = None) -> EngineFlags:
    """Read ``<engine>-<version>.json`` and that version's parser names. ConfigError when absent."""
    folder = folder or engine_flags_dir()
    path = folder / f"{engine}-{version}.json"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob(f"{engine}-*.json"))
        raise ConfigError(
            f"no flags file for {engine} {version} ({path.name}); known: {', '.join(known) or 'none'}. "
            "Add the version's flags file rather than rendering unchecked options",
            field="engine_version",
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read engine flags: {err}", file=str(path)) from None
    flags = {
        name: FlagSpec(bool(spec.get("takes_value")), tuple(str(c) for c in spec["choices"]) if spec.get("choices") else None)
        for name, spec in raw.items()
    }
    parsers: dict[str, tuple[str, ...]] = {}
    parsers_path = folder / "parsers.json"
    if parsers_path.is_file():
        try:
            entry = json.loads(parsers_path.read_text(encoding="utf-8")).get(f"{engine}-{version}", {})
        except (OSError, ValueError) as err:
            raise ConfigError(f"cannot read parser names: {err}", file=str(parsers_path)) from None
        parsers = {kind: tuple(names) for kind, names in entry.items()}
    envs_path = folder / f"{engine}-{version}-envs.txt"
    envs = None
    if envs_path.is_file():
        envs = frozenset(line.strip() for line in envs_path.read_text(encoding="utf-8").splitlines() if line.strip())
    return EngineFlags(engine, version, flags, parsers, str(path), envs)


def format_value(value: Any) -> str:
    """One argv value: dicts and lists as compact JSON (key order kept), everything else str()."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, bool):  # engine_args' true/false are switches; elsewhere spell it as JSON does
        return "true" if value else "false"
    return str(value)


def _suggest(word: str, candidates) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=3, cutoff=0.75)
    return f"; did you mean {', '.join(close)}?" if close else ""


def unknown_option(spec: EngineFlags, flag: str, field_name: str) -> ConfigError:
    return ConfigError(
        f"{spec.label} has no option {flag} (see {_source_name(spec)}){_suggest(flag, spec.flags)}", field=field_name
    )


def _source_name(spec: EngineFlags) -> str:
    return spec.source if spec.source.startswith("image ") else Path(spec.source).name


def env_prefixes() -> dict[str, tuple[str, ...]]:
    """Engine -> the namespace of variables it reads (its plugin's ``env_prefixes``): a name there
    that the engine does not read is a setting that silently does nothing."""
    return {engine.name: engine.env_prefixes for engine in engines.served_by_flags()}


NCCL_PREFIX = "NCCL_"


def nccl_variables(folder: Path | None = None) -> frozenset[str]:
    """NCCL's own variables (its user guide's Environment Variables page): whatever engine runs,
    NCCL reads these and ignores any other NCCL_ name without a word."""
    path = (folder or engine_flags_dir()) / "nccl-envs.txt"
    info = path.stat()
    return _nccl_names(str(path), (info.st_ino, info.st_size, info.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _nccl_names(path: str, identity: tuple) -> frozenset[str]:
    """The file's names, read once while it is unchanged (``identity``): a render checks every
    NCCL_ variable of every host against them."""
    return frozenset(line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()
                     if line.strip() and not line.startswith("#"))

# Variables other builds of an engine read, and what the engine at hand honours instead.
ENV_EQUIVALENTS = {
    "VLLM_FLASHINFER_AUTOTUNE": "the profile field autotune (rendered as the engine's FlashInfer autotune switch)",
}


def check_env(spec: EngineFlags, env: Mapping[str, str], profile_env: Iterable[str] = ()) -> list[str]:
    """Every variable of the engine's namespace in ``env`` must be one the engine reads.

    Returns warnings for a variable with a known equivalent; raises ConfigError naming any other
    unknown one. Nothing is checked when the engine's variables are not known."""
    from_profile = set(profile_env)
    for name in sorted(env):
        _check_foreign(spec, name, f"env.{name}" if name in from_profile else "engine_version")
    if spec.envs is None:
        return []
    prefixes = env_prefixes().get(spec.engine, ())
    warnings = []
    for name in sorted(env):
        if not name.startswith(prefixes) or name in spec.envs or name in spec.switches:
            continue
        field_name = f"env.{name}" if name in from_profile else "engine_version"
        equivalent = ENV_EQUIVALENTS.get(name)
        if equivalent:
            warnings.append(f"{field_name}: {spec.label} does not read {name} (it would warn \"Unknown vLLM environment "
                            f"variable\" and ignore it); use {equivalent}")
            continue
        source = _source_name(spec) if spec.source.startswith("image ") else f"{spec.engine}-{spec.version}-envs.txt"
        raise ConfigError(f"{spec.label} does not read the environment variable {name} (see {source})"
                          f"{_suggest(name, spec.envs)}", field=field_name)
    return warnings


def _check_foreign(spec: EngineFlags, name: str, field_name: str) -> None:
    """Names outside the engine's own namespace that would silently do nothing: another engine's
    prefix, an NCCL name NCCL does not read, an overlay prefix's name the overlay does not read."""
    if name in spec.switches:
        return
    for engine, prefixes in env_prefixes().items():
        if engine != spec.engine and name.startswith(prefixes):
            raise ConfigError(f"{name} is a {engine} variable; {spec.label} does not read it (this profile runs {spec.engine})",
                              field=field_name)
    if name.startswith(NCCL_PREFIX):
        known = nccl_variables()
        if name not in known:
            raise ConfigError(f"NCCL does not read {name} (see sparkctl/engine_flags/nccl-envs.txt, NCCL's documented "
                              f"variables){_suggest(name, known)}", field=field_name)
    if spec.switch_prefixes and name.startswith(spec.switch_prefixes):
        raise ConfigError(f"the image's overlay does not read {name} (see {spec.switches_source})"
                          f"{_suggest(name, spec.switches)}", field=field_name)


def check_flag(spec: EngineFlags, flag: str, value: str | None, field_name: str) -> None:
    """One option against the engine's surface: it exists, takes a value iff it should, respects choices."""
    known = spec.flags.get(flag)
    if known is None:
        raise unknown_option(spec, flag, field_name)
    if known.takes_value and value is None:
        raise ConfigError(f"{flag} takes a value in {spec.label}; got a bare flag (true)", field=field_name)
    if not known.takes_value and value is not None:
        raise ConfigError(f"{flag} is a switch in {spec.label} and takes no value; use true (or false to leave it out)", field=field_name)
    if value is not None and known.choices is not None and value not in known.choices:
        hint = _suggest(value, known.choices) or f" (choose from: {', '.join(known.choices)})"
        raise ConfigError(f"{value!r} is not a valid {flag}{hint}", field=field_name)
    parser_kind = PARSER_OPTIONS.get(flag)
    if parser_kind and value is not None and spec.parsers:
        names = spec.parsers.get(parser_kind, ())
        if value not in names:
            hint = _suggest(value, names) or f" (registered: {', '.join(names)})"
            raise ConfigError(f"{spec.label} has no {flag} named {value!r}{hint}", field=field_name)


def engine_arg_tokens(
    engine_args: Mapping[str, Any],
    spec: EngineFlags,
    *,
    owned: Mapping[str, str],
    skip: Iterable[str] = (),
) -> list[str]:
    """The profile's ``engine_args`` as argv tokens, in order, each checked against ``spec``.

    ``owned`` maps an option sparkctl renders itself to the reason (shown when a profile sets it).
    ``skip`` names keys the caller has already accounted for (rendered elsewhere, not duplicated).
    """
    tokens: list[str] = []
    skipped = set(skip)
    for key, value in engine_args.items():
        field_name = f"engine_args.{key}"
        flag = f"--{key}"
        if key in skipped:
            continue
        if flag in owned:
            raise ConfigError(f"{flag} is set by sparkctl ({owned[flag]}); remove it from engine_args", field=field_name)
        if is_secret_name(flag):
            raise ConfigError(secret_argument_message(flag), field=field_name)
        if value is False or value is None:
            # Left out of the argv, but a misspelt option is still a mistake worth reporting.
            if flag not in spec.flags:
                raise unknown_option(spec, flag, field_name)
            negative = negative_switch(spec, flag) if value is False else None
            if negative is not None:  # leaving it out would let the engine's default (on) apply
                tokens.append(negative)
            continue
        if value is True:
            check_flag(spec, flag, None, field_name)
            tokens.append(flag)
            continue
        text = format_value(value)
        check_flag(spec, flag, text, field_name)
        tokens += [flag, text]
    return tokens


def negative_switch(spec: EngineFlags, flag: str) -> str | None:
    """The option that turns ``flag`` off when the engine has one: ``--no-X`` (argparse's
    BooleanOptionalAction), or the other half of an ``--enable-X`` / ``--disable-X`` pair."""
    known = spec.flags.get(flag)
    if known is None or known.takes_value:
        return None
    name = flag[2:]
    candidates = [f"--no-{name}"]
    for on, off in (("enable-", "disable-"), ("disable-", "enable-")):
        if name.startswith(on):
            candidates.append(f"--{off}{name[len(on):]}")
    for candidate in candidates:
        other = spec.flags.get(candidate)
        if other is not None and not other.takes_value:
            return candidate
    return None


def check_argv(spec: EngineFlags, argv: list[str], field_name: str = "engine_version") -> None:
    """Walk a finished option list (no program words) and check every option in it.

    This is the last line of defence: whatever built the argv, only options the engine's parser
    would accept leave sparkctl. engine_args were checked one by one already, so what fails here
    is an option sparkctl itself renders that this engine version lacks: the error names
    ``engine_version``.
    """
    index = 0
    while index < len(argv):
        flag = argv[index]
        known = spec.flags.get(flag)
        if not flag.startswith("-") or known is None:
            raise unknown_option(spec, flag, field_name)
        if known.takes_value:
            if index + 1 >= len(argv):
                raise ConfigError(f"{flag} is missing its value", field=field_name)
            check_flag(spec, flag, argv[index + 1], field_name)
            index += 2
        else:
            check_flag(spec, flag, None, field_name)
            index += 1


# Where a secret engine option's value can live instead of the argv (which every host keeps in
# launch.sh, compose.yaml and the deployment record, and `ps` shows): the engine reads these variables.
SECRET_OPTION_VARIABLES = {"--hf-token": "HF_TOKEN"}


def secret_argument_message(flag: str) -> str:
    variable = SECRET_OPTION_VARIABLES.get(flag)
    instead = (f"pass it as --env {variable}=... (the engine reads ${variable}; the value then lives only in "
               "engine.env, mode 0600)" if variable else
               "sparkctl does not put secrets on a command line; set it through an environment variable the "
               "engine reads (--env NAME=..., kept in engine.env, mode 0600)")
    return f"{flag} takes a secret, and an engine argument shows in `ps`, launch.sh, compose.yaml and the deployment record; {instead}"
