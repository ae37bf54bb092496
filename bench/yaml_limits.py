#!/usr/bin/env python3
"""Inventory/profile loading under hostile input: time and peak memory, side by side in one run.

Each case runs in its own process (so peak RSS is its own) under a 1.5 GB address-space cap and a
120 s timeout:

* ``bounded``: sparkctl's loader (``sparkctl.config.yamlfile.parse_yaml_text``), which refuses;
* ``plain``: the loader before the limits: PyYAML's compose and load, then the line of every path
  recorded with aliases followed (where the old loader's time and memory went).

Cases: the 342-byte "billion laughs" at 6 and 7 levels, a legitimate inventory of 5,000 hosts
(~220 KiB, just under the size limit) and the largest built-in recipe. Goal: the bounded loader
refuses every bomb in well under a second and ~40 MB, and a legitimate file costs no more than
``plain`` (ratio bounded/plain <= 1.2).

    python bench/yaml_limits.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAP = 1536 << 20

CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
text = open(path, encoding="utf-8").read()
import yaml
from sparkctl.config.yamlfile import parse_yaml_text
from sparkctl.errors import ConfigError
started = time.perf_counter()
outcome = "loaded"
if mode == "bounded":
    try:
        parse_yaml_text(text, path)
    except ConfigError as err:
        outcome = "refused: " + err.detail
else:  # the loader before the limits: load, then record the line of every path, aliases followed
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    data = yaml.load(text, Loader=yaml.SafeLoader)
    lines, stack = {}, [(node, ())]
    while stack:
        item, loc = stack.pop()
        if isinstance(item, yaml.MappingNode):
            for key, value in item.value:
                lines[loc + (key.value,)] = key.start_mark.line + 1
                stack.append((value, loc + (key.value,)))
        elif isinstance(item, yaml.SequenceNode):
            for index, child in enumerate(item.value):
                lines[loc + (index,)] = child.start_mark.line + 1
                stack.append((child, loc + (index,)))
    outcome = f"loaded ({len(lines):,} paths recorded)"
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "outcome": outcome}))
"""

def bomb(levels: int) -> str:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def inventory(hosts: int) -> str:
    rows = ["hosts:"]
    for i in range(hosts):
        rows.append(f"  - {{name: h{i}, address: 10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
                    + (", role: head}" if i == 0 else "}"))
    return "\n".join(rows) + "\n"


def run(mode: str, path: str) -> dict:
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, mode, path], capture_output=True, text=True, timeout=120,
                              preexec_fn=cap, env=env)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "peak_mb": None, "outcome": "killed after 120 s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"seconds": None, "peak_mb": None, "outcome": f"crashed: {last[:80]}"}
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    recipes = sorted((REPO / "recipes").glob("*.yaml"), key=lambda p: p.stat().st_size)
    with tempfile.TemporaryDirectory() as tmp:
        cases = {"bomb-6-levels": bomb(6), "bomb-7-levels": bomb(7), "inventory-5000-hosts": inventory(5000)}
        paths = {}
        for name, text in cases.items():
            paths[name] = os.path.join(tmp, f"{name}.yaml")
            Path(paths[name]).write_text(text)
        paths[f"recipe {recipes[-1].name}"] = str(recipes[-1])
        rows = []
        for name, path in paths.items():
            bounded, plain = run("bounded", path), run("plain", path)
            ratio = (bounded["seconds"] / plain["seconds"]) if bounded["seconds"] and plain["seconds"] else None
            rows.append({"case": name, "bytes": os.path.getsize(path), "bounded": bounded, "plain": plain,
                         "time_ratio_bounded_over_plain": ratio})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(f"{row['case']} ({row['bytes']:,} bytes)")
        for mode in ("bounded", "plain"):
            r = row[mode]
            seconds = f"{r['seconds']:.3f} s" if r["seconds"] is not None else "-"
            peak = f"{r['peak_mb']:.0f} MB" if r["peak_mb"] is not None else "-"
            print(f"  {mode:<8} {seconds:>10} {peak:>8}  {r['outcome'][:90]}")
        if row["time_ratio_bounded_over_plain"] is not None:
            print(f"  time ratio bounded/plain: {row['time_ratio_bounded_over_plain']:.2f}")


if __name__ == "__main__":
    main()
