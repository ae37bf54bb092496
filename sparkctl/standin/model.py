"""The checkpoint and this rank's Engram shards, checked before the engine joins the job.

A real engine opens ``<model>/config.json`` first and fails without it. With Engram on disk
(``DSV41_ENGRAM_DISK=1``) every rank reads its own rows from ``engram-l{L}-r{RANK}of{TP}.bin`` in
the Engram dir (the names ``sparkctl pack-engram`` writes; a shard is complete when its manifest
``engram-l{L}-r{RANK}of{TP}.json`` exists and names the shard's size). A rank missing one refuses
to start, with one log line that names every missing file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional

DEFAULT_MAX_MODEL_LEN = 32768


class ModelError(Exception):
    pass


@dataclass
class ModelInfo:
    path: str
    architectures: List[str]
    model_type: str
    max_position_embeddings: Optional[int]
    engram_layers: List[int] = field(default_factory=list)
    vocab_size: Optional[int] = None  # config.json's: token ids at or past it are refused, as the engines refuse them


def shard_name(layer: int, rank: int, tp: int) -> str:
    return f"engram-l{layer}-r{rank}of{tp}.bin"


def load_model(path: str) -> ModelInfo:
    config_path = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise ModelError(f"model directory {path} does not exist (is the checkpoint mounted?)")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        raise ModelError(f"{config_path} not found: {path} is not a checkpoint directory") from None
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read {config_path}: {err}") from None
    if not isinstance(config, dict):
        raise ModelError(f"{config_path} is not a JSON object")
    section = config
    nested = config.get("text_config")
    if isinstance(nested, dict) and "engram_layer_ids" in nested:
        section = nested
    layers = section.get("engram_layer_ids") or []
    if not isinstance(layers, list) or not all(isinstance(x, int) for x in layers):
        raise ModelError(f"{config_path}: engram_layer_ids must be a list of layer numbers")
    max_pos = section.get("max_position_embeddings", config.get("max_position_embeddings"))
    vocab = section.get("vocab_size", config.get("vocab_size"))
    return ModelInfo(
        path=path,
        architectures=list(config.get("architectures") or []),
        model_type=str(config.get("model_type", "")),
        max_position_embeddings=max_pos if isinstance(max_pos, int) and max_pos > 0 else None,
        engram_layers=list(layers),
        vocab_size=vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else None,
    )


def missing_engram_shards(engram_dir: str, layers: List[int], rank: int, tp: int) -> List[str]:
    """Every shard of this rank that is absent or incomplete, as "NAME (why)"."""
    problems = []
    for layer in layers:
        name = shard_name(layer, rank, tp)
        path = os.path.join(engram_dir, name)
        manifest = path[:-4] + ".json"
        try:
            size = os.path.getsize(path)
        except OSError:
            problems.append(f"{name} (no such file)")
            continue
        try:
            with open(manifest, encoding="utf-8") as handle:
                expected = json.load(handle).get("size")
        except FileNotFoundError:
            problems.append(f"{name} (no manifest: incomplete)")
            continue
        except (OSError, ValueError, AttributeError):
            problems.append(f"{name} (unreadable manifest)")
            continue
        if isinstance(expected, int) and expected != size:
            problems.append(f"{name} ({size} bytes, manifest says {expected})")
    return problems
