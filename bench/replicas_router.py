#!/usr/bin/env python3
"""Replicas behind the real router on the sandbox: one run, figures side by side.

Needs a deployment of a replicated profile (default ``sandbox-replicas`` on a 4-host sandbox:
``sparkctl sandbox up --hosts 4``, ``sparkctl sandbox make-checkpoint``); it runs ``sparkctl up``
first (nothing to do when it already serves). Then, with closed-loop clients (tests/router_load.py):

1. **spread**: replica 2's head alone at c=4, then the router at c=8, ``--rounds`` times
   alternated; ratio = router / (2 x one replica). 1.0 means the router spreads the load evenly
   and costs nothing. The CPU busy share of this machine is printed for each phase: every host and
   the router share its cores, so when they are saturated the ratio falls for the machine's
   reasons, not the router's.
2. **rolling**: ``up --set max_num_seqs=N`` (another engine option: both replicas must restart)
   under a c=4 load through the router: requests, failures, worst latency.
3. **parallel**: the same change with ``--parallel``: what restarting all at once costs.
4. **kill**: replica 2's head container killed under load: failures, and how long until the
   router marks it unhealthy. ``serve --replica 2`` brings it back at the end.

    python bench/replicas_router.py -i INVENTORY [--profile sandbox-replicas] [--set K=V] [--rounds 3] [--seconds 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from router_load import Load  # noqa: E402


def cli(inventory: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkctl", "-i", inventory, *args], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))


def cpu_busy() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def busy_share(before, after) -> float:
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def measured(endpoint: str, model: str, concurrency: int, seconds: float) -> dict:
    before = cpu_busy()
    load = Load(endpoint, model, concurrency=concurrency, max_tokens=48).run_for(seconds)
    return dict(load.summary(), cpu_busy=round(busy_share(before, cpu_busy()), 3))


def spread(target: dict, rounds: int, seconds: float) -> dict:
    rows = []
    for _ in range(rounds):
        one = measured(target["replica2"], target["model"], 4, seconds)
        both = measured(target["router"], target["model"], 8, seconds)
        rows.append({"one_c4": one, "router_c8": both,
                     "ratio": round(both["tokens_per_s"] / (2 * one["tokens_per_s"]), 3) if one["tokens_per_s"] else None})
    ratios = sorted(r["ratio"] for r in rows if r["ratio"] is not None)
    return {"rounds": rows, "median_ratio": ratios[len(ratios) // 2] if ratios else None}


def under_load(target: dict, action) -> dict:
    with Load(target["router"], target["model"], concurrency=4, max_tokens=32) as load:
        time.sleep(3)
        started = time.monotonic()
        result = action()
        seconds = time.monotonic() - started
        time.sleep(2)
    return dict(load.summary(), action_exit=result.returncode, action_s=round(seconds, 1),
                marked_down_s=getattr(result, "marked_down_s", None))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--profile", default="sandbox-replicas")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--set", action="append", default=[], dest="sets", help="A profile --set, passed on.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    inv = args.inventory
    profile = ["--profile", args.profile] + [part for s in args.sets for part in ("--set", s)]
    up = cli(inv, "--json", "up", *profile)
    if up.returncode != 0:
        print(up.stderr[-2000:], file=sys.stderr)
        return 1
    status = json.loads(cli(inv, "--json", "status", *profile).stdout)
    target = {"router": status["endpoint"], "replica2": status["replicas"][1]["endpoint"],
              "model": (status["health"] or {}).get("models", ["deepseek-v4.1-flash"])[0]}
    seqs = json.loads(cli(inv, "--json", "serve", *profile, "--dry-run").stdout)["replicas"][0]["serve"]["hosts"][0]
    base = int(seqs["engine_argv"][seqs["engine_argv"].index("--max-num-seqs") + 1])
    doc = {"target": target, "spread": spread(target, args.rounds, args.seconds)}
    doc["rolling"] = under_load(target, lambda: cli(inv, "up", *profile, "--set", f"max_num_seqs={base + 1}"))
    doc["parallel"] = under_load(target, lambda: cli(inv, "up", *profile, "--set", f"max_num_seqs={base}", "--parallel"))
    host = status["replicas"][1]["head"]
    doc["kill"] = under_load(target, lambda: kill_head(inv, args.profile, host, target))
    doc["restore"] = cli(inv, "serve", *profile, "--replica", "2").returncode
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(human(doc))
    return 0


def kill_head(inventory: str, profile: str, host: str, target: dict):
    """Kill replica 2's head container over SSH (as an operator would), then wait until the router
    lists it unhealthy; the kill's result, with the wait in ``marked_down_s``."""
    import httpx
    import yaml

    doc = yaml.safe_load(Path(inventory).read_text())
    address = next(h["address"] for h in doc["hosts"] if h["name"] == host)
    key = (doc.get("defaults") or {}).get("ssh", {}).get("identity_file")
    known = doc.get("known_hosts")
    argv = ["ssh", "-o", "BatchMode=yes"] + (["-i", os.path.expanduser(key)] if key else []) + \
           (["-o", f"UserKnownHostsFile={os.path.expanduser(known)}"] if known else []) + \
           [f"root@{address}", "docker", "kill", "sparkctl-sandbox"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    started = time.monotonic()
    while time.monotonic() - started < 120:
        workers = httpx.get(target["router"] + "/workers", timeout=5).json().get("workers", [])
        if any(w["url"] == target["replica2"] and not w["is_healthy"] for w in workers):
            break
        time.sleep(1)
    result.marked_down_s = round(time.monotonic() - started, 1)
    return result


def human(doc: dict) -> str:
    lines = [f"router {doc['target']['router']}, replica 2 {doc['target']['replica2']}"]
    for i, row in enumerate(doc["spread"]["rounds"], 1):
        one, both = row["one_c4"], row["router_c8"]
        lines.append(f"round {i}: one replica c=4 {one['tokens_per_s']:.1f} tok/s (cpu {one['cpu_busy']:.0%}), "
                     f"router c=8 {both['tokens_per_s']:.1f} tok/s (cpu {both['cpu_busy']:.0%}), ratio {row['ratio']}")
    lines.append(f"median ratio router c=8 / (2 x one replica c=4): {doc['spread']['median_ratio']}")
    for name in ("rolling", "parallel", "kill"):
        r = doc[name]
        lines.append(f"{name}: {r['requests']} requests, {r['failed']} failed, worst {r['worst_latency_s']:.2f} s "
                     f"(action {r['action_s']} s, exit {r['action_exit']})"
                     + (f"; the router marked it down after {r['marked_down_s']} s" if r.get("marked_down_s") else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
