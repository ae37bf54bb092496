"""Read the Engram keys from a checkpoint's ``config.json`` (top level, or nested under ``text_config``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkctl.engram.layout import EngramConfig
from sparkctl.errors import ConfigError

REQUIRED_KEYS = ("engram_layer_ids", "engram_num_embeddings", "engram_max_ngram_size", "engram_n_heads", "engram_vocab_size")
OPTIONAL_KEYS = ("engram_head_dim",)


def _int(value: Any, file: str, field: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"must be an integer >= {minimum}, got {value!r}", file=file, field=field)
    return value


def engram_config_from_dict(data: Any, file: str = "config.json") -> EngramConfig:
    """Validate the Engram keys of a parsed config.json; errors name the file and the key."""
    if not isinstance(data, dict):
        raise ConfigError("config.json is not a JSON object", file=file)
    section, prefix = data, ""
    nested = data.get("text_config")
    if isinstance(nested, dict) and any(k in nested for k in REQUIRED_KEYS):
        section, prefix = nested, "text_config."
    missing = [k for k in REQUIRED_KEYS if k not in section]
    if missing:
        raise ConfigError(
            f"no Engram settings: missing {', '.join(missing)} (looked at the top level and under text_config)",
            file=file, field=prefix + missing[0],
        )
    layer_ids_raw = section["engram_layer_ids"]
    if not isinstance(layer_ids_raw, list) or not layer_ids_raw:
        raise ConfigError("must be a non-empty list of layer numbers", file=file, field=prefix + "engram_layer_ids")
    layer_ids = tuple(_int(v, file, f"{prefix}engram_layer_ids[{i}]") for i, v in enumerate(layer_ids_raw))
    if len(set(layer_ids)) != len(layer_ids):
        raise ConfigError("a layer is listed twice", file=file, field=prefix + "engram_layer_ids")

    raw = section["engram_num_embeddings"]
    field = prefix + "engram_num_embeddings"
    if isinstance(raw, list):
        if len(raw) != len(layer_ids):
            raise ConfigError(f"has {len(raw)} entries for {len(layer_ids)} Engram layers", file=file, field=field)
        num = {layer: _int(v, file, f"{field}[{i}]", 1) for i, (layer, v) in enumerate(zip(layer_ids, raw))}
    elif isinstance(raw, dict):
        num = {}
        for key, value in raw.items():
            try:
                layer = int(key)
            except (TypeError, ValueError):
                raise ConfigError(f"key {key!r} is not a layer number", file=file, field=field) from None
            num[layer] = _int(value, file, f"{field}.{key}", 1)
        absent = [layer for layer in layer_ids if layer not in num]
        if absent:
            raise ConfigError(f"has no entry for Engram layer {absent[0]}", file=file, field=field)
    else:
        # One number for every layer (it can only be right when the layers agree).
        value = _int(raw, file, field, 1)
        num = {layer: value for layer in layer_ids}

    head_dim = section.get("engram_head_dim")
    return EngramConfig(
        layer_ids=layer_ids,
        num_embeddings=num,
        max_ngram_size=_int(section["engram_max_ngram_size"], file, prefix + "engram_max_ngram_size", 2),
        n_heads=_int(section["engram_n_heads"], file, prefix + "engram_n_heads", 1),
        vocab_size=_int(section["engram_vocab_size"], file, prefix + "engram_vocab_size", 1),
        head_dim=None if head_dim is None else _int(head_dim, file, prefix + "engram_head_dim", 1),
        source=file,
    )


# A real config.json is a few KB (DeepSeek's is under 10 KB); 16 MiB bounds the parse whatever the file holds.
MAX_CONFIG_CHARS = 16 << 20


def parse_config_text(text: str, file: str) -> EngramConfig:
    if len(text) > MAX_CONFIG_CHARS:
        raise ConfigError(f"{len(text):,} characters: more than a model's config.json holds "
                          f"({MAX_CONFIG_CHARS // (1 << 20)} MiB at most)", file=file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"not valid JSON: {err.msg}", file=file, line=err.lineno) from None
    except RecursionError:  # json's decoder recurses per nesting level
        raise ConfigError("not a model config: nested too deeply", file=file) from None
    return engram_config_from_dict(data, file)


def load_engram_config(checkpoint: str | Path) -> EngramConfig:
    path = Path(checkpoint) / "config.json"
    if not Path(checkpoint).is_dir():
        raise ConfigError("checkpoint directory not found", file=str(checkpoint))
    if not path.is_file():
        raise ConfigError("no config.json in the checkpoint directory", file=str(checkpoint))
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(MAX_CONFIG_CHARS + 1)  # bounded, whatever sits there
    except OSError as err:
        raise ConfigError(f"cannot read: {err.strerror or err}", file=str(path)) from None
    return parse_config_text(text, str(path))
