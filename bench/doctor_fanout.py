"""doctor on 1 vs 4 vs 8 sandbox hosts, measured side by side in one run.

Goal: the whole run on 8 hosts takes about the time of 1 (the hosts are checked in parallel).
Needs root: brings up its own sandbox ("bench-doctor", 8 hosts) and removes it afterwards
unless --keep. Usage: python3 bench/doctor_fanout.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def time_doctor(inventory: str, hosts: list[str]) -> float:
    argv = [sys.executable, "-m", "sparkctl", "-i", inventory, "doctor", "--json", "--hosts", ",".join(hosts)]
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if not proc.stdout.startswith("{"):
        raise SystemExit(f"doctor failed: {proc.stderr}")
    return elapsed


def in_process(info, names: list[str], rounds: int) -> None:
    """The check run alone (no interpreter start): 8 hosts at once vs the same 8 one after another."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.ops.doctor.run import run_doctor

    inventory = load_inventory(info.inventory)
    hosts = {h.name: h for h in inventory.hosts}
    one, parallel, serial = [], [], []
    for _ in range(rounds):
        started = time.perf_counter()
        run_doctor(inventory, [hosts[names[0]]])
        one.append(time.perf_counter() - started)
        started = time.perf_counter()
        run_doctor(inventory, [hosts[n] for n in names])
        parallel.append(time.perf_counter() - started)
        started = time.perf_counter()
        for n in names:
            run_doctor(inventory, [hosts[n]])
        serial.append(time.perf_counter() - started)
    o, p, q = (statistics.median(x) for x in (one, parallel, serial))
    print(f"in-process run_doctor, median of {rounds}: 1 host {o:.2f} s, 8 hosts in parallel {p:.2f} s "
          f"({p / o:.2f}x of 1 host), 8 hosts one after another {q:.2f} s ({q / p:.1f}x slower than parallel)")
    print(f"(this machine has {os.cpu_count()} cores shared by all 8 sandbox hosts' sshd and dockerd)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    from sparkctl.sandbox import cluster

    name = "bench-doctor"
    info = cluster.up_on_free_subnets(name, 8, cluster.subnet_pairs(201, 250))
    try:
        names = [h.name for h in info.hosts]
        sizes = (1, 4, 8)
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        time_doctor(info.inventory, names[:1])  # warm caches (python imports, host keys)
        for _ in range(args.rounds):  # interleaved, so machine noise hits every size alike
            for n in sizes:
                samples[n].append(time_doctor(info.inventory, names[:n]))
        base = statistics.median(samples[1])
        print(f"doctor wall time, median of {args.rounds} interleaved rounds (whole CLI process):")
        for n in sizes:
            med = statistics.median(samples[n])
            print(f"  {n} host(s): {med:.2f} s   ratio to 1 host: {med / base:.2f}x")
        in_process(info, names, args.rounds)
    finally:
        if not args.keep:
            cluster.down(name)


if __name__ == "__main__":
    main()
