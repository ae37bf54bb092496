#!/usr/bin/env python3
"""``model sync`` to 1 vs N receivers, against a plain ``rsync``-from-one-source loop, in one run.

One sandbox of its own (``--hosts``, default 3), one synthetic checkpoint on this machine
(``--vocab`` sets its size; the default makes about 250 MiB). For N = 1 and N = all hosts, each
receiver's copy is emptied, then:

* ``model sync`` (in-process, ``sparkctl.ops.model_sync.run_sync``): every receiver at once, each
  file verified on arrival (hash of the whole file) and by the check before;
* the loop: ``rsync -a`` over ``ssh`` (the same identity and known_hosts), one host after the other,
  as one would script it by hand.

Then a rerun of each with nothing to send: ``model sync`` re-hashes every file on every host (it
trusts nothing), ``rsync`` compares sizes and times only.

Printed: seconds and bytes per receiver, and the ratios. Every "host" of the sandbox shares this
machine's CPUs and disk, so N receivers cost the machine N times the ssh decryption and the disk
writes: the ratio between the two ways is the point, not the absolute seconds.

    python bench/model_sync.py [--hosts 3] [--vocab 80000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from distribute_bench import sandbox_up, say  # noqa: E402


def copy_dir(host, model_dir: str) -> Path:
    return Path(host.nvme_dir) / Path(model_dir).relative_to("/mnt/nvme")


def empty(layout, names, model_dir: str) -> None:
    for host in layout.hosts:
        if host.name in names:
            shutil.rmtree(copy_dir(host, model_dir), ignore_errors=True)


def model_sync(inventory, source: str, names: list[str]) -> tuple[float, dict]:
    from sparkctl.ops.model_sync import SyncOptions, run_sync

    started = time.monotonic()
    report = run_sync(inventory, SyncOptions(source=source, hosts=names, retries=0))
    seconds = time.monotonic() - started
    failed = [(h.name, h.error) for h in report.hosts if h.status == "failed"]
    if failed:
        raise RuntimeError(f"model sync failed: {failed}")
    return seconds, {h.name: h.bytes_sent for h in report.hosts}


def rsync_loop(inventory, source: str, names: list[str], model_dir: str) -> tuple[float, dict]:
    from sparkctl.remote.openssh import Route, client_argv as openssh_argv

    by_name = {h.name: h for h in inventory.hosts}
    sent = {}
    started = time.monotonic()
    for name in names:
        target = inventory.ssh_target(by_name[name])
        argv = openssh_argv(Route(name, target, target.address), ["true"])
        ssh = shlex.join(argv[:argv.index("--")])  # the same ssh options, without the address and command
        subprocess.run(["ssh", *argv[1:argv.index("--")], "--", target.address, f"mkdir -p {shlex.quote(model_dir)}"],
                       check=True, capture_output=True)
        proc = subprocess.run(["rsync", "-a", "--stats", "-e", ssh, source.rstrip("/") + "/",
                               f"{target.address}:{model_dir}/"], check=True, capture_output=True, text=True)
        match = re.search(r"Total bytes sent: ([\d,.]+)", proc.stdout)
        sent[name] = int(re.sub(r"[,.]", "", match.group(1))) if match else -1
    return time.monotonic() - started, sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=80000, help="engram_vocab_size of the synthetic checkpoint")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        say("needs root (the sandbox)")
        return 2
    if not shutil.which("rsync"):
        say("needs rsync on this machine (apt-get install rsync)")
        return 2
    from sparkctl.config.inventory import load_inventory
    from sparkctl.engram.checkpoint_maker import make_checkpoint
    from sparkctl.sandbox import cluster

    root = tempfile.mkdtemp(prefix="sparkctl-bench-sync-")
    layout = None
    try:
        layout = sandbox_up(args.hosts, root)
        inventory = load_inventory(layout.inventory)
        model_dir = inventory.model.paths.model_dir
        source = str(Path(root) / "checkpoint")
        made = make_checkpoint(source, vocab_size=args.vocab, files=4, seed=7)
        size = sum(p.stat().st_size for p in Path(source).iterdir())
        say(f"checkpoint: {len(made.files)} safetensors files, {size / 1048576:.1f} MiB; {args.hosts} sandbox hosts")
        names = [h.name for h in inventory.hosts]
        rows = []
        for n in sorted({1, len(names)}):
            chosen = names[:n]
            empty(layout, names, model_dir)
            sync_s, sync_bytes = model_sync(inventory, source, chosen)
            rerun_s, rerun_bytes = model_sync(inventory, source, chosen)
            empty(layout, names, model_dir)
            loop_s, loop_bytes = rsync_loop(inventory, source, chosen, model_dir)
            loop_rerun_s, loop_rerun_bytes = rsync_loop(inventory, source, chosen, model_dir)
            rows.append({"receivers": n, "model_sync_s": round(sync_s, 2), "rsync_loop_s": round(loop_s, 2),
                         "model_sync_bytes_per_receiver": sync_bytes, "rsync_bytes_per_receiver": loop_bytes,
                         "rerun_model_sync_s": round(rerun_s, 2), "rerun_model_sync_bytes": sum(rerun_bytes.values()),
                         "rerun_rsync_s": round(loop_rerun_s, 2), "rerun_rsync_bytes": sum(loop_rerun_bytes.values())})
            say(f"N={n}: model sync {sync_s:.2f}s, rsync loop {loop_s:.2f}s; rerun {rerun_s:.2f}s vs {loop_rerun_s:.2f}s")
        doc = {"checkpoint_bytes": size, "hosts": args.hosts, "rows": rows}
        one, many = rows[0], rows[-1]
        doc["ratios"] = {
            "model_sync_N_over_1": round(many["model_sync_s"] / one["model_sync_s"], 2),
            "rsync_loop_N_over_1": round(many["rsync_loop_s"] / one["rsync_loop_s"], 2),
            "rsync_loop_over_model_sync_at_N": round(many["rsync_loop_s"] / many["model_sync_s"], 2),
        }
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            print(f"checkpoint {size / 1048576:.1f} MiB, {args.hosts} sandbox hosts sharing this machine")
            print(f"{'N':>2} {'model sync':>11} {'rsync loop':>11} {'MiB/receiver (sync, rsync)':>28} "
                  f"{'rerun sync':>11} {'rerun rsync':>12}")
            for row in rows:
                per_sync = max(row["model_sync_bytes_per_receiver"].values()) / 1048576
                per_rsync = max(row["rsync_bytes_per_receiver"].values()) / 1048576
                print(f"{row['receivers']:>2} {row['model_sync_s']:>10.2f}s {row['rsync_loop_s']:>10.2f}s "
                      f"{per_sync:>14.1f} {per_rsync:>13.1f} {row['rerun_model_sync_s']:>10.2f}s {row['rerun_rsync_s']:>11.2f}s")
            print("ratios: " + ", ".join(f"{k} {v}" for k, v in doc["ratios"].items()))
        return 0
    finally:
        if layout is not None:
            cluster.down(layout.name)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
