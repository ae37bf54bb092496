"""A fresh venv with sparkctl installed from its wheel, as a user's pip or pipx lays it out.

sparkctl itself goes in with a real ``pip install`` of the wheel. Its dependencies do not come from
the package index again: resolving and unpacking them (~200 MB of wheels: numpy, matplotlib, ...)
was most of the CPU this cost, and the test venv (scripts/setup.sh) already resolved the same
requirements. Each distribution the wheel's metadata asks for -- read from the installed wheel, with
what those ask for in turn -- is linked into the new venv's site-packages from the test venv, at
the version the test venv holds, which must satisfy the requirement. Only what the wheel declares is
there: a module sparkctl imports without declaring it is missing in the new venv, as on a user's.

The venv gets no pip of its own (``--without-pip``: the test process's pip installs into it through
``pip --python``), and the install writes no .pyc files (``--no-compile``: Python compiles what a
command imports when it runs).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def install(venv: Path, wheel: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """A new venv at ``venv`` holding ``wheel`` (pip-installed) and the distributions it depends on."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--no-compile", "--no-deps", str(wheel)], capture_output=True, text=True, timeout=timeout)
    if pip.returncode != 0:
        return pip
    site = _site_packages(venv)
    installed = next(metadata.distributions(path=[str(site)]))
    try:
        for dist in dependencies(installed):
            _link(dist, site)
    except LookupError as missing:
        return subprocess.CompletedProcess(pip.args, 1, pip.stdout, f"{pip.stderr}{missing}\n")
    return pip


def dependencies(dist: metadata.Distribution) -> list[metadata.Distribution]:
    """The distributions ``dist`` needs (its requirements without extras, and theirs), from this
    interpreter's environment. LookupError: one is absent or at a version the requirement excludes."""
    found: dict[str, metadata.Distribution] = {}
    wanted = [(req, dist.metadata["Name"]) for req in _requirements(dist, extras=())]
    while wanted:
        req, asked_by = wanted.pop()
        try:
            have = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise LookupError(f"{asked_by} needs {req}: not installed in the test venv") from None
        if req.specifier and not req.specifier.contains(have.version, prereleases=True):
            raise LookupError(f"{asked_by} needs {req}: the test venv has {have.version}")
        key = have.metadata["Name"].lower().replace("_", "-")
        extras = tuple(sorted(req.extras))
        if (key, extras) in found:
            continue
        found[(key, extras)] = have
        wanted += [(sub, req.name) for sub in _requirements(have, extras)]
    return list({name: d for (name, _), d in found.items()}.values())


def _requirements(dist: metadata.Distribution, extras: tuple[str, ...]) -> list[Requirement]:
    """``dist``'s requirements that apply on this interpreter, with these extras asked for."""
    applying = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            applying.append(req)
    return applying


def _link(dist: metadata.Distribution, site: Path) -> None:
    """``dist``'s top-level entries (packages, modules, .dist-info, .pth) linked into ``site``.
    Its scripts (outside site-packages) and compiled caches are left out."""
    for top in {Path(f).parts[0] for f in dist.files or []}:
        if top in ("..", "__pycache__") or (site / top).exists():
            continue
        (site / top).symlink_to(Path(dist.locate_file(top)))


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def shared_wheel(tmp_path_factory) -> Path:
    """sparkctl's wheel (``pip wheel --no-deps``), built once per test run from a copy of the tracked
    tree (no build leftovers of this checkout), shared by this run's processes under a file lock."""
    base = tmp_path_factory.getbasetemp()
    # An xdist worker's folder is popen-gwN inside the run's own: the run's folder is shared by its
    # workers (not the variable PYTEST_XDIST_WORKER, which a pytest started inside a worker inherits).
    root = base.parent if base.name.startswith("popen-gw") else base
    dist = root / "sparkctl-wheel"
    with open(root / "sparkctl-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted(dist.glob("sparkctl-*.whl"))
        if built:
            return built[0]
        source = root / "sparkctl-wheel-src"
        _copy_tracked(source)
        pip = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
                             capture_output=True, text=True, timeout=600)
        shutil.rmtree(source)
        assert pip.returncode == 0, pip.stderr[-3000:]
        return next(dist.glob("sparkctl-*.whl"))


def _copy_tracked(dest: Path) -> None:
    """The checkout's tracked and new (not ignored) files copied to ``dest``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for rel in files:
        if (REPO / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dest / rel)
