"""Shards: which byte ranges of which safetensors files make each rank's file, and how to write them.

A shard ``engram-l{LAYER}-r{RANK}of{TP}.bin`` holds the rank's rows of every tensor of the layer
whose first dimension is the layer's row count (the fp8 table, its ue8m0 scales, ...), row-major,
tensor after tensor: the table first, then the others by name. Row-major storage makes each
tensor's slice one contiguous byte range of its source file, so a shard is a short list of
``(file, offset, length)`` pieces and is streamed, never loaded.

Next to it, ``engram-l{LAYER}-r{RANK}of{TP}.json`` (the manifest) records the source tensors,
dtypes, shapes, row range, each tensor's offset in the shard, the shard's size and its xxh3-128
(plus a sha256 when the host that keeps it has no xxhash module to re-check xxh3 with; see
``hostside``). The manifest is written last: a shard with a manifest is complete. Nothing
half-written ever carries the final name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from sparkctl.engram import hostside, packed
from sparkctl.engram.layout import EngramLayout, shard_name
from sparkctl.engram.safetensors_index import CheckpointTensors, SourceFile, TensorInfo, engram_tensor_pattern
from sparkctl.errors import ConfigError, OperationFailed

CHUNK_BYTES = 8 * 1024 * 1024  # bounded reads: memory stays flat however large the table
MANIFEST_FORMAT = "sparkctl-engram-shard/1"


@dataclass(frozen=True)
class ShardPiece:
    """One tensor's rows inside a shard: bytes ``[source_offset, source_offset + length)`` of ``source_file``."""

    tensor: str
    dtype: str
    source_file: str
    source_shape: tuple[int, ...]
    source_offset: int
    length: int
    offset: int  # where the piece starts in the shard file
    row_start: int
    row_end: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.row_end - self.row_start,) + self.source_shape[1:]


@dataclass(frozen=True)
class ShardPlan:
    layer: int
    rank: int
    tp: int
    row_start: int
    row_end: int
    first_head: int
    end_head: int
    pieces: tuple[ShardPiece, ...]
    root: str = ""  # the checkpoint folder the source files are in
    sources: tuple[SourceFile, ...] = ()
    # "tensors": the vLLM shard (each tensor's rows, tensor after tensor); packed.LAYOUT: the SGLang
    # line's file (a header, then each row's weight and scale bytes side by side).
    layout: str = "tensors"
    total_rows: int = 0  # the layer's rows (the packed header records it)

    @property
    def name(self) -> str:
        return shard_name(self.layer, self.rank, self.tp)

    @property
    def manifest_name(self) -> str:
        return self.name[: -len(".bin")] + ".json"

    @property
    def is_packed(self) -> bool:
        return self.layout == packed.LAYOUT

    @property
    def record_bytes(self) -> int:
        """Bytes of one row in the packed file (its weight and scale bytes together)."""
        rows = self.row_end - self.row_start
        return sum(p.length for p in self.pieces) // rows if rows else 0

    @property
    def size(self) -> int:
        data = sum(p.length for p in self.pieces)
        return packed.HEADER_BYTES + data if self.is_packed else data

    def _rel(self, path: str) -> str:
        root = self.root.rstrip("/")
        return path[len(root) + 1:] if root and path.startswith(root + "/") else path

    def spec(self) -> dict:
        """What the shard is made of, with source files relative to the checkpoint folder: the
        manifest without its hashes. Identical specs make identical bytes."""
        doc = self._tensor_spec()
        if self.is_packed:
            # The hosts interleave the records from this (hostside.packed_slots); the vLLM spec
            # keeps its old shape, so manifests written before stay valid.
            rows = self.row_end - self.row_start
            doc.update(layout=packed.LAYOUT, header_bytes=packed.HEADER_BYTES, record_bytes=self.record_bytes,
                       header=packed.header_bytes(self.layer, self.row_start, self.row_end, self.total_rows,
                                                  self.record_bytes).hex())
            for entry in doc["tensors"]:
                entry["row_bytes"] = entry["nbytes"] // rows if rows else 0
        return doc

    def _tensor_spec(self) -> dict:
        return {
            "format": MANIFEST_FORMAT,
            "file": self.name,
            "layer": self.layer,
            "rank": self.rank,
            "tp": self.tp,
            "rows": [self.row_start, self.row_end],
            "heads": [self.first_head, self.end_head],
            "size": self.size,
            "tensors": [
                {
                    "name": p.tensor,
                    "dtype": p.dtype,
                    "shape": list(p.shape),
                    "source_shape": list(p.source_shape),
                    "source_file": self._rel(p.source_file),
                    "source_offset": p.source_offset,
                    "offset": p.offset,
                    "nbytes": p.length,
                }
                for p in self.pieces
            ],
            "sources": {self._rel(f.path): f.identity() for f in self.sources},
        }


