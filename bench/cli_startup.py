#!/usr/bin/env python3
"""``sparkctl --help`` start-up: this checkout against another commit, side by side in one run.

The other commit is checked out into a temporary folder (``git worktree``, removed at the end);
each round starts ``sparkctl --help`` once from each tree in turn (the order alternating), each in
its own interpreter with ``PYTHONPATH`` set to its tree, so both see the same load on the machine.
It prints the median wall time of each, the ratio this/base, and the modules each has loaded when
the help is printed (what ``--help`` pulls in: paramiko, pydantic, httpx or docker should not be).
Goal: the ratio stays at or below 1.05 (imports moved to module level must not reach ``--help``).

    python bench/cli_startup.py [--base REV] [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("paramiko", "pydantic", "httpx", "docker", "jinja2", "yaml")

CHILD = r"""
import sys
sys.argv = ["sparkctl", "--help"]
from sparkctl.cli.main import run
try:
    run()
except SystemExit:
    pass
sys.stderr.write("\nMODULES " + " ".join(sorted(m for m in sys.modules if "." not in m or m.startswith("sparkctl"))) + "\n")
"""


def one_start(tree: Path) -> tuple[float, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - started
    line = next((ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES ")), None)
    if proc.returncode != 0 or line is None or "Usage" not in proc.stdout:
        raise SystemExit(f"error: sparkctl --help failed in {tree}: {proc.stderr.strip()[-300:]}")
    return seconds, line.split()[1:]


def compare(base_tree: Path, rounds: int) -> dict:
    times = {"this": [], "base": []}
    modules = {}
    trees = {"this": REPO, "base": base_tree}
    for _ in range(2):  # warm both trees' bytecode caches first
        for tree in trees.values():
            one_start(tree)
    for index in range(rounds):
        order = ("this", "base") if index % 2 == 0 else ("base", "this")
        for name in order:
            seconds, modules[name] = one_start(trees[name])
            times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "rounds": rounds,
        "median_s": {name: round(value, 3) for name, value in medians.items()},
        "ratio_this_over_base": round(medians["this"] / medians["base"], 3),
        "modules": {name: len(found) for name, found in modules.items()},
        "sparkctl_modules": {name: sum(m.startswith("sparkctl") for m in found) for name, found in modules.items()},
        "heavy_loaded": {name: [m for m in HEAVY if m in found] for name, found in modules.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare with (default: HEAD~1)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkctl-startup-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base_tree), args.base], check=True)
        try:
            result = compare(base_tree, args.rounds)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False)
    result["base"] = args.base
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"sparkctl --help, {result['rounds']} rounds side by side: this {result['median_s']['this']} s, "
          f"{args.base} {result['median_s']['base']} s (medians), ratio {result['ratio_this_over_base']}")
    for name in ("this", "base"):
        print(f"  {name}: {result['modules'][name]} top-level and sparkctl modules loaded "
              f"({result['sparkctl_modules'][name]} of sparkctl), heavy: {', '.join(result['heavy_loaded'][name]) or 'none'}")


if __name__ == "__main__":
    main()
