"""The SGLang line's Engram row store, as the stand-in runs it: this rank's packed shards, checked.

The SGLang line's overlay (its ``engram_backend`` adapter, switched by ``OFFLOAD_MODE=nvme``) serves
Engram rows from ``$DSV41_PACKED_DIR/engram-l{L}-r{RANK}of{TP}.bin``: a 4,096-byte header of six
little-endian u64 (magic, layer, lo, hi, the layer's rows, record bytes), then per row the
``embed.weight`` bytes followed by the ``embed.scale`` bytes. The rows a rank owns are the engine's
hash-head split of the layer's table (primes above the vocab size, ``ceil(H / TP)`` heads a rank).

``attach`` opens every shard of this rank and refuses, naming the file, one that is missing, has
another header (layer, row range, table size, record size), another size, or rows that are not the
checkpoint's (first, middle and last record compared with ``$DSV41_SOURCE``'s tensors). ``RowStore``
then reads records by row id during serving, one ``pread`` each, as the real store does.

Standard library only: this file runs inside the image.
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import Dict, List, Optional, Tuple

MAGIC = 0x31344E4531565344
HEADER_BYTES = 4096
HEADER = struct.Struct("<6Q")


class EngramError(Exception):
    """A shard this rank cannot serve from (the engine exits 1 after logging it)."""


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def owned_rows(config: dict, tp: int, rank: int) -> Dict[int, Tuple[int, int, int]]:
    """Layer -> (lo, hi, total rows): the next unused prime >= vocab size per (layer, order, head),
    and rank r owning heads [r*k, min((r+1)*k, H)), k = ceil(H / TP)."""
    vocab, orders, heads = config["engram_vocab_size"], config["engram_max_ngram_size"] - 1, config["engram_n_heads"]
    last, out = None, {}
    per_rank = -(-orders * heads // tp)
    for layer in config["engram_layer_ids"]:
        sizes = []
        for _ in range(orders * heads):
            candidate = vocab if last is None else max(vocab, last + 1)
            while not _is_prime(candidate):
                candidate += 1
            sizes.append(candidate)
            last = candidate
        first, end = rank * per_rank, min((rank + 1) * per_rank, len(sizes))
        if first >= end:
            raise EngramError(f"Engram sharding leaves rank {rank} without hash heads: {len(sizes)} heads over TP={tp}")
        out[layer] = (sum(sizes[:first]), sum(sizes[:end]), sum(sizes))
    return out


def engram_section(config: dict) -> dict:
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) and "engram_layer_ids" in nested else config


class Table:
    """One layer's weight and scale tensors in the checkpoint: file, offsets, row widths."""

    def __init__(self, path: str, weight: dict, scale: dict, data_start: int):
        self.path = path
        self.weight_offset = data_start + weight["data_offsets"][0]
        self.scale_offset = data_start + scale["data_offsets"][0]
        self.weight_bytes = weight["shape"][1] if len(weight["shape"]) == 2 else 0
        self.scale_bytes = scale["shape"][1] if len(scale["shape"]) == 2 else 0

    def record(self, row: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.weight_offset + row * self.weight_bytes)
            weight = f.read(self.weight_bytes)
            f.seek(self.scale_offset + row * self.scale_bytes)
            return weight + f.read(self.scale_bytes)


def _header(path: str) -> Tuple[dict, int]:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length).decode("utf-8")), 8 + length


def find_table(source: str, layer: int) -> Table:
    """The layer's ``...layers.{L}.engram.embed.weight`` and ``.scale`` (the overlay requires both in one file)."""
    with open(os.path.join(source, "model.safetensors.index.json"), encoding="utf-8") as f:
        weight_map = json.load(f)["weight_map"]
    pattern = re.compile(r"(?:^|\.)layers\.%d\.engram\.embed\.(weight|scale)\Z" % layer)
    names = {m.group(1): name for name in weight_map for m in [pattern.search(name)] if m}
    if set(names) != {"weight", "scale"}:
        raise EngramError(f"{source}: no layers.{layer}.engram.embed.weight/.scale in the index")
    files = {weight_map[names["weight"]], weight_map[names["scale"]]}
    if len(files) != 1:
        raise EngramError(f"{source}: layer {layer}'s Engram weight and scale must share a safetensors file, "
                          f"found in {', '.join(sorted(files))}")
    path = os.path.join(source, files.pop())
    header, start = _header(path)
    return Table(path, header[names["weight"]], header[names["scale"]], start)


