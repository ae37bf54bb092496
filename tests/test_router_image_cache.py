"""The router's package cache (ops/router_image.ensure_wheels) filled by two commands at once.

pip is replaced by a script that does what `pip install --target DIR` leaves behind (the package
folder in DIR), so the test needs no index; the interpreter is this one for everything else."""

from __future__ import annotations

import os
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sparkctl.ops import router_image

VERSION = "0.0.1"


def fake_python(folder: Path, slow_s: float = 0.0) -> str:
    """An interpreter that is the real one, except that `-m pip install --target DIR PKG` writes
    DIR/sglang_router/__init__.py (after ``slow_s``: long enough for the other command to start)."""
    script = folder / "python"
    script.write_text(f"""#!/bin/sh
if [ "$1 $2 $3" = "-m pip install" ]; then
  while [ "$#" -gt 0 ] && [ "$1" != "--target" ]; do shift; done
  sleep {slow_s}
  mkdir -p "$2/sglang_router" && echo "# pid $$" > "$2/sglang_router/__init__.py"
  exit 0
fi
exec {sys.executable} "$@"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_two_commands_filling_the_cache_at_once_both_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    python = fake_python(tmp_path, slow_s=0.5)
    with ThreadPoolExecutor(2) as pool:
        found = list(pool.map(lambda _: router_image.ensure_wheels(VERSION, python), range(2)))
    target = router_image.wheels_dir(VERSION, python)
    assert found == [target, target]
    assert (target / "sglang_router" / "__init__.py").read_text().startswith("# pid ")
    assert sorted(os.listdir(target.parent)) == [target.name]  # no half-filled folder left beside it


def test_a_cache_filled_by_another_command_meanwhile_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    python = fake_python(tmp_path)
    target = router_image.wheels_dir(VERSION, python)
    real_run = router_image.subprocess.run

    def pip_while_another_finishes(argv, **kwargs):
        done = real_run(argv, **kwargs)
        (target / "sglang_router").mkdir(parents=True)
        (target / "sglang_router" / "__init__.py").write_text("# the other command's\n")
        return done

    monkeypatch.setattr(router_image.subprocess, "run", pip_while_another_finishes)
    assert router_image.ensure_wheels(VERSION, python) == target
    assert (target / "sglang_router" / "__init__.py").read_text() == "# the other command's\n"
    assert sorted(os.listdir(target.parent)) == [target.name]
