"""Print a pip constraints file pinning every runtime dependency to its declared lower bound.

`pip install -c <this output> .` then installs the oldest versions pyproject.toml allows, which is
what a user with an older environment gets; scripts/lowest-versions.sh runs the quick tests on it.
Runs on Python 3.10 too (no tomllib there), so it reads the `dependencies` list itself.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REQUIREMENT = re.compile(r'^\s*"([A-Za-z0-9_.\-\[\]]+?)(?:\[[^\]]*\])?\s*>=\s*([0-9][^",;\s]*)')


def lower_bounds(pyproject: str) -> list[str]:
    """``name==lower`` for each ``name>=lower`` in ``[project] dependencies`` (extras are left free)."""
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", pyproject, re.S | re.M)
    if block is None:
        raise SystemExit("lowest_constraints: no [project] dependencies list in pyproject.toml")
    pins = []
    for line in block.group(1).splitlines():
        match = REQUIREMENT.match(line)
        if match:
            pins.append(f"{match.group(1)}=={match.group(2)}")
        elif line.strip().startswith('"'):
            raise SystemExit(f"lowest_constraints: dependency without a >= lower bound: {line.strip()}")
    return pins


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")
    print("\n".join(lower_bounds(path.read_text())))
