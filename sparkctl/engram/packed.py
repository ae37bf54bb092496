"""The SGLang line's packed Engram shard: one file per (layer, rank) that its NVMe row store reads.

The SGLang line's source (docs/sources.md) serves Engram rows from node-local files it writes with
its own packer, not from the checkpoint's two tensors: in the checkpoint a row's weight bytes and
its scale bytes sit in two tensors ~98 GB apart, so a miss would cost two reads. Its packer puts
them side by side, and its row store refuses a file whose header disagrees with the rows it owns.
The layout, as that packer writes it:

* name ``engram-l{LAYER}-r{RANK}of{TP}.bin`` (the same names as the vLLM shards: the TP size is in
  the name, so one directory can hold shards of several TP sizes);
* a 4,096-byte header: six little-endian unsigned 64-bit integers -- the magic
  ``0x31344E4531565344`` (on disk the 8 bytes ``DSV1EN41``), the layer id, the first row ``lo``,
  the end row ``hi`` (exclusive), the layer's total rows, and the record size -- then zeros;
* then one record per row ``lo .. hi-1``: the row's weight bytes (``embed.weight``, F8_E4M3)
  immediately followed by its scale bytes (``embed.scale``, F8_E8M0). At the published head
  dim 256 that is 256 + 8 = 264 bytes a record;
* ``[lo, hi)`` is the same hash-head split the vLLM layout uses (``sparkctl.engram.layout``), so
  file size = 4096 + (hi - lo) x record bytes.

Only the header is computed here; the records are interleaved while streaming, by
``hostside.packed_slots`` (stdlib only, it runs on the hosts too).
"""

from __future__ import annotations

import struct

from sparkctl.engram.safetensors_index import TensorInfo
from sparkctl.errors import ConfigError

LAYOUT = "sglang-packed"  # the spec/manifest's "layout"; the vLLM shard has none (tensor after tensor)
MAGIC = 0x31344E4531565344
HEADER_BYTES = 4096
HEADER_FIELDS = struct.Struct("<6Q")  # magic, layer, lo, hi, total rows, record bytes
WEIGHT_DTYPE, SCALE_DTYPE = "F8_E4M3", "F8_E8M0"


def header_bytes(layer: int, lo: int, hi: int, total_rows: int, record_bytes: int) -> bytes:
    """The 48 meaningful bytes of the header (the rest of its 4,096 bytes are zeros)."""
    return HEADER_FIELDS.pack(MAGIC, layer, lo, hi, total_rows, record_bytes)


def parse_header(data: bytes) -> dict:
    """The header's fields; ValueError when it is not a packed shard's header."""
    if len(data) < HEADER_FIELDS.size:
        raise ValueError(f"{len(data)} bytes, shorter than the {HEADER_FIELDS.size}-byte packed header")
    magic, layer, lo, hi, total, record = HEADER_FIELDS.unpack(data[:HEADER_FIELDS.size])
    if magic != MAGIC:
        raise ValueError(f"magic {magic:#018x}, not a packed Engram shard ({MAGIC:#018x})")
    return {"layer": layer, "lo": lo, "hi": hi, "rows": total, "record_bytes": record}


def table_pair(cut: list[TensorInfo], layer: int, config_file: str) -> tuple[TensorInfo, TensorInfo]:
    """The layer's weight table and its scales, checked as the source's packer checks them."""
    weight = next((t for t in cut if t.name.endswith("engram.embed.weight")), None)
    scale = next((t for t in cut if t.name.endswith("engram.embed.scale")), None)
    if weight is None or scale is None:
        missing = "engram.embed.weight" if weight is None else "engram.embed.scale"
        raise ConfigError(f"the SGLang packed layout needs layer {layer}'s {missing} (weight and scale rows go side "
                          "by side), and the checkpoint has none", file=config_file)
    for tensor, dtype in ((weight, WEIGHT_DTYPE), (scale, SCALE_DTYPE)):
        if tensor.dtype != dtype or len(tensor.shape) != 2:
            raise ConfigError(f"tensor {tensor.name} is {tensor.dtype} {list(tensor.shape)}; the SGLang packed layout "
                              f"takes a 2-D {dtype} tensor", file=tensor.file)
    return weight, scale
