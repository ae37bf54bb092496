#!/usr/bin/env python3
"""The bulk stream's transport: paramiko's channel against the system OpenSSH client, one host.

Streams the same bytes (``--mib``, default 512 MiB, in 1 MiB chunks) to ``cat > /dev/null`` on a
host, alternating paramiko (sparkctl.remote.Connection.run_stream_in) and ``ssh`` (the argv
sparkctl.ops.distribute builds: the inventory's identity and known_hosts, StrictHostKeyChecking=yes),
connection set-up included in both because a distribution pays it too. Prints MiB/s per transport
and the OpenSSH/paramiko ratio (medians of ``--repeats`` alternating pairs).

    python bench/distribute_transport.py -i INVENTORY [--host NAME] [--mib 512] [--repeats 3] [--json]

``bench/distribute_bench.py`` runs this on its own sandbox as part of its one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MIB = 1024 * 1024
SINK = ["sh", "-c", "cat > /dev/null"]


_BLOCK = os.urandom(MIB)  # made once: generating bytes must not be what is measured


def _payload(total_mib: int):
    return (_BLOCK for _ in range(total_mib))


def paramiko_seconds(target, total_mib: int) -> float:
    from sparkctl.remote.connection import Connection

    started = time.monotonic()
    with Connection(target) as connection:
        result = connection.run_stream_in(SINK, _payload(total_mib))
    seconds = time.monotonic() - started
    if result.exit_code != 0 or result.bytes_sent != total_mib * MIB:
        raise RuntimeError(f"paramiko stream failed: exit {result.exit_code}, {result.bytes_sent} bytes")
    return seconds


def openssh_seconds(target, total_mib: int) -> float:
    from sparkctl.remote.openssh import Route, client_argv as openssh_argv

    argv = openssh_argv(Route(target.name, target, target.address), SINK)
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, bufsize=0)
    for block in _payload(total_mib):
        view = memoryview(block)
        while view:
            view = view[proc.stdin.write(view):]
    proc.stdin.close()
    code = proc.wait()
    seconds = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"ssh stream failed (exit {code}): {proc.stderr.read().decode(errors='replace')}")
    return seconds


def measure(target, total_mib: int = 512, repeats: int = 3) -> dict:
    paramiko_runs, openssh_runs = [], []
    paramiko_seconds(target, 16)  # warm both paths (page cache, sshd forks) untimed
    openssh_seconds(target, 16)
    for _ in range(repeats):
        openssh_runs.append(openssh_seconds(target, total_mib))
        paramiko_runs.append(paramiko_seconds(target, total_mib))
    p, o = statistics.median(paramiko_runs), statistics.median(openssh_runs)
    return {
        "host": target.name,
        "mib": total_mib,
        "repeats": repeats,
        "paramiko_mib_s": round(total_mib / p, 1),
        "openssh_mib_s": round(total_mib / o, 1),
        "openssh_over_paramiko": round(p / o, 2),
        "paramiko_runs_s": [round(x, 3) for x in paramiko_runs],
        "openssh_runs_s": [round(x, 3) for x in openssh_runs],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--host", help="default: the first worker")
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from sparkctl.config.inventory import load_inventory

    inventory = load_inventory(args.inventory)
    hosts = inventory.hosts
    host = next((h for h in hosts if h.name == args.host), None) if args.host else next((h for h in hosts if not h.is_head), hosts[0])
    if host is None:
        parser.error(f"no host {args.host!r} in the inventory")
    result = measure(inventory.ssh_target(host), args.mib, args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['mib']} MiB to {host.name}, median of {result['repeats']}: paramiko {result['paramiko_mib_s']} MiB/s, "
              f"OpenSSH {result['openssh_mib_s']} MiB/s -> OpenSSH/paramiko = {result['openssh_over_paramiko']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
