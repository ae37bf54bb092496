"""The engine's surface, read from the image being deployed, kept by image ID.

After ``build`` (and whenever ``serve`` meets an image it has no surface for) one throwaway
container of the image runs ``PROBE``: ``python3 -c PROBE ENGINE`` with the entrypoint cleared,
no network and no GPU. It asks the engine itself -- vLLM's ``make_arg_parser`` and ``vllm.envs``,
SGLang's ``ServerArgs.add_cli_args`` and ``sglang.srt.environ`` -- for its version, every option
(value or not, choices), the environment variables it reads, its tool/reasoning parser names, its
package layout and (when the app can be built without a GPU) its HTTP routes. An image with no
engine package but sparkctl's stand-in (the sandbox image) answers through the stand-in's own
``surface`` module, from exactly the files the stand-in obeys.

The document is stored as ``$XDG_CACHE_HOME/sparkctl/surfaces/<image id>-<engine>.json``.
``render`` checks against the surface of the profile's image tag when one is stored, ``serve``
against the image ID actually on the hosts; the shipped lists (``sparkctl/engine_flags``) stay the
fallback for an image not read here.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from pathlib import Path

from sparkctl import engines
from sparkctl.commands.engine_flags import EngineFlags, FlagSpec, check_argv, check_env
from sparkctl.commands.probes import surface_probe_argv
from sparkctl.errors import ConfigError
from sparkctl.fileio import atomic_write
from sparkctl.images import surface_index
from sparkctl.resources import cache_dir

# Runs inside the image with its own python3 (3.8+, standard library plus the engine). Prints one
# JSON document on stdout; a section it cannot read is null, never a guess.
_PROBE_FRAME = r'''
import argparse, glob, importlib, json, os, sys
engine = sys.argv[1]
root_arg = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None

def options(parser):
    out = {}
    for action in parser._actions:
        for name in action.option_strings:
            if name.startswith("--") and name != "--help":
                out[name] = {"takes_value": action.nargs != 0,
                             "choices": sorted(str(c) for c in action.choices) if action.choices else None}
    return out

def first(*paths):
    """The first of these dotted names that resolves (module, then attributes: a.b.Class.attr)."""
    for path in paths:
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                value = importlib.import_module(".".join(parts[:cut]))
            except Exception:
                continue
            try:
                for attr in parts[cut:]:
                    value = getattr(value, attr)
            except AttributeError:
                break
            return value
    return None

def layout(root):
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, root)
        for name in sorted(names):
            if len(files) < 20000:
                files.append(name if rel == "." else rel + "/" + name)
    return files

def real(engine):
    package = importlib.import_module(engine)
    root = root_arg or os.path.dirname(package.__file__)
    from importlib import metadata
    doc = {"engine": engine, "version": metadata.version(engine), "reader": engine,
           "flags": None, "envs": None, "parsers": {}, "routes": None, "package_root": root, "layout": layout(root)}
    globals()["read_" + engine](doc)  # the engine's reader (sparkctl/engines/<engine>.py)
    return doc

def switches():
    """Variables read by the overlay's code on the image's PYTHONPATH (an adapter's sitecustomize
    and the modules it installs): os.environ.get('X'), os.environ['X'], os.getenv('X')."""
    import re
    pattern = re.compile(r"""(?:environ\s*(?:\.get|\.setdefault|\.pop)?\s*[(\[]|getenv\s*\()\s*['"]([A-Z][A-Z0-9_]+)['"]""")
    names = set()
    for folder in os.environ.get("PYTHONPATH", "").split(":"):
        if not folder or not os.path.isdir(folder) or "-packages" in folder:
            continue
        for current, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    try:
                        with open(os.path.join(current, name), encoding="utf-8", errors="replace") as handle:
                            names.update(pattern.findall(handle.read(2000000)))
                    except OSError:
                        pass
    return sorted(names)

# ENGINE READERS
try:
    doc = real(engine)
except ImportError:
    try:
        from sparkctl_standin import surface as standin
    except ImportError:
        doc = {"engine": engine, "error": "no %s package and no stand-in in this image" % engine}
    else:
        doc = standin.surface(engine, root_arg)
if "error" not in doc and not doc.get("switches"):
    doc["switches"] = switches()
print(json.dumps(doc))
'''

# Each engine's reader (``read_<engine>(doc)``, its plugin's ``surface_reader``) goes in before the run.
PROBE = _PROBE_FRAME.replace("# ENGINE READERS\n", "".join(e.surface_reader + "\n" for e in engines.served_by_flags()))


# Which probe read a stored surface: one read by another sparkctl's probe is read again, not reused.
PROBE_DIGEST = hashlib.sha256(PROBE.encode()).hexdigest()[:16]
_RECORD_FIELDS = ("probe_digest", "image_id", "tags", "read_at")  # what store adds to the probe's document


class SurfaceError(Exception):
    """The image could not be read (no python3, the probe failed): the caller falls back or says so."""


def surfaces_dir() -> Path:
    return cache_dir() / "surfaces"


def _key(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:64]


def probe_argv(image: str, engine: str, package_root: str | None = None) -> list[str]:
    """``docker run`` of the probe (a host's docker CLI; the local engine uses docker-py)."""
    return surface_probe_argv(image, PROBE, engine, package_root or "")


def parse_probe_output(stdout: str, engine: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.strip().startswith("{")]
    if not lines:
        raise SurfaceError(f"the {engine} surface probe printed no JSON")
    try:
        doc = json.loads(lines[-1])
    except ValueError as err:
        raise SurfaceError(f"the {engine} surface probe printed unreadable JSON: {err}") from None
    if doc.get("error"):
        raise SurfaceError(doc["error"])
    if not isinstance(doc.get("flags"), dict):
        raise SurfaceError(f"the image's {engine} did not list its options")
    return doc


def store(image_id: str, tags: list[str], doc: dict, folder: Path | None = None) -> Path:
    folder = folder or surfaces_dir()
    record = {**doc, "probe_digest": PROBE_DIGEST, "image_id": image_id, "tags": sorted(set(tags)), "read_at": time.time()}
    path = folder / f"{_key(image_id)}-{doc['engine']}.json"
    atomic_write(path, json.dumps(record, indent=1, sort_keys=True), 0o644)
    return path


def load(image_id: str, engine: str, folder: Path | None = None) -> dict | None:
    path = (folder or surfaces_dir()) / f"{_key(image_id)}-{engine}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def latest_for_tag(tag: str, engine: str, folder: Path | None = None) -> dict | None:
    """The surface most recently read from an image that carried ``tag`` (of equal times, the first
    listed). Every render asks, and the folder keeps one surface per image ever built (~60-90 KB
    each, hundreds after a while): which files carry the tag comes from the folder's index
    (``surface_index``), so only the one returned is read."""
    folder = folder or surfaces_dir()
    candidates: list[tuple[float, int, Path]] = []  # (read_at, minus the listing order: the first of equals wins)
    for order, (path, tags, read_at) in enumerate(surface_index.entries(folder, engine)):
        if tag in tags:
            candidates.append((read_at, -order, path))
    for _, _, path in sorted(candidates, reverse=True):  # the latest first; one gone since is passed over
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return None


def as_engine_flags(doc: dict) -> EngineFlags:
    """The surface as the object render's checks take (the shipped lists' shape)."""
    flags = {name: FlagSpec(bool(spec.get("takes_value")), tuple(str(c) for c in spec["choices"]) if spec.get("choices") else None)
             for name, spec in doc["flags"].items()}
    parsers = {kind: tuple(names) for kind, names in (doc.get("parsers") or {}).items() if names}
    envs = frozenset(doc["envs"]) if doc.get("envs") is not None else None
    layout = tuple(doc["layout"]) if doc.get("layout") is not None else None
    image = doc.get("image_id", "?")
    short = image.split(":", 1)[-1][:12]
    tag = (doc.get("tags") or [""])[0]
    switches = frozenset(doc.get("switches") or ())
    return EngineFlags(doc["engine"], doc["version"], flags, parsers, f"image {tag or short} ({short})", envs, layout,
                       switches=switches, switches_source=f"the adapter folders on the PYTHONPATH of image {tag or short}")


def check_version(doc: dict, engine: str, version: str) -> None:
    """The image's engine must be the one the profile names (else its lists do not apply)."""
    if doc.get("engine") != engine or doc.get("version") != version:
        raise ConfigError(
            f"the image {', '.join(doc.get('tags') or [doc.get('image_id', '?')])} has {doc.get('engine')} "
            f"{doc.get('version')}; the profile says {engine} {version}",
            field="engine_version",
        )


def reuse(image_id: str, tags: list[str], engine: str, folder: Path | None = None) -> dict | None:
    """The surface this probe already read from ``image_id``, stored again with ``tags`` as a new read
    would be (None: read it). An image ID is a digest of the image: its engine cannot have changed,
    and an unchanged rebuild need not start two containers to read it again."""
    record = load(image_id, engine, folder)
    if not isinstance(record, dict) or record.get("probe_digest") != PROBE_DIGEST or record.get("engine") != engine:
        return None
    doc = {key: value for key, value in record.items() if key not in _RECORD_FIELDS}
    store(image_id, tags, doc, folder)
    return {**doc, "image_id": image_id, "tags": sorted(set(tags))}


def capture(engine_client, image: str, image_id: str, tags: list[str], engine: str,
            package_root: str | None = None, folder: Path | None = None) -> dict:
    """Run the probe in ``image`` through a build engine (``sparkctl.images.engine``) and store it."""
    stdout = engine_client.run_python(image, PROBE, [engine, package_root or ""])
    if stdout is None:
        raise SurfaceError(f"cannot run python3 in {image}")
    doc = parse_probe_output(stdout, engine)
    store(image_id, tags, doc, folder)
    return {**doc, "image_id": image_id, "tags": sorted(set(tags))}


def options_of(engine_argv: list[str]) -> list[str] | None:
    """The engine's option list inside a rendered container command (None: no engine runs here,
    e.g. a Ray worker's ``ray start``)."""
    argv = list(engine_argv)
    if argv[:2] == ["bash", "-c"] and len(argv) == 3:
        text = argv[2]
        argv = shlex.split(text.split(" && exec ", 1)[1]) if " && exec " in text else shlex.split(text)
    for engine in engines.served_by_flags():
        options = engine.options_of(argv)
        if options is not None:
            return options
    return None


def check_deployment(spec: EngineFlags, hosts: list) -> list[str]:
    """Every host's final engine argv and env against ``spec``: ConfigError naming the first option
    or variable the engine in the image does not know; warnings for variables with an equivalent."""
    warnings: list[str] = []
    for host in hosts:
        options = options_of(host.engine_argv)
        if options is not None:
            check_argv(spec, options)
        for warning in check_env(spec, host.env):
            if warning not in warnings:
                warnings.append(warning)
    return warnings


def surface_of_host_image(image_id: str, tag: str, engine: str, run_probe) -> dict:
    """The stored surface of ``image_id``, or read it now with ``run_probe(argv) -> (ok, stdout)`` on
    a host that has the image (one throwaway container) and store it."""
    doc = load(image_id, engine)
    if doc is not None:
        return doc
    ok, stdout = run_probe(probe_argv(image_id, engine))
    if not ok:
        raise SurfaceError(f"cannot run python3 in {tag} ({image_id[:19]})")
    doc = parse_probe_output(stdout, engine)
    store(image_id, [tag], doc)
    return {**doc, "image_id": image_id, "tags": [tag]}


def verify_deployment(engine: str, version: str, tag: str, hosts: list, image_ids: dict[str, str],
                      run_probe_on) -> tuple[str | None, list[str]]:
    """Check every host's rendered command and environment against the surface of the image ID on
    that host. Returns (refusal, warnings); ``run_probe_on(host_name, argv) -> (ok, stdout)``."""
    warnings: list[str] = []
    by_id: dict[str, list] = {}
    for host in hosts:
        by_id.setdefault(image_ids[host.name], []).append(host)
    for image_id, holders in by_id.items():
        try:
            doc = surface_of_host_image(image_id, tag, engine, lambda argv: run_probe_on(holders[0].name, argv))
            check_version(doc, engine, version)
            for warning in check_deployment(as_engine_flags(doc), holders):
                if warning not in warnings:
                    warnings.append(warning)
        except SurfaceError as err:
            warnings.append(f"{err}: checked against the shipped lists only")
        except ConfigError as err:
            names = ", ".join(h.name for h in holders)
            return f"the image on {names} does not accept this deployment: {err.detail}", warnings
    return None, warnings
