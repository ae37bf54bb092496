#!/usr/bin/env python3
"""Engram packing: throughput against a plain copy, and peak memory against table size.

One run prints, as ratios (these machines are noisy; ratios from one run are what to compare):

1. pack / copy throughput: cutting every rank's shards of a synthetic checkpoint (``cut_shard``,
   the code that runs on the control machine and, as ``python3 -c``, on each host) against a plain
   sequential copy of the same number of bytes, read/write with the same 8 MiB buffer plus fsync,
   from the same source files to the same disk. Both start cold: the source and destination pages
   are evicted (posix_fadvise DONTNEED) before every timed run, one untimed pair runs first, and
   the timed runs alternate copy, pack, copy, pack, ... so drift hits both; the figure is the
   median of the per-pair ratios. Goal: >= 0.9.
2. peak RSS of a process packing a table 4x larger than another (the child's VmHWM). Goal:
   flat (ratio ~1.0), because the tables are streamed in bounded chunks, never loaded.

    python bench/engram_pack.py [--dir /mnt/nvme/tmp] [--vocab 25000] [--head-dim 256] [--tp 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CHUNK = 8 * 1024 * 1024


def plan(checkpoint: Path, tp: int):
    from sparkctl.engram.config import load_engram_config
    from sparkctl.engram.layout import plan_layout
    from sparkctl.engram.safetensors_index import is_engram_tensor, load_tensors
    from sparkctl.engram.shards import plan_shards

    config = load_engram_config(checkpoint)
    tensors = load_tensors(checkpoint, lambda n: is_engram_tensor(n, config.layer_ids))
    return plan_shards(plan_layout(config, tp), tensors, str(checkpoint.resolve()), config.source)


def evict(paths) -> None:
    """Drop these files' pages from the page cache (only clean pages go: callers fsync first)."""
    for path in paths:
        path = Path(path)
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path] if path.exists() else []
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def sources(checkpoint: Path) -> list[Path]:
    return sorted(checkpoint.glob("*.safetensors"))


def run_pack(checkpoint: Path, out: Path, tp: int) -> tuple[int, float]:
    from sparkctl.engram.shards import cut_shard

    shards = plan(checkpoint, tp)
    shutil.rmtree(out, ignore_errors=True)
    evict(sources(checkpoint))
    started = time.perf_counter()
    for shard in shards:
        cut_shard(shard, out, chunk_bytes=CHUNK)
    seconds = time.perf_counter() - started
    return sum(s.size for s in shards), seconds


