"""The synthetic checkpoint: real safetensors files (checked with an independent numpy reader),
the model's prime rule, an index, deterministic content, and the layout read back from it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from clirun import run_cli

from sparkctl.engram.layout import EngramConfig, bucket_sizes

REPO = Path(__file__).resolve().parent.parent


def engram_cli(*args: str):
    return run_cli(*args, timeout=120)


def numpy_tensors(path: Path) -> dict[str, tuple[str, list[int], np.ndarray]]:
    """An independent reader of the format: 8-byte LE length, JSON header, data after it."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = np.frombuffer(raw, dtype=np.uint8, offset=8 + n)
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = (entry["dtype"], entry["shape"], data[begin:end])
    assert sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in header.items() if k != "__metadata__") == len(data)
    return out


def test_make_checkpoint_writes_real_safetensors_with_the_prime_rule(tmp_path):
    target = tmp_path / "ckpt"
    proc = engram_cli("sandbox", "make-checkpoint", str(target), "--vocab", "300", "--heads", "4", "--files", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    config = json.loads((target / "config.json").read_text())["text_config"]
    index = json.loads((target / "model.safetensors.index.json").read_text())
    expected_rows = {layer: sum(s) for layer, s in bucket_sizes(EngramConfig((1, 14), {}, 3, 4, 300)).items()}
    assert config["engram_num_embeddings"] == [expected_rows[1], expected_rows[14]]
    assert made["rows"] == {"1": expected_rows[1], "14": expected_rows[14]}

    files = sorted(target.glob("*.safetensors"))
    assert len(files) == 3 and sorted(index["weight_map"].values()) and set(index["weight_map"].values()) == {f.name for f in files}
    tensors = {}
    for f in files:
        for name, value in numpy_tensors(f).items():
            tensors[name] = value
            assert index["weight_map"][name] == f.name
    assert index["metadata"]["total_size"] == sum(v[2].size for v in tensors.values())
    for layer in (1, 14):
        dtype, shape, data = tensors[f"model.layers.{layer}.engram.embed.weight"]
        assert (dtype, shape, data.size) == ("F8_E4M3", [expected_rows[layer], 64], expected_rows[layer] * 64)
        dtype, shape, _ = tensors[f"model.layers.{layer}.engram.embed.scale"]
        assert (dtype, shape) == ("F8_E8M0", [expected_rows[layer], 2])
        assert tensors[f"model.layers.{layer}.engram.gate.weight"][1][0] != expected_rows[layer]
    engram_files = {index["weight_map"][n] for n in index["weight_map"] if ".engram.embed." in n}
    assert len(engram_files) >= 2
    assert any(".engram." not in n for n in tensors)
    # Content is not trivially constant.
    table = tensors["model.layers.1.engram.embed.weight"][2]
    assert len(np.unique(table[:4096])) > 200


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        proc = engram_cli("sandbox", "make-checkpoint", str(tmp_path / name), "--vocab", "200", "--seed", seed)
        assert proc.returncode == 0, proc.stderr
    for f in (tmp_path / "a").glob("*.safetensors"):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes()
    assert (tmp_path / "a" / "model-00001-of-00003.safetensors").read_bytes() != (tmp_path / "c" / "model-00001-of-00003.safetensors").read_bytes()


def test_dry_run_on_a_made_checkpoint_reports_shard_bytes(tmp_path):
    target = tmp_path / "ckpt"
    assert engram_cli("sandbox", "make-checkpoint", str(target), "--vocab", "250", "--head-dim", "96", "--top-level").returncode == 0
    assert "engram_layer_ids" in json.loads((target / "config.json").read_text())
    proc = engram_cli("-i", str(REPO / "inventory.example.yaml"), "pack-engram", "-p", "tp8-1m", "-c", str(target), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for layer in doc["layers"]:
        for rank in layer["ranks"]:
            # A row costs head_dim fp8 bytes plus head_dim/32 scale bytes.
            assert rank["bytes"] == (rank["end"] - rank["start"]) * (96 + 3)


def test_bad_maker_arguments_are_usage_errors(tmp_path):
    proc = engram_cli("sandbox", "make-checkpoint", str(tmp_path / "x"), "--head-dim", "48")
    assert proc.returncode == 2 and "multiple of 32" in proc.stderr
    assert not (tmp_path / "x" / "config.json").exists()
