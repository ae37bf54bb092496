"""A small synthetic DeepSeek-V4.1-style checkpoint for tests, benchmarks and the sandbox.

Same config keys and the same prime rule as the real model (``sparkctl.engram.layout``), only a
small ``engram_vocab_size``. Real safetensors files, written here byte by byte (the format is an
8-byte little-endian header length, a JSON header padded with spaces to a multiple of 8, then the
data), so no extra package is needed and a multi-GiB table is written in bounded chunks.

Per Engram layer: ``model.layers.{L}.engram.embed.weight`` (F8_E4M3, rows x head_dim),
``model.layers.{L}.engram.embed.scale`` (F8_E8M0, one byte per 32 values) and a small
``...engram.gate.weight`` that is *not* cut by rows; plus a few non-Engram tensors. Tensors are
spread over ``files`` safetensors files (at least 2) with a ``model.safetensors.index.json``.
Content is a deterministic function of (seed, tensor name, byte position): SHAKE-128 in 1 MiB
blocks, the same on every machine and Python version.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from sparkctl.engram.layout import EngramConfig, bucket_sizes

BLOCK = 1 << 20


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    item_bytes: int

    @property
    def nbytes(self) -> int:
        n = self.item_bytes
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class MadeCheckpoint:
    path: str
    files: dict[str, list[str]]  # file name -> tensor names
    rows: dict[int, int]  # Engram layer -> rows
    total_bytes: int
    config: dict

    def to_json(self) -> dict:
        return {"path": self.path, "files": self.files, "rows": {str(k): v for k, v in self.rows.items()},
                "total_bytes": self.total_bytes}


def tensor_bytes(seed: int, name: str, offset: int, length: int) -> bytes:
    """Bytes ``[offset, offset+length)`` of a tensor's deterministic content."""
    out = bytearray()
    block, skip = divmod(offset, BLOCK)
    while len(out) < length + skip:
        out += hashlib.shake_128(f"{seed}/{name}/{block}".encode()).digest(BLOCK)
        block += 1
    return bytes(out[skip: skip + length])