def run_copy(checkpoint: Path, out: Path, nbytes: int) -> tuple[int, float]:
    """The same number of bytes, read sequentially from the same files, written to one file, fsynced."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    evict(sources(checkpoint))
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    started = time.perf_counter()
    remaining = nbytes
    with open(out / "copy.bin", "wb", buffering=0) as dst:
        for path in sources(checkpoint):
            with open(path, "rb", buffering=0) as src:
                while remaining:
                    got = src.readinto(view[: min(CHUNK, remaining)])
                    if not got:
                        break
                    written = 0
                    while written < got:
                        written += dst.write(view[written:got])
                    remaining -= got
            if not remaining:
                break
        os.fsync(dst.fileno())
    seconds = time.perf_counter() - started
    if remaining:
        raise SystemExit(f"the checkpoint holds fewer than {nbytes} bytes to copy")
    return nbytes, seconds


def peak_rss_kib(argv: list[str]) -> int:
    """The child's own high-water mark (VmHWM, reset by exec), printed by the child as it ends.
    (ru_maxrss from wait4 would also count the parent's pages the fork carried before exec.)"""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
    return int(proc.stdout.strip().splitlines()[-1])


def vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(args) -> None:
    """--child CKPT OUT TP: pack and exit (measured from outside). TP 0: import only (the floor)."""
    checkpoint, out, tp = Path(args.child[0]), Path(args.child[1]), int(args.child[2])
    from sparkctl.engram import hostside, shards  # noqa: F401  (the same imports in both cases)

    if tp:
        for shard in plan(checkpoint, tp):
            shards.cut_shard(shard, out, chunk_bytes=CHUNK)
    print(vm_hwm_kib())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="Work folder on the disk to measure (default: the temp dir).")
    parser.add_argument("--vocab", type=int, default=25000, help="engram_vocab_size of the small table (the large one is 4x).")
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="Print the figures as one JSON document.")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from sparkctl.engram.checkpoint_maker import make_checkpoint

    work = Path(tempfile.mkdtemp(prefix="engram-bench-", dir=args.dir))
    try:
        small, large = work / "small", work / "large"
        log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        log(f"writing synthetic checkpoints in {work} ...")
        made_small = make_checkpoint(small, vocab_size=args.vocab, head_dim=args.head_dim, files=3)
        made_large = make_checkpoint(large, vocab_size=4 * args.vocab, head_dim=args.head_dim, files=3)
        rows_small, rows_large = sum(made_small.rows.values()), sum(made_large.rows.values())

        # 1. Throughput on the large checkpoint, alternating copy and pack.
        packs, copies = [], []
        nbytes = sum(s.size for s in plan(large, args.tp))
        # One untimed pair first: the disk settles the checkpoint writes, both paths are warm in code.
        run_copy(large, work / "copy", nbytes)
        run_pack(large, work / "pack", args.tp)
        for i in range(args.repeats):
            _, t_copy = run_copy(large, work / "copy", nbytes)
            copies.append(nbytes / t_copy)
            _, t_pack = run_pack(large, work / "pack", args.tp)
            packs.append(nbytes / t_pack)
            log(f"  run {i + 1}: copy {nbytes / t_copy / 2**20:.0f} MiB/s, pack {nbytes / t_pack / 2**20:.0f} MiB/s")
        shutil.rmtree(work / "copy", ignore_errors=True)
        ratios = [p / c for p, c in zip(packs, copies)]

        # 2. Peak RSS for two table sizes 4x apart (and the import-only floor).
        me = [sys.executable, str(Path(__file__).resolve()), "--child"]
        floor = peak_rss_kib(me + [str(small), str(work / "rss"), "0"])
        rss_small = peak_rss_kib(me + [str(small), str(work / "rss-s"), str(args.tp)])
        rss_large = peak_rss_kib(me + [str(large), str(work / "rss-l"), str(args.tp)])

        figures = {
            "disk_dir": str(work),
            "shard_bytes": nbytes,
            "tp": args.tp,
            "copy_mib_s": [round(c / 2**20, 1) for c in copies],
            "pack_mib_s": [round(p / 2**20, 1) for p in packs],
            "pack_over_copy": [round(r, 3) for r in ratios],
            "pack_over_copy_median": round(statistics.median(ratios), 3),
            "table_rows": {"small": rows_small, "large": rows_large, "ratio": round(rows_large / rows_small, 2)},
            "peak_rss_kib": {"import_only": floor, "small": rss_small, "large": rss_large},
            "peak_rss_large_over_small": round(rss_large / rss_small, 3),
        }
        if args.json:
            print(json.dumps(figures, indent=2))
        else:
            print(f"pack vs plain copy, {nbytes / 2**30:.2f} GiB of TP{args.tp} shards, cold cache, {args.repeats} alternating runs:")
            print(f"  copy  MiB/s: {', '.join(f'{c / 2**20:.0f}' for c in copies)}")
            print(f"  pack  MiB/s: {', '.join(f'{p / 2**20:.0f}' for p in packs)}")
            print(f"  pack/copy:   {', '.join(f'{r:.2f}' for r in ratios)}  (median {statistics.median(ratios):.2f}; goal >= 0.9)")
            print(f"peak RSS, tables of {rows_small} vs {rows_large} rows ({rows_large / rows_small:.2f}x):")
            print(f"  import only {floor / 1024:.1f} MiB, small {rss_small / 1024:.1f} MiB, large {rss_large / 1024:.1f} MiB")
            print(f"  large/small: {rss_large / rss_small:.3f}  (goal: flat, ~1.0)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
