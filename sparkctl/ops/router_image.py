"""The router's own small image, for serving images that lack ``sglang_router`` (vLLM's, the sandbox's).

Why an image and not a venv on the host: the router then runs, restarts (``--restart
unless-stopped``) and is inspected exactly like the engines, and the hosts need nothing but Docker.
Why not a registry image: the hosts (and the sandbox) may have no registry. So it is made here,
as the sandbox's engine image is (``sparkctl.standin.rootfs``): this machine's python3 and its
standard library, plus ``sglang-router==VERSION`` and its dependencies installed from PyPI with
that same interpreter (``pip install --target``, kept in a cache folder so it is fetched once),
``docker import``-ed on the router's host over SSH. The interpreter and the wheels are this
machine's architecture, so the host must have the same (checked, one clear refusal otherwise).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from sparkctl.bytecode import BytecodeError, image_pycs
from sparkctl.errors import SparkctlError
from sparkctl.resources import cache_dir
from sparkctl.standin.rootfs import (default_python, docker_import_argv, probe_python, pyc_cache, shared_libraries,
                                     write_rootfs_tar)

PIP_TIMEOUT_S = 900


class RouterImageError(SparkctlError):
    exit_code = 1  # an operation failed (pip, the host, docker import), not the user's input


def wheels_dir(version: str, python: str) -> Path:
    info = probe_python(python)
    major_minor = "".join(info["version"].split(".")[:2])
    return cache_dir() / f"sglang-router-{version}-py{major_minor}-{platform.machine()}"


def ensure_wheels(version: str, python: str) -> Path:
    """``sglang-router==version`` and its dependencies installed into a cache folder (once)."""
    target = wheels_dir(version, python)
    if (target / "sglang_router" / "__init__.py").is_file():
        return target
    # A folder of this process's and thread's own: two commands on this machine (or two threads of
    # one) may fill the cache at once.
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(partial, ignore_errors=True)
    argv = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
            "--target", str(partial), f"sglang-router=={version}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RouterImageError(f"pip could not install sglang-router {version}: {err}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RouterImageError(f"pip install sglang-router=={version} failed: {tail[0]}")
    try:
        os.replace(partial, target)
    except OSError as err:  # another command filled the cache first: its copy is as good as ours
        shutil.rmtree(partial, ignore_errors=True)
        if not (target / "sglang_router" / "__init__.py").is_file():
            raise RouterImageError(f"cannot keep sglang-router {version} at {target}: {err}") from None
    return target


def _add_tree(tar: tarfile.TarFile, source: Path, dest: str) -> list[str]:
    """Every file under ``source`` at ``dest`` in the tar; returns the shared objects added."""
    objects = []
    for folder, dirs, names in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, source)
        for name in sorted(names):
            path = os.path.join(folder, name)
            arcname = os.path.normpath(os.path.join(dest, rel, name)).lstrip("/")
            tar.add(path, arcname=arcname, recursive=False)
            if ".so" in name:
                objects.append(path)
    return objects


# What the router's container runs (commands/router.py: the launcher, the image probe's metadata read).
ROUTER_IMPORTS = ("sglang_router.launch_router", "importlib.metadata", "runpy")


def _router_pycs(python: str, wheels: Path, site: str, present: set[str], work: str) -> list[tuple[str, str]]:
    """Pycs for what the router imports (``sparkctl.bytecode``) that the stand-in's part lacks."""
    shipped = {"/" + name for name in present if name.endswith(".py")}
    shipped |= {os.path.join(site, os.path.relpath(os.path.join(folder, name), wheels))
                for folder, dirs, names in os.walk(wheels) for name in names if name.endswith(".py")}
    try:
        pycs = image_pycs(python, work, places=[(str(wheels), site)], imports=ROUTER_IMPORTS, shipped=shipped,
                          cache=pyc_cache())
    except BytecodeError as err:
        raise RouterImageError(str(err)) from None
    return [(pyc, made) for pyc, made in pycs if pyc.lstrip("/") not in present]


def write_router_tar(path: str, version: str, python: str | None = None, *, bytecode: bool = True) -> dict:
    """The router image's root filesystem at ``path``; returns what is in it (``bytecode=False``: no pycs)."""
    python = python or default_python()
    wheels = ensure_wheels(version, python)
    report = write_rootfs_tar(path, python=python, busybox=False, bytecode=bytecode)
    with tarfile.open(path, "a", format=tarfile.GNU_FORMAT) as tar, \
            tempfile.TemporaryDirectory(prefix="sparkctl-router-pycs-") as work:
        present = set(tar.getnames())
        objects = _add_tree(tar, wheels, report.site_packages)
        for lib in shared_libraries(objects):  # libgcc_s, libstdc++: the interpreter itself needs neither
            if lib.lstrip("/") not in present:
                tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
                present.add(lib.lstrip("/"))
        for pyc, made in _router_pycs(python, wheels, report.site_packages, present, work) if bytecode else []:
            info = tar.gettarinfo(made, arcname=pyc.lstrip("/"))
            info.mode, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, "root", "root"
            with open(made, "rb") as handle:
                tar.addfile(info, handle)
    return {"path": path, "bytes": os.path.getsize(path), "python": report.python_version, "router": version,
            "machine": platform.machine()}


def import_on_host(conn, tag: str, version: str, *, reporter=None, timeout_s: float = 900) -> dict:
    """Make the router image here and ``docker import`` it as ``tag`` on ``conn``'s host (``reporter``: for its note)."""
    machine = conn.run(["uname", "-m"], timeout=30)
    if not machine.ok or machine.stdout.strip() != platform.machine():
        raise RouterImageError(f"{conn.target.name} is {machine.stdout.strip() or 'unknown'}, this machine "
                               f"{platform.machine()}: build the router image there, or set router.image to an image "
                               "with sglang_router (the SGLang serving image has it)")
    with tempfile.TemporaryDirectory(prefix="sparkctl-router-") as folder:
        tar_path = os.path.join(folder, "router.tar")
        if reporter is not None:
            reporter.note(f"making the router image {tag} (sglang-router {version}, {sys.version.split()[0]} here)")
        made = write_router_tar(tar_path, version)

        def chunks():
            with open(tar_path, "rb") as handle:
                while piece := handle.read(1 << 20):
                    yield piece

        result = conn.run_stream_in(docker_import_argv(tag), chunks(), timeout=timeout_s)
    if not result.ok:
        raise RouterImageError(f"docker import of {tag} on {conn.target.name} failed: "
                               f"{(result.stderr or result.stdout).strip()[:300]}")
    return made