def check_shard(path: str, layer: int, lo: int, hi: int, total: int, table: Table) -> int:
    """Refuse what the real row store would not serve from; returns the shard's record size."""
    name = os.path.basename(path)
    record = table.weight_bytes + table.scale_bytes
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(HEADER.size)
    except OSError:
        raise EngramError(f"{name}: no such file in {os.path.dirname(path)} (write it with `sparkctl pack-engram`)") from None
    if len(raw) < HEADER.size or HEADER.unpack(raw)[0] != MAGIC:
        raise EngramError(f"{name}: not a packed Engram shard (no packed header; a vLLM-layout shard?)")
    got = HEADER.unpack(raw)[1:]
    want = (layer, lo, hi, total, record)
    if got != want:
        fields = ("layer", "lo", "hi", "rows", "record bytes")
        diff = ", ".join(f"{k} {g} (expected {w})" for k, g, w in zip(fields, got, want) if g != w)
        raise EngramError(f"{name}: header says {diff}")
    if size != HEADER_BYTES + (hi - lo) * record:
        raise EngramError(f"{name}: {size} bytes, a complete shard of rows [{lo}, {hi}) has {HEADER_BYTES + (hi - lo) * record}")
    with open(path, "rb") as f:
        for row in sorted({lo, (lo + hi) // 2, hi - 1}):
            f.seek(HEADER_BYTES + (row - lo) * record)
            if f.read(record) != table.record(row):
                raise EngramError(f"{name}: row {row} differs from the checkpoint's (weight bytes then scale bytes)")
    return record


class RowStore:
    """This rank's shards, open for reads by global row id (what a lookup does per token and head)."""

    def __init__(self, shards: Dict[int, Tuple[str, int, int, int]], packed_dir: str = ""):
        self.shards = shards  # layer -> (path, lo, hi, record bytes)
        self.packed_dir = packed_dir
        self.fds = {layer: os.open(path, os.O_RDONLY) for layer, (path, _, _, _) in shards.items()}
        self.reads = 0

    def lookup(self, tokens: int, seed: int) -> int:
        """What a forward pass asks of this rank's store: rows of every layer for (up to 32 of) the
        prompt's tokens, spread over the rank's range. Returns the rows read."""
        read = 0
        for layer, (_, lo, hi, _) in self.shards.items():
            for i in range(min(max(tokens, 1), 32)):
                self.read(layer, lo + (seed * 2654435761 + i * 40503) % (hi - lo))
                read += 1
        return read

    def describe(self) -> dict:
        return {"offload": "nvme", "packed_dir": self.packed_dir, "layers": sorted(self.shards),
                "rows": {str(layer): [lo, hi] for layer, (_, lo, hi, _) in sorted(self.shards.items())},
                "rows_read": self.reads}

    def read(self, layer: int, row: int) -> bytes:
        path, lo, hi, record = self.shards[layer]
        if not lo <= row < hi:
            raise EngramError(f"row {row} of layer {layer} is not this rank's ([{lo}, {hi}))")
        data = os.pread(self.fds[layer], record, HEADER_BYTES + (row - lo) * record)
        if len(data) != record:
            raise EngramError(f"{os.path.basename(path)}: row {row} is past the end of the file (truncated while serving?)")
        self.reads += 1
        return data


def attach(packed_dir: str, source: str, rank: int, tp: int, log=None) -> RowStore:
    """Open and check every shard of this rank; EngramError names the first one it cannot serve from."""
    try:
        with open(os.path.join(source, "config.json"), encoding="utf-8") as f:
            config = engram_section(json.load(f))
        rows = owned_rows(config, tp, rank)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise EngramError(f"cannot read the Engram settings of {source}/config.json ({err})") from None
    shards = {}
    for layer, (lo, hi, total) in rows.items():
        try:
            table = find_table(source, layer)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise EngramError(f"cannot read layer {layer}'s Engram tensors in {source} ({err})") from None
        path = os.path.join(packed_dir, f"engram-l{layer}-r{rank}of{tp}.bin")
        record = check_shard(path, layer, lo, hi, total, table)
        shards[layer] = (path, lo, hi, record)
        if log is not None:
            log("INFO", f"File-backed Engram layer={layer} rank={rank}/{tp} rows=[{lo},{hi}) record={record}B packed=True")
    return RowStore(shards, packed_dir)


def names_read(folder: str) -> List[str]:
    """The overlay switches an adapter folder's Python files read (quoted DSV41_* / OFFLOAD_MODE names)."""
    found = set()
    pattern = re.compile(r"[\"']((?:DSV41_[A-Z0-9_]+)|OFFLOAD_MODE)[\"']")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                found.update(pattern.findall(f.read()))
    return sorted(found)


def is_switch(name: str) -> bool:
    return name == "OFFLOAD_MODE" or name.startswith("DSV41_")


def overlay_folders(pythonpath: Optional[str]) -> List[str]:
    """The adapter folders on PYTHONPATH (those holding an ``engram_backend`` module), in order."""
    return [p for p in (pythonpath or "").split(os.pathsep) if p and os.path.isfile(os.path.join(p, "engram_backend.py"))]
