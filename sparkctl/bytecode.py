"""Byte code shipped beside the Python sources that start many times (images, zipped agents).

Without it every start compiles everything it imports: a stand-in engine start in a fresh
container spent about three quarters of its CPU compiling the standard library and the stand-in
package, and a zipped agent compiles its modules on every run (zipimport never writes a cache).

Two makers, both hash-based pycs (PEP 552) rather than timestamp ones, because timestamps mislead
here: the image tar gives every file one fixed time (so the same inputs give the same bytes), an
image layer put on top (a patched ``.py``) may carry any time and size, and a zip's member times
are local DOS times that the host reads in its own time zone.

* ``image_pycs``: for an image, made by the interpreter that the image runs (a subprocess, since it
  may not be this one). Only the modules the image's programs import (found by importing them
  there), *checked* hash: the interpreter hashes the source beside it on import (a few ms), so a
  layer that replaces a ``.py`` is still what runs. A standard-library pyc is that interpreter's own
  ``__pycache__`` file only when it is hash-based and of this very source; a timestamp one (Debian's)
  matches on time and size alone, so it is compiled again, once per set (sets are kept by a key of
  their inputs). The same inputs give the same bytes (a fixed hash seed, a fixed order): image plans
  hash the tar.
* ``zip_pyc``: for a zipped agent, made by this interpreter, *unchecked* hash: the zip is written
  as one piece, so its ``X.pyc`` can only belong to the ``X.py`` beside it. A host whose python3
  has another magic number (Ubuntu's 3.12 on a DGX Spark) finds the pyc's magic wrong and
  zipimport falls back to compiling the ``.py``, so the sources always ship too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import shutil
import subprocess
import tempfile
import time
from typing import Iterable, Sequence

FLAG_HASH, FLAG_CHECK_SOURCE = 0b01, 0b10  # PEP 552 flags word


def pyc_header(source: bytes, *, checked: bool) -> bytes:
    """A hash-based pyc header for ``source``, for this interpreter."""
    flags = FLAG_HASH | (FLAG_CHECK_SOURCE if checked else 0)
    return importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little") + importlib.util.source_hash(source)


def zip_pyc(source: bytes, filename: str) -> bytes:
    """``source`` compiled by this interpreter as an unchecked-hash pyc (``filename``: its tracebacks' name)."""
    # optimize=0, not this process's -O/PYTHONOPTIMIZE: the agents keep their asserts wherever they run.
    code = compile(source, filename, "exec", dont_inherit=True, optimize=0)
    return pyc_header(source, checked=False) + marshal.dumps(code)


# Runs in the image's interpreter (stdlib only, Python 3.9+). stdin: JSON {places, imports, shipped,
# checked}; argv[1]: a folder for the pycs (also its working folder: it holds nothing importable).
# Writes {pycs: [[pyc path in the image, file name in the folder]], failed} to .answer.json there (ANSWER), not to
# stdout, which a module may print to as it is imported.
_FINDER = r'''
import importlib, importlib.machinery, importlib.util, json, marshal, os, sys
spec = json.load(sys.stdin)
places = [(here.rstrip("/") + "/", there.rstrip("/") + "/") for here, there in spec["places"]]
shipped = set(spec["shipped"])
magic = importlib.util.MAGIC_NUMBER
flags = (3 if spec["checked"] else 1).to_bytes(4, "little")

def pyc(source, filename, code=None):
    code = code if code is not None else marshal.dumps(compile(source, filename, "exec", dont_inherit=True))
    return magic + flags + importlib.util.source_hash(source) + code

# A module of the placed folders is compiled once, as it is imported, under its image path, and
# marshalled at once (what a marshal writes depends on what else holds its objects): never read
# from a cache file that happens to lie there, so the same inputs give the same bytes.
placed = {}

class Compiling(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        path = self.get_filename(fullname)
        image = in_image(path)
        with open(path, "rb") as handle:
            source = handle.read()
        code = compile(source, image, "exec", dont_inherit=True)
        placed[path] = (image, pyc(source, image, marshal.dumps(code)))
        return code

def in_image(path):
    for here, there in places:
        if path.startswith(here):
            return there + path[len(here):]
    return path

def placed_finder(entry):
    if not any((entry.rstrip("/") + "/").startswith(here) for here, _ in places):
        raise ImportError("not a placed folder")
    return importlib.machinery.FileFinder(
        entry, (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (Compiling, importlib.machinery.SOURCE_SUFFIXES))

sys.path_hooks.insert(0, placed_finder)
sys.path_importer_cache.clear()
sys.path[:0] = [here.rstrip("/") for here, _ in places]
failed = []
for name in spec["imports"]:
    try:
        importlib.import_module(name)
    except Exception as err:  # that module compiles at run time, as without this
        failed.append("%s: %s" % (name, err))

def own_cache(path, source):
    # The code in this interpreter's own cache file for path, when it is of this very source: only a
    # hash-based one says so. A timestamp one (Debian's stdlib) matches on time and size alone, and
    # its code re-headed with this source's hash would pass every later check while stale, so it is
    # compiled instead: a set is made only when its inputs change (image_pycs keeps them), and the
    # same source then gives the same bytes whether or not a cache file lay there.
    try:
        with open(importlib.util.cache_from_source(path), "rb") as handle:
            data = handle.read()
    except (OSError, ValueError, NotImplementedError):
        return None
    if data[:4] != magic or len(data) < 16:
        return None
    kind = int.from_bytes(data[4:8], "little")
    if kind & 1 and data[8:16] == importlib.util.source_hash(source):
        return data[16:]
    return None

loaded = sorted({m.__file__ for m in list(sys.modules.values())
                 if isinstance(getattr(m, "__loader__", None), importlib.machinery.SourceFileLoader)
                 and isinstance(getattr(m, "__file__", None), str) and m.__file__.endswith(".py")})
made = []
for path in loaded:
    if path in placed:
        image, data = placed[path]
        if image not in shipped:
            continue
    elif path in shipped:
        with open(path, "rb") as handle:
            source = handle.read()
        image, data = path, pyc(source, path, own_cache(path, source))
    else:
        continue
    name = "%d.pyc" % len(made)
    with open(os.path.join(sys.argv[1], name), "wb") as handle:
        handle.write(data)
    made.append([importlib.util.cache_from_source(image), name])
with open(os.path.join(sys.argv[1], ".answer.json"), "w") as handle:
    json.dump({"pycs": made, "failed": failed}, handle)
'''


class BytecodeError(RuntimeError):
    pass


def image_pycs(python: str, out_dir: str, *, places: Sequence[tuple[str, str]], imports: Iterable[str],
               shipped: Iterable[str], checked: bool = True, cache: str | None = None) -> list[tuple[str, str]]:
    """Pycs for an image whose interpreter is ``python``: ``[(pyc path in the image, file here)]``.

    ``places``: (folder here, folder in the image) pairs, put first on the import path: a package
    written here under the name it has in the image. ``imports``: what the image's programs
    import (their modules' imports follow). ``shipped``: the image paths of the ``.py`` files the
    image holds; a module outside them gets no pyc (it is not in the image). ``cache``: a folder
    keeping each set made under a key of everything it is made from (``inputs_key``), so an image
    made again from the same inputs spends no interpreter on it (copied into ``out_dir``)."""
    spec = {"places": [list(p) for p in places], "imports": list(imports), "shipped": sorted(shipped),
            "checked": checked}
    if cache is None:
        return _run_finder(python, out_dir, spec)
    key = inputs_key(python, spec)
    kept = _kept(os.path.join(cache, key), out_dir)
    if kept is not None:
        return kept
    try:
        os.makedirs(cache, exist_ok=True)
        partial = tempfile.mkdtemp(prefix=".partial-", dir=cache)
    except OSError:  # a cache we cannot write: made for this image only
        return _run_finder(python, out_dir, spec)
    try:
        made = _run_finder(python, partial, spec)
        with open(os.path.join(partial, INDEX), "w") as handle:
            json.dump([[pyc, os.path.basename(path)] for pyc, path in made], handle)
        os.rename(partial, os.path.join(cache, key))
    except OSError:  # another command kept the same set first: theirs is as good
        pass
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    _prune(cache)
    kept = _kept(os.path.join(cache, key), out_dir)
    return kept if kept is not None else _run_finder(python, out_dir, spec)


INDEX = "index.json"
ANSWER = ".answer.json"  # the finder's answer, beside the pycs it made
CACHE_KEEP = 8  # sets kept (one per state of the sources and interpreter); older ones go once unused for
CACHE_IDLE_S = 3600  # an hour (several checkouts on one machine each keep their own)


def inputs_key(python: str, spec: dict) -> str:
    """What a pyc set is made from: the finder, the interpreter (path, size, time), the spec (folders
    here left out: temporary), the placed files' names and sources, the shipped sources' sizes and times."""
    digest = hashlib.sha256(_FINDER.encode())
    digest.update(json.dumps({**spec, "places": [there for _, there in spec["places"]]}, sort_keys=True).encode())
    real = os.path.realpath(python)
    st = os.stat(real)
    digest.update(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for here, _ in spec["places"]:
        for folder, dirs, names in os.walk(here):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, here).encode() + b"\0")
                if name.endswith(".py"):
                    with open(path, "rb") as handle:
                        digest.update(hashlib.sha256(handle.read()).digest())
    for path in spec["shipped"]:
        try:
            st = os.stat(path)
            digest.update(f"{st.st_size}\0{st.st_mtime_ns}\0".encode())
        except OSError:
            digest.update(b"-\0")  # a placed file's image path (hashed above), or a dangling link
    return digest.hexdigest()[:32]


