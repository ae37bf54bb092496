"""A minimal container root filesystem for the stand-in engine, made from this machine's python3.

``write_rootfs_tar(path)`` writes a tar for ``docker import`` (see ``docker_import_argv``) holding:

* the interpreter (``/usr/bin/python3`` by default) at its own absolute path, so it finds its
  standard library the way it does here, plus ``/usr/bin/python3`` pointing at it;
* its standard library without tests, IDLE/tkinter, lib2to3, ensurepip, byte-code caches and the
  static-library ``config-*`` folder, and its ``lib-dynload`` extension modules minus test,
  terminal and database ones;
* checked-hash pycs (``sparkctl.bytecode.image_pycs``) for the modules the image's programs
  import (the stand-in engine, the shims, the surface probe): a container starts from a fresh
  layer each time, so without them every engine start compiled them all again (~3 MB here);
* every shared library ``ldd`` lists for the interpreter and those extension modules (symlinks
  resolved, each stored at the path ``ldd`` printed, the dynamic loader included);
* the stand-in package as ``sparkctl_standin`` (with the engine flags files), the
  ``sglang.launch_server`` shim, and ``/usr/local/bin/vllm``, in the interpreter's first
  site-packages folder;
* ``/usr/local/bin/ray`` (the stand-in Ray of ``ray.py``, for the Ray launcher);
* ``/bin/busybox`` and ``/bin/sh`` when a static busybox is installed (``docker exec ... sh``), and
  a ``/bin/bash`` that runs busybox sh (the rendered Ray head command is ``bash -c 'POSIX text'``);
* ``/tmp``, ``/root``, ``/etc/passwd``, ``/etc/group``.

About 35 MB uncompressed with Debian 12's python3.11. Standard library only, like the engine.
"""

from __future__ import annotations

import io
import filecmp
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from sparkctl.bytecode import BytecodeError, image_pycs
from sparkctl.resources import cache_dir

PACKAGE_NAME = "sparkctl_standin"  # the stand-in package's import name inside the image
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# `docker import --change ...`: what a Dockerfile would have said.
IMPORT_CHANGES = (f"ENV PATH={IMAGE_PATH}", "ENV LANG=C.UTF-8", "ENV PYTHONUNBUFFERED=1")

_STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                     "pydoc_data", "site-packages", "dist-packages", "__pycache__", "lib-dynload", "venv"}
_STDLIB_SKIP_FILES = re.compile(r".*\.(pyc|pyo|exe)\Z|^turtle\.py\Z")
_DYNLOAD_SKIP = re.compile(r"^(_test|_xxtest|xxlimited|_ctypes_test|_tkinter|_curses|readline|_dbm|_gdbm|nis|"
                           r"ossaudiodev|_sqlite3|_xxsubinterpreters|_testinternalcapi|_testclinic|_testbuffer|"
                           r"_testimportmultiple|_testmultiphase|_testcapi)")
_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*\Z")

_PROBE = r"""
import json, os, site, sys, sysconfig
paths = sysconfig.get_paths()
dyn = sysconfig.get_config_var("DESTSHARED") or os.path.join(paths["stdlib"], "lib-dynload")
print(json.dumps({"executable": os.path.realpath(sys.executable), "version": "%d.%d.%d" % sys.version_info[:3],
                  "stdlib": paths["stdlib"], "platstdlib": paths["platstdlib"], "dynload": dyn,
                  "site": site.getsitepackages()}))
"""


class RootfsError(RuntimeError):
    pass


@dataclass
class RootfsReport:
    path: str
    bytes: int
    files: int
    python: str  # interpreter path inside the image (the same as on this machine)
    python_version: str
    site_packages: str
    libraries: List[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"path": self.path, "bytes": self.bytes, "files": self.files, "python": self.python,
                "python_version": self.python_version, "site_packages": self.site_packages,
                "libraries": self.libraries}


def default_python() -> str:
    for candidate in ("/usr/bin/python3", shutil.which("python3") or ""):
        if candidate and os.path.exists(candidate):
            return candidate
    raise RootfsError("no python3 on this machine to build the stand-in image from")


def probe_python(python: str) -> dict:
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise RootfsError(f"cannot run {python}: {err}") from None
    info = json.loads(out)
    major_minor = tuple(int(x) for x in info["version"].split(".")[:2])
    if major_minor < (3, 9):
        raise RootfsError(f"{python} is Python {info['version']}; the stand-in needs 3.9 or newer")
    return info


def shared_libraries(elf_files: Iterable[str]) -> List[str]:
    """Every library (and the dynamic loader) ``ldd`` lists for these files, as absolute paths."""
    found: Dict[str, None] = {}
    for path in elf_files:
        proc = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            if "not a dynamic executable" in (proc.stdout + proc.stderr):
                continue
            raise RootfsError(f"ldd {path} failed: {(proc.stderr or proc.stdout).strip()}")
        for line in proc.stdout.splitlines():
            if "not found" in line:
                raise RootfsError(f"{path} needs a library this machine lacks: {line.strip()}")
            match = _LDD_LINE.match(line)
            if match:
                found.setdefault(match.group(2), None)
    return sorted(found)


