"""Where each tensor's bytes are: ``model.safetensors.index.json`` plus each file's own header.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``), then the data;
offsets are relative to the first byte after the header. We parse the header ourselves because
the safetensors API hands out tensors, not byte offsets, and we never want a table in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sparkctl.engram.hostside import sample_sha256
from sparkctl.errors import ConfigError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit

# Bits per element of every dtype the format defines (sub-byte floats included).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: its file, dtype, shape and absolute byte range ``[start, end)`` in that file."""

    name: str
    file: str  # path as given (absolute for local checkpoints, host-side for on-hosts)
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        """Bytes of one first-dimension slice (row-major storage makes a row range one byte range)."""
        per_row = 1
        for dim in self.shape[1:]:
            per_row *= dim
        bits = per_row * DTYPE_BITS[self.dtype]
        if bits % 8:
            raise ConfigError(f"tensor {self.name}: a row of {per_row} {self.dtype} values is not a whole number of bytes", file=self.file)
        return bits // 8


def header_length(prefix: bytes, file: str, file_size: int) -> int:
    if len(prefix) < 8 or file_size < 8:
        raise ConfigError("not a safetensors file (shorter than its 8-byte header length)", file=file)
    (length,) = struct.unpack("<Q", prefix[:8])
    if length > MAX_HEADER_BYTES or 8 + length > file_size:
        raise ConfigError(f"not a safetensors file (header length {length} does not fit a {file_size}-byte file)", file=file)
    return length


def parse_header(header: bytes, file: str, file_size: int) -> dict[str, TensorInfo]:
    """Tensors of one file from its JSON header; checks every range against dtype, shape and file size."""
    try:
        data = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"safetensors header is not valid JSON ({err})", file=file) from None
    except RecursionError:  # a real header is one level of tensor entries
        raise ConfigError("safetensors header is nested too deeply", file=file) from None
    if not isinstance(data, dict):
        raise ConfigError("safetensors header is not a JSON object", file=file)
    base = 8 + len(header)
    out: dict[str, TensorInfo] = {}
    for name, entry in data.items():
        if name == "__metadata__":
            continue
        try:
            dtype = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(v) for v in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"tensor {name}: header entry lacks dtype/shape/data_offsets", file=file) from None
        if dtype not in DTYPE_BITS:
            raise ConfigError(f"tensor {name}: unknown dtype {dtype!r}", file=file)
        if any(d < 0 for d in shape) or not 0 <= begin <= end:
            raise ConfigError(f"tensor {name}: bad shape {list(shape)} or offsets [{begin}, {end}]", file=file)
        count = 1
        for d in shape:
            count *= d
        expected = (count * DTYPE_BITS[dtype] + 7) // 8
        if end - begin != expected:
            raise ConfigError(
                f"tensor {name}: {end - begin} bytes stored for shape {list(shape)} {dtype} ({expected} expected)", file=file
            )
        if base + end > file_size:
            raise ConfigError(f"tensor {name}: data ends at byte {base + end}, past the end of the file ({file_size} bytes); truncated download?", file=file)
        out[name] = TensorInfo(name=name, file=file, dtype=dtype, shape=shape, start=base + begin, end=base + end)
    return out


@dataclass(frozen=True)
class SourceFile:
    """A safetensors file's identity for a plan: a host's copy must have the same size and header."""

    path: str
    size: int
    header_sha256: str
    sample_sha256: str  # sampled tensor bytes (sparkctl.engram.hostside.sample_sha256)

    def identity(self) -> dict:
        """What a shard's spec records of this file (and a host's copy must match)."""
        return {"size": self.size, "header_sha256": self.header_sha256, "sample_sha256": self.sample_sha256}


def read_header(path: str | Path) -> tuple[dict[str, TensorInfo], SourceFile]:
    path = str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            length = header_length(f.read(8), path, size)
            header = f.read(length)
            tensors = parse_header(header, path, size)
            sample = sample_sha256(f, 8 + length, size)
    except FileNotFoundError:
        raise ConfigError("safetensors file not found", file=path) from None
    return tensors, SourceFile(path, size, hashlib.sha256(header).hexdigest(), sample)


