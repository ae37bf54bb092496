"""The SGLang line's packed Engram shard, cut from real safetensors and checked byte for byte.

Expected bytes are built independently of sparkctl: numpy reads each safetensors file, and the
record is the source packer's (a 4096-byte header of six little-endian u64, then per row the
weight bytes and the scale bytes side by side). Resumes start anywhere, mid-header or mid-record.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparkctl.engram import hostside, packed
from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.engram.config import load_engram_config
from sparkctl.engram.layout import plan_layout
from sparkctl.engram.safetensors_index import is_engram_tensor, load_tensors
from sparkctl.engram.shards import ShardStream, cut_shard, plan_shards
from sparkctl.errors import ConfigError
from tests.test_engram_shards import STOCK_PYTHON, numpy_checkpoint



def plan(folder: Path, tp: int, layout: str = packed.LAYOUT):
    config = load_engram_config(folder)
    tensors = load_tensors(folder, lambda n: is_engram_tensor(n, config.layer_ids))
    return plan_shards(plan_layout(config, tp), tensors, str(folder.resolve()), config.source, layout)


def expected_packed(arrays, layer: int, lo: int, hi: int, total: int) -> bytes:
    weight = arrays[f"model.layers.{layer}.engram.embed.weight"]
    scale = arrays[f"model.layers.{layer}.engram.embed.scale"]
    record = weight.shape[1] + scale.shape[1]
    header = struct.pack("<6Q", 0x31344E4531565344, layer, lo, hi, total, record).ljust(4096, b"\0")
    return header + np.hstack([weight[lo:hi], scale[lo:hi]]).tobytes()


@pytest.fixture(scope="module")
def real_rows(tmp_path_factory) -> Path:
    """The published row geometry: head_dim 256, so 256 weight + 8 scale = 264-byte records."""
    folder = tmp_path_factory.mktemp("ckpt256")
    make_checkpoint(folder, vocab_size=300, n_heads=4, head_dim=256, files=3, seed=11, table_files=True)
    return folder


@pytest.fixture(scope="module")
def small_rows(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt64")
    make_checkpoint(folder, vocab_size=400, n_heads=6, head_dim=64, files=3, seed=3)
    return folder


@pytest.mark.parametrize("tp, chunk", [(4, 8 * 1024 * 1024), (3, 1000), (8, 100)])
def test_packed_shards_hold_each_rows_weight_then_scale(real_rows, tmp_path, tp, chunk):
    arrays = numpy_checkpoint(real_rows)
    shards = plan(real_rows, tp)
    assert len(shards) == 2 * tp
    for shard in shards:
        cut_shard(shard, tmp_path, chunk_bytes=chunk)
        data = (tmp_path / shard.name).read_bytes()
        total = arrays[f"model.layers.{shard.layer}.engram.embed.weight"].shape[0]
        assert data == expected_packed(arrays, shard.layer, shard.row_start, shard.row_end, total)
        assert len(data) == 4096 + (shard.row_end - shard.row_start) * 264 == shard.size
        # The first record is the rank's first row: 256 weight bytes, then that row's 8 scale bytes.
        weight = arrays[f"model.layers.{shard.layer}.engram.embed.weight"]
        scale = arrays[f"model.layers.{shard.layer}.engram.embed.scale"]
        last = shard.row_end - 1
        assert data[4096:4096 + 256] == weight[shard.row_start].tobytes()
        assert data[4096 + 256:4096 + 264] == scale[shard.row_start].tobytes()
        assert data[-264:] == weight[last].tobytes() + scale[last].tobytes()
        assert data[:8] == b"DSV1EN41"  # the magic's bytes on disk, as the source's packer writes them
        assert packed.parse_header(data[:48]) == {"layer": shard.layer, "lo": shard.row_start, "hi": shard.row_end,
                                                  "rows": total, "record_bytes": 264}
        assert data[48:4096] == bytes(4048)


def test_the_packed_row_ranges_are_the_vllm_hash_head_split(real_rows):
    vllm = plan(real_rows, 4, "tensors")
    sglang = plan(real_rows, 4)
    assert [(s.name, s.row_start, s.row_end) for s in vllm] == [(s.name, s.row_start, s.row_end) for s in sglang]
    # Only the two tables go into a packed shard, whatever else the layer has (its gate is not cut).
    assert all([p.tensor.rsplit(".", 1)[-1] for p in s.pieces] == ["weight", "scale"] for s in sglang)


@pytest.mark.parametrize("chunk", [8 * 1024 * 1024, 1000, 100])
def test_without_numpy_the_kernel_scatters_the_same_bytes(real_rows, tmp_path, monkeypatch, chunk):
    """A host whose python3 has no numpy fills the records with scattered reads: same bytes."""
    arrays = numpy_checkpoint(real_rows)
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` now raises ImportError
    assert hostside.RecordFiller([], 264, 1).numpy is None
    for shard in plan(real_rows, 3):
        cut_shard(shard, tmp_path, chunk_bytes=chunk)
        total = arrays[f"model.layers.{shard.layer}.engram.embed.weight"].shape[0]
        assert (tmp_path / shard.name).read_bytes() == expected_packed(arrays, shard.layer, shard.row_start,
                                                                       shard.row_end, total)


def test_smaller_records_interleave_the_same_way(small_rows, tmp_path):
    arrays = numpy_checkpoint(small_rows)
    for shard in plan(small_rows, 6):
        cut_shard(shard, tmp_path, chunk_bytes=50)  # a 66-byte record is larger than a buffer: it spans two
        total = arrays[f"model.layers.{shard.layer}.engram.embed.weight"].shape[0]
        assert (tmp_path / shard.name).read_bytes() == expected_packed(arrays, shard.layer, shard.row_start, shard.row_end, total)


@pytest.mark.parametrize("offset", [0, 7, 4096, 4096 + 264 * 3 + 100, -1])
def test_a_resumed_stream_sends_exactly_the_rest_and_hashes_the_whole_file(real_rows, tmp_path, offset):
    shard = plan(real_rows, 4)[1]
    cut_shard(shard, tmp_path)
    whole = (tmp_path / shard.name).read_bytes()
    offset = len(whole) - 5 if offset == -1 else offset
    stream = ShardStream(shard, offset, chunk_bytes=1000, sha256=True)
    chunks = [bytes(c) for c in stream]
    trailer = chunks.pop()
    assert b"".join(chunks) == whole[offset:]
    (length,) = struct.unpack("<Q", trailer[:8])
    sent = json.loads(trailer[8:8 + length])
    import hashlib

    assert sent["sha256"] == hashlib.sha256(whole).hexdigest()


def test_the_manifest_says_the_layout_and_a_vllm_manifest_is_stale_for_it(real_rows, tmp_path):
    sglang = plan(real_rows, 4)[0]
    vllm = plan(real_rows, 4, "tensors")[0]
    cut_shard(vllm, tmp_path)
    manifest = json.loads((tmp_path / vllm.manifest_name).read_text())
    assert "layout" not in manifest  # the vLLM manifest keeps its shape (shards packed before stay valid)
    assert hostside.plan_part(manifest) != sglang.spec()
    result = hostside.verify({"dest": str(tmp_path), "specs": [sglang.spec()]})
    assert result["shards"][0]["status"] == "stale"
    cut_shard(sglang, tmp_path)
    manifest = json.loads((tmp_path / sglang.manifest_name).read_text())
    assert manifest["layout"] == "sglang-packed" and manifest["record_bytes"] == 264
    assert [t["offset"] for t in manifest["tensors"]] == [0, 256]  # where each tensor sits in a record
    assert hostside.verify({"dest": str(tmp_path), "specs": [sglang.spec()]})["shards"][0]["status"] == "ok"


def test_a_checkpoint_without_the_scale_table_is_refused_naming_it(small_rows, tmp_path):
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(small_rows, copy)
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.endswith("layers.14.engram.embed.scale")}
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"layer 14's engram\.embed\.scale"):
        plan(copy, 4)
    assert len(plan(copy, 4, "tensors")) == 8  # the vLLM layout cuts whatever tensors the layer has


def test_the_host_program_cuts_packed_shards_on_a_stock_python(real_rows, tmp_path):
    """What a host runs: the shipped zip with its own python3, nothing of sparkctl installed."""
    from sparkctl.ops.engram import host_program

    shard = plan(real_rows, 4)[2]
    cut_shard(shard, tmp_path / "here")
    program = tmp_path / "engram.pyz"
    program.write_bytes(host_program())
    request = json.dumps({"root": shard.root, "dest": str(tmp_path / "there"), "specs": [shard.spec()]})
    python = STOCK_PYTHON if Path(STOCK_PYTHON).exists() else sys.executable  # no numpy, no xxhash: a bare host
    proc = subprocess.run([python, "-I", str(program), "cut"], input=request.encode(), capture_output=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert (tmp_path / "there" / shard.name).read_bytes() == (tmp_path / "here" / shard.name).read_bytes()


def test_pack_engram_dry_run_of_an_sglang_profile_plans_packed_shards(real_rows):
    from tests.test_engram_layout import EXAMPLE_INVENTORY, engram_cli

    proc = engram_cli("-i", EXAMPLE_INVENTORY, "--json", "pack-engram", "-p", "sglang-tp4-1m", "--set", "engram.mode=disk",
                      "-c", str(real_rows), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["shard_layout"] == "sglang-packed"
    for layer in doc["layers"]:
        for rank in layer["ranks"]:
            assert rank["bytes"] == 4096 + (rank["end"] - rank["start"]) * 264
    human = engram_cli("-i", EXAMPLE_INVENTORY, "pack-engram", "-p", "sglang-tp4-1m", "--set", "engram.mode=disk",
                       "-c", str(real_rows), "--dry-run")
    assert "SGLang packed" in human.stdout + human.stderr
    vllm = json.loads(engram_cli("-i", EXAMPLE_INVENTORY, "--json", "pack-engram", "-p", "tp4", "-c", str(real_rows),
                                 "--dry-run").stdout)
    assert vllm["shard_layout"] == "tensors"
    # Same rows, without the header and (this checkpoint) with the same two tables: 4096 bytes less per shard.
    assert [r["bytes"] + 4096 for l in vllm["layers"] for r in l["ranks"]] == \
        [r["bytes"] for l in doc["layers"] for r in l["ranks"]]