def _kept(folder: str, out_dir: str) -> list[tuple[str, str]] | None:
    """The kept set, copied into ``out_dir`` (another command may prune the cache meanwhile)."""
    try:
        with open(os.path.join(folder, INDEX)) as handle:
            index = json.load(handle)
        os.utime(folder)  # recently used: the last to be pruned
        for _, name in index:
            shutil.copyfile(os.path.join(folder, name), os.path.join(out_dir, name))
    except (OSError, ValueError):
        return None
    return [(pyc, os.path.join(out_dir, name)) for pyc, name in index]


def _prune(cache: str) -> None:
    """Beyond the ``CACHE_KEEP`` most recently used sets, those unused for an hour; and the partial
    sets of makes killed midway (one being made is far younger than an hour: the finder's timeout)."""
    try:
        entries = [e for e in os.scandir(cache) if e.is_dir()]
        sets = sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.stat().st_mtime, reverse=True)
    except OSError:
        return
    partial = [e for e in entries if e.name.startswith(".partial-")]
    for entry in sets[CACHE_KEEP:] + partial:
        try:
            if time.time() - entry.stat().st_mtime > CACHE_IDLE_S:
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            pass


def _run_finder(python: str, out_dir: str, spec: dict) -> list[tuple[str, str]]:
    # A fixed hash seed: set constants are marshalled in iteration order. -S: the host's site
    # folders play no part; -B: nothing written beside the sources read here. -c puts the working
    # folder first on the import path, so it is out_dir (pycs only), never the user's: a json.py
    # there would be imported instead of the image's own (not -I: it would drop the hash seed).
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8"}
    try:
        done = subprocess.run([python, "-B", "-S", "-c", _FINDER, out_dir],
                              input=json.dumps(spec), capture_output=True, text=True, timeout=300, env=env,
                              cwd=out_dir)
    except (OSError, subprocess.SubprocessError) as err:
        raise BytecodeError(f"cannot run {python} to compile the image's byte code: {err}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BytecodeError(f"{python} could not compile the image's byte code: {tail}")
    answer_path = os.path.join(out_dir, ANSWER)
    try:
        with open(answer_path) as handle:
            pycs = [(str(pyc), os.path.join(out_dir, str(name))) for pyc, name in json.load(handle)["pycs"]]
        os.remove(answer_path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BytecodeError(f"{python} left no readable list of the image's byte code: {err}") from None
    return pycs