def header_from_bytes(path: str, prefix: bytes, header: bytes, size: int, sample: str) -> tuple[dict[str, TensorInfo], SourceFile]:
    """The same as ``read_header`` for bytes read elsewhere (a host's copy, ``--source on-hosts``)."""
    length = header_length(prefix, path, size)
    if len(header) != length:
        raise ConfigError(f"safetensors header truncated ({len(header)} of {length} bytes)", file=path)
    return parse_header(header, path, size), SourceFile(path, size, hashlib.sha256(header).hexdigest(), sample)


def parse_index(text: str, file: str) -> dict[str, str]:
    """``weight_map`` of an index file: tensor name -> file name (relative to the checkpoint)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"not valid JSON: {err.msg}", file=file, line=err.lineno) from None
    except RecursionError:
        raise ConfigError("not an index: nested too deeply", file=file) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError("no 'weight_map' object (tensor name -> file name)", file=file, field="weight_map")
    for name, target in weight_map.items():
        if "/" in target or target.startswith(".."):
            raise ConfigError(f"tensor {name}: file {target!r} is outside the checkpoint directory", file=file, field="weight_map")
    return weight_map


def engram_tensor_pattern(layer: int) -> re.Pattern:
    """Names of the tensors that belong to Engram layer ``layer`` (any prefix before ``layers.N.``)."""
    return re.compile(rf"(?:^|\.)layers\.{layer}\.engram\.")


def is_engram_tensor(name: str, layers) -> bool:
    return any(engram_tensor_pattern(layer).search(name) for layer in layers)


@dataclass
class CheckpointTensors:
    """The selected tensors and the files that hold them (path -> identity)."""

    tensors: dict[str, TensorInfo]
    files: dict[str, SourceFile]


HeaderReader = Callable[[str], "tuple[dict[str, TensorInfo], SourceFile] | None"]


def collect_tensors(root: str, index_text: str | None, has_single: bool, read: HeaderReader,
                    wanted: Callable[[str], bool]) -> CheckpointTensors | None:
    """Select the ``wanted`` tensors through the index (or the single file), reading only the
    headers of the files that hold them. ``read(path)`` returns None for a missing file."""
    index_path = os.path.join(root, INDEX_NAME)
    if index_text is not None:
        weight_map = parse_index(index_text, index_path)
        files = sorted({f for name, f in weight_map.items() if wanted(name)})
        names_by_file = {f: [n for n, g in weight_map.items() if g == f and wanted(n)] for f in files}
    elif has_single:
        files, names_by_file = [SINGLE_NAME], None
    else:
        return None
    out = CheckpointTensors({}, {})
    for file_name in files:
        path = os.path.join(root, file_name)
        got = read(path)
        if got is None:
            raise ConfigError(f"{INDEX_NAME} names {file_name}, which is not in the checkpoint directory", file=path)
        header, identity = got
        out.files[path] = identity
        names = names_by_file[file_name] if names_by_file is not None else [n for n in header if wanted(n)]
        for name in names:
            if name not in header:
                raise ConfigError(f"{INDEX_NAME} says {file_name} holds {name}, but its header does not list it", file=path)
            out.tensors[name] = header[name]
    return out


def load_tensors(checkpoint: str | Path, wanted: Callable[[str], bool]) -> CheckpointTensors | None:
    """Headers of the tensors ``wanted`` selects in a local checkpoint; None when the directory
    has neither an index nor ``model.safetensors`` (config only)."""
    root = str(Path(checkpoint).resolve())
    index_path = os.path.join(root, INDEX_NAME)
    index_text = Path(index_path).read_text(encoding="utf-8") if os.path.isfile(index_path) else None

    def read(path: str):
        return read_header(path) if os.path.isfile(path) else None

    return collect_tensors(root, index_text, os.path.isfile(os.path.join(root, SINGLE_NAME)), read, wanted)