def _stdlib_files(stdlib: str) -> List[str]:
    out = []
    for root, dirs, files in os.walk(stdlib):
        rel = os.path.relpath(root, stdlib)
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP_DIRS and not (rel == "." and d.startswith("config-")))
        for name in sorted(files):
            if not _STDLIB_SKIP_FILES.match(name):
                out.append(os.path.join(root, name))
    return out


def _dynload_files(dynload: str) -> List[str]:
    if not os.path.isdir(dynload):
        return []
    return [os.path.join(dynload, n) for n in sorted(os.listdir(dynload))
            if n.endswith(".so") and not _DYNLOAD_SKIP.match(n)]


def _standin_files() -> Dict[str, str]:
    """Package-relative path -> file on this machine, for the package, its flags files and the shims."""
    here = Path(__file__).resolve().parent
    out = {}
    for path in sorted(here.glob("*.py")):
        out[f"{PACKAGE_NAME}/{path.name}"] = str(path)
    flags_dir = here.parent / "engine_flags"
    for path in sorted([*flags_dir.glob("*.json"), *flags_dir.glob("*-envs.txt")]):
        out[f"{PACKAGE_NAME}/engine_flags/{path.name}"] = str(path)
    for path in sorted((here / "shims" / "sglang").glob("*.py")):
        out[f"sglang/{path.name}"] = str(path)
    return out


def shim_script(name: str, python: str) -> bytes:
    """``shims/bin/NAME`` with the image's interpreter on its first line."""
    shim = (Path(__file__).resolve().parent / "shims" / "bin" / name).read_text()
    lines = shim.splitlines(True)
    return (f"#!{python}\n" + "".join(lines[1:])).encode()


def vllm_script(python: str) -> bytes:
    return shim_script("vllm", python)


# The image has busybox's POSIX sh, not bash; the launch commands sparkctl renders use `bash -c`
# only for POSIX text (`ray start --head ... && exec vllm serve ...`), so this stands in for it.
BASH_SHIM = b'#!/bin/sh\n# stand-in image: bash -c runs in busybox sh (the commands rendered here are POSIX)\nexec /bin/sh "$@"\n'


def write_package(site: str | os.PathLike) -> str:
    """The stand-in package (as ``PACKAGE_NAME``, with its flags files and the sglang shims) under
    ``site``, a folder to put on PYTHONPATH, readable by every user whatever the umask (a sandbox
    host's login user runs it). Returns ``site``."""
    for rel, src in _standin_files().items():
        target = Path(site) / rel
        if target.is_file() and filecmp.cmp(src, target, shallow=False):
            continue  # already this file (a sandbox host brought up again)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        target.chmod(0o644)
    for folder in {Path(site), *(p for p in Path(site).rglob("*") if p.is_dir())}:
        folder.chmod(0o755)
    return str(site)


def write_tree(dest: str | os.PathLike) -> str:
    """The stand-in's part of the image (packages and the vllm script) under ``dest`` as a plain
    folder, for running the shims on this machine: ``PYTHONPATH=dest/site python3 -m sglang.launch_server``.
    Returns the site folder."""
    site = write_package(Path(dest) / "site")
    bin_dir = Path(dest) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    import sys

    for name in ("vllm", "ray"):
        (bin_dir / name).write_bytes(shim_script(name, sys.executable))
        os.chmod(bin_dir / name, 0o755)
    return str(site)


class _TarWriter:
    def __init__(self, tar: tarfile.TarFile):
        self.tar = tar
        self.dirs: set = set()
        self.names: set = set()
        # A fixed time, so the same inputs give the same bytes: the image chain hashes this tar
        # to decide whether its base must be imported again.
        self.now = 1_700_000_000

    def _info(self, name: str) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = self.now
        return info

    def directory(self, path: str, mode: int = 0o755) -> None:
        path = path.rstrip("/")
        if not path or path in self.dirs:
            return
        self.directory(os.path.dirname(path))
        info = self._info(path)
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.tar.addfile(info)
        self.dirs.add(path)

    def data(self, path: str, content: bytes, mode: int = 0o644) -> None:
        if path in self.names:
            return
        self.directory(os.path.dirname(path))
        info = self._info(path)
        info.size, info.mode = len(content), mode
        self.tar.addfile(info, io.BytesIO(content))
        self.names.add(path)

    def file(self, path: str, source: str, mode: Optional[int] = None) -> None:
        """``source`` copied (symlinks followed) to ``path``."""
        if path in self.names:
            return
        real = os.path.realpath(source)
        st = os.stat(real)
        self.directory(os.path.dirname(path))
        info = self._info(path)
        info.size, info.mode = st.st_size, mode if mode is not None else (st.st_mode & 0o7777)
        with open(real, "rb") as handle:
            self.tar.addfile(info, handle)
        self.names.add(path)

    def symlink(self, path: str, target: str) -> None:
        if path in self.names:
            return
        self.directory(os.path.dirname(path))
        info = self._info(path)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        self.tar.addfile(info)
        self.names.add(path)