def _specs(config: EngramConfig, head_dim: int, hidden: int) -> list[TensorSpec]:
    rows = {layer: sum(sizes) for layer, sizes in bucket_sizes(config).items()}
    specs = [
        TensorSpec("model.embed_tokens.weight", "BF16", (64, hidden), 2),
        TensorSpec("model.layers.0.self_attn.q_proj.weight", "BF16", (hidden, hidden), 2),
    ]
    for layer in config.layer_ids:
        prefix = f"model.layers.{layer}.engram"
        specs += [
            TensorSpec(f"{prefix}.embed.weight", "F8_E4M3", (rows[layer], head_dim), 1),
            TensorSpec(f"{prefix}.gate.weight", "BF16", (hidden, head_dim), 2),
            TensorSpec(f"{prefix}.embed.scale", "F8_E8M0", (rows[layer], head_dim // 32), 1),
        ]
    specs += [
        TensorSpec("model.norm.weight", "F32", (hidden,), 4),
        TensorSpec("lm_head.weight", "BF16", (64, hidden), 2),
    ]
    return specs


def _split(specs: list[TensorSpec], files: int) -> list[list[TensorSpec]]:
    """Contiguous groups of roughly equal bytes, none empty (so tables land in different files)."""
    total = sum(s.nbytes for s in specs)
    groups: list[list[TensorSpec]] = [[] for _ in range(files)]
    done = 0
    for i, spec in enumerate(specs):
        remaining_specs = len(specs) - i
        index = min(files - 1, done * files // max(total, 1))
        # Keep enough tensors for the files still empty.
        empty_after = sum(1 for g in groups[index + 1:] if not g)
        if remaining_specs <= empty_after:
            index = next(j for j, g in enumerate(groups) if not g)
        groups[index].append(spec)
        done += spec.nbytes
    return groups


def _write_file(path: Path, specs: list[TensorSpec], seed: int) -> None:
    header, offset = {"__metadata__": {"format": "pt", "made_by": "sparkctl sandbox make-checkpoint"}}, 0
    for spec in specs:
        header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape), "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for spec in specs:
            for start in range(0, spec.nbytes, BLOCK):
                f.write(tensor_bytes(seed, spec.name, start, min(BLOCK, spec.nbytes - start)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# A synthetic checkpoint is for tests and the sandbox: its tables are refused before anything is written when
# they would pass these. Each table's rows are the next prime not drawn before (engram.layout.bucket_sizes), so
# many tables over a small vocabulary grow far past tables x vocab: the rows are counted, not estimated.
MAX_TABLES = 1024
MAX_LAYER_ID = 1024  # the model has 61 layers
MAX_TABLE_BYTES = 4 << 30


class ShapeError(ValueError):
    """A checkpoint shape refused; ``option`` is the make-checkpoint option that names it."""

    def __init__(self, message: str, option: str):
        super().__init__(message)
        self.option = option


def _checked_rows(config: EngramConfig, head_dim: int) -> dict[int, list[int]]:
    """Each layer's bucket sizes, once the tables are known to stay within the limits above."""
    layers = config.layer_ids
    if not layers or len(set(layers)) != len(layers) or not all(0 <= layer < MAX_LAYER_ID for layer in layers):
        # a layer named twice gives two tensors one name (in two files; the index can point at only one)
        raise ShapeError(f"layer ids must be one or more different layer numbers from 0 to {MAX_LAYER_ID - 1}, "
                         f"got {', '.join(map(str, layers)) or 'none'}", "--layers")
    tables = len(layers) * max(config.max_ngram_size - 1, 0) * config.n_heads
    if tables > MAX_TABLES:
        raise ShapeError(f"{tables} Engram tables (layers x n-gram orders x heads); a synthetic checkpoint has at most "
                         f"{MAX_TABLES} (fewer --layers, a lower --max-ngram or fewer --heads)", "--heads")
    row_bytes = head_dim + head_dim // 32  # an fp8 row and its scales
    if tables * config.vocab_size * row_bytes > MAX_TABLE_BYTES:  # a lower bound: no prime to draw for it
        raise ShapeError(_too_big(tables * config.vocab_size * row_bytes, at_least=True), "--vocab")
    sizes = bucket_sizes(config)
    table_bytes = sum(sum(rows) for rows in sizes.values()) * row_bytes
    if table_bytes > MAX_TABLE_BYTES:
        raise ShapeError(_too_big(table_bytes, at_least=False), "--vocab")
    return sizes


def _too_big(table_bytes: int, *, at_least: bool) -> str:
    return (f"the Engram tables would take {'over ' if at_least else ''}{table_bytes / 2**30:.1f} GiB; a "
            f"synthetic checkpoint has at most {MAX_TABLE_BYTES >> 30} GiB (a lower --vocab, --head-dim, --heads or --max-ngram)")


def make_checkpoint(
    directory: str | Path,
    *,
    vocab_size: int = 1000,
    layer_ids: tuple[int, ...] = (1, 14),
    max_ngram_size: int = 3,
    n_heads: int = 12,
    head_dim: int = 64,
    files: int = 3,
    seed: int = 0,
    nested: bool = True,
    hidden: int = 64,
    table_files: bool = False,
) -> MadeCheckpoint:
    """Write config.json, ``files`` safetensors files and the index into ``directory``. With
    ``table_files`` each Engram layer's table (weight and scale) gets a file of its own after those,
    as in the real checkpoint, where two files hold nothing but the tables."""
    if head_dim % 32:
        raise ValueError(f"head_dim must be a multiple of 32 (one scale byte per 32 values), got {head_dim}")
    if files < 2:
        raise ValueError("files must be at least 2 (the tables are spread over several files)")
    config = EngramConfig(tuple(layer_ids), {}, max_ngram_size, n_heads, vocab_size, head_dim)
    rows = {layer: sum(sizes) for layer, sizes in _checked_rows(config, head_dim).items()}
    specs = _specs(config, head_dim, hidden)
    if files > len(specs):
        raise ValueError(f"files must be at most {len(specs)} (one tensor per file at least)")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    engram = {
        "engram_layer_ids": list(layer_ids),
        "engram_vocab_size": vocab_size,
        "engram_max_ngram_size": max_ngram_size,
        "engram_n_heads": n_heads,
        "engram_head_dim": head_dim,
        "engram_num_embeddings": [rows[layer] for layer in layer_ids],
    }
    config_doc = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41"}
    if nested:
        config_doc["text_config"] = {"hidden_size": hidden, **engram}
    else:
        config_doc.update(hidden_size=hidden, **engram)
    weight_map, listing = {}, {}
    if table_files:
        tables = [s for s in specs if ".engram.embed." in s.name]
        rest = [s for s in specs if s not in tables]
        groups = _split(rest, files) + [[s for s in tables if f".layers.{layer}." in s.name] for layer in layer_ids]
    else:
        groups = _split(specs, files)
    for number, group in enumerate(groups, start=1):
        name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        _write_file(root / name, group, seed)
        listing[name] = [s.name for s in group]
        weight_map.update({s.name: name for s in group})
    total = sum(s.nbytes for s in specs)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (root / "config.json").write_text(json.dumps(config_doc, indent=2) + "\n")
    return MadeCheckpoint(path=str(root), files=listing, rows=rows, total_bytes=total, config=config_doc)
