#!/usr/bin/env python3
"""``distribute --from HOST``: host to host (the relay on HOST) against through this machine (``--via-here``).

One run on its own sandbox (4 hosts by default): the sandbox chain is built on spark-1's engine
with ``STANDIN_MB`` random bytes, then the two ways alternate (``--rounds`` each), the other hosts
emptied before every distribution. Measured per distribution: seconds, and the bytes that crossed
this machine -- the rx + tx counters of the sandbox's two bridge devices, which count only frames to
or from this machine's own stack (frames between two hosts are forwarded by the bridge and not
counted). In the sandbox every "host" shares this machine's CPUs, so the seconds say little about
a real cluster; the bytes are the point: with a laptop or bastion as the control machine, each one
crosses its uplink.

    python bench/distribute_from_host.py [--standin-mb 128] [--hosts 4] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from distribute_bench import TAG, empty_hosts, sandbox_up, say  # noqa: E402


def bridge_bytes(layout) -> int:
    total = 0
    for bridge in (layout.bridge_mgmt, layout.bridge_fabric):
        for counter in ("rx_bytes", "tx_bytes"):
            total += int(Path(f"/sys/class/net/{bridge}/statistics/{counter}").read_text())
    return total


def distribute(inventory, layout, workers, via_here: bool) -> dict:
    from sparkctl.ops.distribute import DistributeOptions, run_distribute
    from sparkctl.output import Output

    empty_hosts(layout, workers)
    before = bridge_bytes(layout)
    started = time.monotonic()
    report = run_distribute(inventory, DistributeOptions(tag=TAG, hosts=["spark-1", *workers], source="spark-1",
                                                         via_here=via_here, retries=0), Output())
    seconds = time.monotonic() - started
    crossed = bridge_bytes(layout) - before
    failed = [h for h in report.hosts if h.status == "failed"]
    if failed:
        raise RuntimeError(f"distribution failed: {[(h.name, h.error) for h in failed]}")
    return {"seconds": seconds, "crossed_this_machine": crossed, "sent_to_hosts": sum(h.bytes_sent for h in report.hosts)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--standin-mb", type=int, default=128)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="leave the sandbox running")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (the sandbox)")

    from sparkctl.config.inventory import load_inventory
    from sparkctl.images.chain import load_chain
    from sparkctl.images.engine import DockerPyEngine
    from sparkctl.images.plan import plan_build
    from sparkctl.ops.build import BuildOptions, run_build
    from sparkctl.output import Output
    from sparkctl.sandbox import cluster

    work = Path(tempfile.mkdtemp(prefix="sparkctl-bench-from-"))
    root = str(work / "state")
    try:
        layout = sandbox_up(args.hosts, root)
        inventory = load_inventory(layout.inventory)
        workers = [h.name for h in inventory.hosts if h.name != "spark-1"]
        say(f"building the sandbox chain on spark-1 with STANDIN_MB={args.standin_mb} ...")
        plan = plan_build(load_chain(str(REPO / "images" / "sandbox")), build_args={"STANDIN_MB": str(args.standin_mb)})
        with DockerPyEngine(f"unix://{layout.host('spark-1').docker_socket}") as engine:
            built = run_build(plan, engine, BuildOptions(), Output())
        if not built.ok:
            raise RuntimeError(f"build failed: {built.errors}")
        runs: dict[str, list[dict]] = {"via_here": [], "host_to_host": []}
        for round_ in range(args.rounds):
            for name, via_here in (("via_here", True), ("host_to_host", False)):
                row = distribute(inventory, layout, workers, via_here)
                runs[name].append(row)
                say(f"round {round_ + 1} {name}: {row['seconds']:.2f}s, {row['crossed_this_machine'] / 1048576:.1f} MiB "
                    f"crossed this machine, {row['sent_to_hosts'] / 1048576:.1f} MiB sent to the hosts")
        median = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]} for name, rows in runs.items()}
        results = {
            "standin_mb": args.standin_mb, "workers": len(workers), "runs": runs, "median": median,
            "ratios": {
                "bytes_crossing_here_via_here_over_host_to_host": round(
                    median["via_here"]["crossed_this_machine"] / max(1, median["host_to_host"]["crossed_this_machine"]), 1),
                "seconds_via_here_over_host_to_host": round(
                    median["via_here"]["seconds"] / median["host_to_host"]["seconds"], 2),
            },
        }
        if args.json:
            print(json.dumps(results, indent=2))
        else:
            for name, m in median.items():
                print(f"{name:<13} {m['seconds']:6.2f} s   {m['crossed_this_machine'] / 1048576:8.1f} MiB crossed this machine")
            for key, value in results["ratios"].items():
                print(f"{key}: {value}")
        return 0
    finally:
        if not args.keep:
            os.environ["SPARKCTL_SANDBOX_ROOT"] = root
            cluster.down("bench")
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