# What the image's programs import beyond the stand-in package itself (all of it but the makers):
# Debian's sitecustomize (run by site at every start) and the surface probe's own imports.
_PROBE_IMPORTS = ("sitecustomize", "argparse", "glob", "importlib", "json", "re")
_NOT_IMPORTED = {"__main__", "rootfs"}  # a checkout's entry point; the maker of this tar


def image_imports() -> List[str]:
    """The modules to find the image's byte code from: the stand-in package, the shims, the probe's."""
    stems = sorted(Path(rel).stem for rel in _standin_files() if rel.startswith(f"{PACKAGE_NAME}/") and rel.endswith(".py"))
    package = [PACKAGE_NAME if stem == "__init__" else f"{PACKAGE_NAME}.{stem}" for stem in stems if stem not in _NOT_IMPORTED]
    return package + ["sglang.launch_server", *_PROBE_IMPORTS]


def pyc_cache() -> str:
    """Where the images' pyc sets are kept between makes (``sparkctl.bytecode.image_pycs``): the
    stand-in's and the router's, one folder for both."""
    return str(cache_dir() / "pycs")


def standin_pycs(python: str, site: str, stdlib: Iterable[str], work: str) -> List[Tuple[str, str]]:
    """``[(pyc path in the image, file here)]`` for the image's imports (``sparkctl.bytecode``), the
    package compiled from a copy written here under its image name; kept in ``pyc_cache()`` under
    a key of all they are made from, so a changed source makes them again."""
    package = write_package(os.path.join(work, "site"))
    out = os.path.join(work, "pycs")
    os.mkdir(out)
    shipped = set(stdlib) | {f"{site}/{rel}" for rel in _standin_files() if rel.endswith(".py")}
    try:
        return image_pycs(python, out, places=[(package, site)], imports=image_imports(), shipped=shipped,
                          cache=pyc_cache())
    except BytecodeError as err:
        raise RootfsError(str(err)) from None


def write_rootfs_tar(path: str | os.PathLike, *, python: Optional[str] = None, busybox: Optional[bool] = None,
                     bytecode: bool = True) -> RootfsReport:
    """Write the image's root filesystem as a tar at ``path`` (see the module docstring);
    ``bytecode=False``: without the pycs (what the image was before them, for comparisons)."""
    python = python or default_python()
    info = probe_python(python)
    interpreter = info["executable"]
    stdlib_dirs = [info["stdlib"]] + ([info["platstdlib"]] if info["platstdlib"] != info["stdlib"] else [])
    stdlib = [f for d in stdlib_dirs for f in _stdlib_files(d)]
    dynload = _dynload_files(info["dynload"])
    libraries = shared_libraries([interpreter] + dynload)
    site = next((s for s in info["site"] if "packages" in s), None)
    if site is None:
        raise RootfsError(f"{python} reports no site-packages folder")
    busybox_path = shutil.which("busybox") if busybox is not False else None
    if busybox and not busybox_path:
        raise RootfsError("busybox was asked for but is not installed (busybox-static)")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="sparkctl-rootfs-") as work:
        pycs = standin_pycs(python, site, stdlib, work) if bytecode else []
        with tarfile.open(temp, "w", format=tarfile.GNU_FORMAT) as tar:
            w = _TarWriter(tar)
            for folder in ("/bin", "/etc", "/usr/bin", "/usr/local/bin", "/proc", "/sys", "/dev", "/model", "/engram"):
                w.directory(folder)
            w.directory("/tmp", 0o1777)
            w.directory("/root", 0o700)
            w.data("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
            w.data("/etc/group", b"root:x:0:\nnogroup:x:65534:\n")
            w.file(interpreter, interpreter, 0o755)
            if interpreter != "/usr/bin/python3":
                w.symlink("/usr/bin/python3", interpreter)
            for lib in libraries:
                w.file(lib, lib)
            for source in stdlib:
                if os.path.islink(source) and not os.path.exists(source):
                    continue  # Debian's sitecustomize.py -> /etc/python3.x/ (not in the image)
                w.file(source, source, 0o644)
            for source in dynload:
                w.file(source, source, 0o644)
            for rel, source in _standin_files().items():
                w.file(f"{site}/{rel}", source, 0o644)
            for pyc, made in pycs:
                w.file(pyc, made, 0o644)
            w.data("/usr/local/bin/vllm", vllm_script(interpreter), 0o755)
            w.data("/usr/local/bin/ray", shim_script("ray", interpreter), 0o755)
            if busybox_path:
                w.file("/bin/busybox", busybox_path, 0o755)
                for applet in ("sh", "cat", "ls", "ps", "sleep", "kill", "env"):
                    w.symlink(f"/bin/{applet}", "busybox")
                w.data("/bin/bash", BASH_SHIM, 0o755)
            count = len(w.names)
    os.replace(temp, target)
    return RootfsReport(path=str(target), bytes=target.stat().st_size, files=count, python=interpreter,
                        python_version=info["version"], site_packages=site, libraries=libraries)


def docker_import_argv(tag: str) -> List[str]:
    """``docker import`` of the tar (on stdin) as ``tag``."""
    argv = ["docker", "import"]
    for change in IMPORT_CHANGES:
        argv += ["--change", change]
    return argv + ["-", tag]