def layer_tensors(tensors: dict[str, TensorInfo], layer: int, rows: int, config_file: str) -> list[TensorInfo]:
    """The tensors of an Engram layer that are cut by rows, table first. Refuses a checkpoint whose
    tensors disagree with the config's row count."""
    pattern = engram_tensor_pattern(layer)
    mine = [t for t in tensors.values() if pattern.search(t.name)]
    tables = [t for t in mine if t.name.endswith("engram.embed.weight")]
    if not tables:
        raise ConfigError(f"the checkpoint has no Engram table for layer {layer} (no tensor named *layers.{layer}.engram.embed.weight)", file=config_file)
    for t in mine:
        if ".engram.embed." in t.name and t.rows != rows:
            raise ConfigError(
                f"tensor {t.name} has {t.rows} rows but the config's layout gives layer {layer} {rows} rows "
                f"(config and tensors disagree; wrong config.json for these files?)",
                file=t.file,
            )
    cut = [t for t in mine if t.shape and t.rows == rows]
    cut.sort(key=lambda t: (not t.name.endswith("engram.embed.weight"), t.name))
    return cut


def plan_shards(layout: EngramLayout, checkpoint: CheckpointTensors, root: str, config_file: str = "config.json",
                shard_layout: str = "tensors") -> list[ShardPlan]:
    """Every (layer, rank) shard: byte ranges per tensor, in shard order. ``shard_layout``:
    "tensors" (vLLM) or ``packed.LAYOUT`` (SGLang: weight and scale only, side by side per row)."""
    plans = []
    for layer in layout.layers:
        cut = layer_tensors(checkpoint.tensors, layer.layer, layer.rows, config_file)
        if shard_layout == packed.LAYOUT:
            cut = list(packed.table_pair(cut, layer.layer, config_file))
        files = tuple(checkpoint.files[f] for f in sorted({t.file for t in cut}))
        for rank, rows in enumerate(layer.ranks):
            pieces, offset = [], 0
            for t in cut:
                row_bytes = t.row_bytes
                length = rows.rows * row_bytes
                pieces.append(ShardPiece(
                    tensor=t.name, dtype=t.dtype, source_file=t.file, source_shape=t.shape,
                    source_offset=t.start + rows.start * row_bytes, length=length, offset=offset,
                    row_start=rows.start, row_end=rows.end,
                ))
                # tensors: where the piece starts in the shard; packed: where in each record
                offset += row_bytes if shard_layout == packed.LAYOUT else length
            plans.append(ShardPlan(layer.layer, rank, layout.tp, rows.start, rows.end, rows.first_head,
                                   rows.end_head, tuple(pieces), root=root, sources=files,
                                   layout=shard_layout, total_rows=layer.rows))
    return plans


def cut_shard(plan: ShardPlan, dest: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Write one shard and its manifest into ``dest`` from the local checkpoint (streamed,
    ``chunk_bytes`` at a time). Returns {file, bytes, seconds, sha256, xxh3_128}."""
    try:
        hostside.check_sources(plan.root, plan.spec()["sources"])
        return hostside.cut_one(plan.root, os.fspath(dest), plan.spec(), chunk_bytes)
    except hostside.HostError as err:
        raise OperationFailed(f"{plan.name}: {err}") from None


def read_manifest(dest: str | os.PathLike, plan: ShardPlan) -> dict | None:
    path = Path(dest) / plan.manifest_name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class ShardStream:
    """The bytes a host's ``receive`` expects for one shard: [offset, size) of the shard, then an
    8-byte length and a JSON trailer with the xxh3-128 (and, for a host without xxhash, sha256)
    of the *whole* shard (the prefix a resume skips is read from the local sources and hashed,
    not sent)."""

    def __init__(self, plan: ShardPlan, offset: int = 0, chunk_bytes: int = CHUNK_BYTES, sha256: bool = False):
        # sha256 as well as xxh3 when the receiving host cannot compute xxh3 (no xxhash there).
        self.plan, self.offset, self.chunk_bytes, self.sha256 = plan, offset, chunk_bytes, sha256
        self.digests: dict | None = None
        self.payload_bytes = 0

    def __iter__(self) -> Iterator[memoryview]:
        """Chunks are views of reused buffers: each is valid until the next one is requested
        (the remote layer sends a chunk completely before asking for the next)."""
        spec = self.plan.spec()
        digests = hostside.Digests(xxh3=True, sha256=self.sha256)
        if self.offset:
            hostside.hash_ranges(self.plan.root, spec, digests, 0, self.offset, self.chunk_bytes)
        hasher = hostside.BackgroundDigests(digests)
        ring = hostside.Ring(4, self.chunk_bytes)
        previous = None
        try:
            for slot in hostside.prefetch(hostside.shard_slots(self.plan.root, spec, ring, 2, self.offset, None)):
                if previous is not None:
                    previous.release()
                hasher.feed(slot)
                previous = slot
                self.payload_bytes += slot.n
                yield slot.view
            if previous is not None:
                previous.release()
                previous = None
        except BaseException:
            ring.close()
            raise
        finally:
            hasher.close()
        self.digests = hasher.result()
        trailer = json.dumps(self.digests).encode()
        yield hostside.TRAILER_LEN.pack(len(trailer)) + trailer
