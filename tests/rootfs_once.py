"""The stand-in engine's rootfs tar, made once per test process.

Every plan of a chain whose base is ``standin_engine: true`` writes that tar (this machine's
python3, its libraries, the stand-in engine: ~30 MB, ~0.5 s of CPU with one ``ldd`` per library)
to hash it as the base's input. Its bytes depend only on this machine and the checkout, which a
test run does not change, so the tests make it once with the real maker and give each later call
a hard link (or a copy) of the same bytes. conftest.py points ``STANDIN_ROOTFS_MAKER`` here;
tests/test_standin_units.py calls the real maker itself, and its determinism is checked there.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from sparkctl.standin import rootfs

MAKER = f"{__name__}:write_rootfs_tar"
_made: dict[tuple, rootfs.RootfsReport] = {}


def forget() -> None:
    """Remove the tars this process made (the hard links given out keep their bytes)."""
    for made in _made.values():
        shutil.rmtree(os.path.dirname(made.path), ignore_errors=True)
    _made.clear()


def write_rootfs_tar(path: str | os.PathLike, *, python: str | None = None,
                     busybox: bool | None = None) -> rootfs.RootfsReport:
    """As ``sparkctl.standin.rootfs.write_rootfs_tar``: the same bytes at ``path``."""
    key = (python, busybox)
    if key not in _made:
        folder = tempfile.mkdtemp(prefix="sparkctl-rootfs-once-")
        _made[key] = rootfs.write_rootfs_tar(os.path.join(folder, "standin.tar"), python=python, busybox=busybox)
    made = _made[key]
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.once")
    temp.unlink(missing_ok=True)
    try:
        os.link(made.path, temp)
    except OSError:  # another file system
        shutil.copyfile(made.path, temp)
    os.replace(temp, target)
    # Where ``path`` already was a link to these bytes, rename(2) changes nothing and leaves the temporary
    # name behind (a 30 MB tar in ~/.cache/sparkctl at every plan after the first, once per process).
    temp.unlink(missing_ok=True)
    return dataclasses.replace(made, path=str(target))
