#!/usr/bin/env python3
"""The CPU one ``sparkctl`` call costs: this checkout against another commit, side by side in one run.

The sandbox tier and the smoke deploy start the CLI hundreds of times, so what one call costs in
CPU (interpreter start, imports, reading the inventory and profile, connecting, asking) adds up.
The other commit is checked out into a temporary folder (``git worktree``, removed at the end).
Each round runs every command once from each tree, the order alternating, each in its own
interpreter with ``PYTHONPATH`` set to its tree, against the same inventory (a sandbox's: bring one
up with ``sparkctl sandbox up --hosts 4``), so both see the same load and the same hosts. It
prints, per command, the median CPU seconds (user + system, of the process and its threads) of
each tree, the ratio this/base, and how many modules each loaded. CPU seconds, not wall time:
on a loaded machine wall time mostly measures the other processes.

    python bench/cli_calls.py --inventory INVENTORY [--profile sandbox] [--base REV] [--rounds N] [--json]

Goal: every ratio at or below 1.0, the geometric mean of the ratios clearly below it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What the tests and the smoke deploy start most; every one reads the inventory and the profile,
# all but render reach every host. (`--dry-run`: nothing changes on the hosts.)
COMMANDS = (
    ("status",),
    ("doctor",),
    ("render",),
    ("logs",),
    ("stop", "--dry-run"),
    ("up", "--dry-run"),
)

# The command runs in process (as the `sparkctl` entry point does), then says how many modules it loaded.
CHILD = r"""
import sys
sys.argv = ["sparkctl"] + sys.argv[1:]
from sparkctl.cli.main import run
try:
    run()
except SystemExit:
    pass
sys.stderr.write("\nMODULES %d\n" % len(sys.modules))
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_call(tree: Path, argv: tuple[str, ...], inventory: str, profile: str) -> tuple[float, int]:
    """(CPU seconds, modules loaded) of one call from ``tree``; the calls run one at a time."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100", "SPARKCTL_INVENTORY": inventory}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # both trees keep their compiled modules, as an install does
    before = children_cpu()
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv, "--profile", profile], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)
    seconds = children_cpu() - before
    line = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.startswith("MODULES ")), None)
    if line is None:
        raise SystemExit(f"error: sparkctl {' '.join(argv)} did not finish in {tree}: {proc.stderr.strip()[-300:]}")
    return seconds, int(line.split()[1])


def compare(trees: dict[str, Path], inventory: str, profile: str, rounds: int) -> dict:
    cpu = {" ".join(argv): {name: [] for name in trees} for argv in COMMANDS}
    modules: dict[str, dict[str, int]] = {" ".join(argv): {} for argv in COMMANDS}
    for tree in trees.values():  # warm both trees' bytecode caches (and the hosts' first answers)
        for argv in COMMANDS:
            one_call(tree, argv, inventory, profile)
    for index in range(rounds):
        order = list(trees) if index % 2 == 0 else list(reversed(trees))
        for argv in COMMANDS:
            for name in order:
                seconds, count = one_call(trees[name], argv, inventory, profile)
                cpu[" ".join(argv)][name].append(seconds)
                modules[" ".join(argv)][name] = count
    result = {}
    for command, per_tree in cpu.items():
        medians = {name: statistics.median(values) for name, values in per_tree.items()}
        result[command] = {
            "cpu_s": {name: round(value, 3) for name, value in medians.items()},
            "ratio_this_over_base": round(medians["this"] / medians["base"], 3),
            "modules": modules[command],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", default=os.environ.get("SPARKCTL_INVENTORY"),
                        help="the inventory the calls use (default: $SPARKCTL_INVENTORY)")
    parser.add_argument("--profile", default="sandbox")
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare with (default: HEAD~1)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.inventory or not Path(args.inventory).is_file():
        raise SystemExit("error: --inventory: name an inventory file (a sandbox's: sparkctl sandbox up --hosts 4)")
    with tempfile.TemporaryDirectory(prefix="sparkctl-calls-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base_tree), args.base], check=True)
        try:
            result = compare({"this": REPO, "base": base_tree}, args.inventory, args.profile, args.rounds)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False)
    ratios = [entry["ratio_this_over_base"] for entry in result.values()]
    summary = {"base": args.base, "rounds": args.rounds, "load_average": [round(x, 1) for x in os.getloadavg()],
               "commands": result, "geometric_mean_ratio": round(math.exp(statistics.fmean(map(math.log, ratios))), 3)}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"CPU seconds of one sparkctl call, {args.rounds} rounds side by side (medians), this vs {args.base}:")
    for command, entry in result.items():
        print(f"  {command:<15} this {entry['cpu_s']['this']:.3f} s  base {entry['cpu_s']['base']:.3f} s  "
              f"ratio {entry['ratio_this_over_base']:.3f}  modules {entry['modules']['this']} vs {entry['modules']['base']}")
    print(f"geometric mean of the ratios: {summary['geometric_mean_ratio']}  "
          f"(load average at the end: {' '.join(map(str, summary['load_average']))})")


if __name__ == "__main__":
    main()
