"""A fresh venv with sparkctl installed from a wheel or a source tree, as a user's pip or pipx makes it.

Cheaper than the obvious way in the two places that cost most: the venv gets no pip of its own
(``--without-pip``; the test process's pip installs into it through ``pip --python``), and the
install writes no .pyc files for the dependencies (``--no-compile``: Python compiles what a command
imports when it runs). What lands in site-packages, the entry point and the metadata are the same.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def install(venv: Path, target: str | Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """A new venv at ``venv`` holding ``target`` (a wheel or a source folder) and its dependencies."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           "--no-compile", str(target)], capture_output=True, text=True, timeout=timeout)
