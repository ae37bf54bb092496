"""Cutting shards locally: byte-identical to numpy slices of the source tensors, manifests that
describe them, nothing half-written under a final name, bounded memory, and the host programs
running on a stock python3 (no xxhash) exactly as they do on a host."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import xxhash

from clirun import run_cli
from sparkctl.engram import hostside
from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.engram.config import load_engram_config
from sparkctl.engram.layout import plan_layout
from sparkctl.engram.safetensors_index import is_engram_tensor, load_tensors
from sparkctl.engram.shards import cut_shard, plan_shards
from sparkctl.errors import ConfigError, OperationFailed

REPO = Path(__file__).resolve().parent.parent
STOCK_PYTHON = "/usr/bin/python3"


def numpy_checkpoint(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor as a uint8 array of shape (rows, row_bytes), read with numpy alone."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out = {}
    for file_name in sorted(set(index["weight_map"].values())):
        raw = np.fromfile(folder / file_name, dtype=np.uint8)
        (n,) = struct.unpack("<Q", raw[:8].tobytes())
        header = json.loads(raw[8:8 + n].tobytes())
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            data = raw[8 + n + begin: 8 + n + end]
            out[name] = data.reshape(entry["shape"][0], -1) if len(entry["shape"]) > 1 else data
    return out


def plan(folder: Path, tp: int):
    config = load_engram_config(folder)
    tensors = load_tensors(folder, lambda n: is_engram_tensor(n, config.layer_ids))
    return plan_shards(plan_layout(config, tp), tensors, str(folder.resolve()), config.source)


def expected_shard(arrays: dict[str, np.ndarray], layer: int, start: int, end: int) -> bytes:
    table = arrays[f"model.layers.{layer}.engram.embed.weight"][start:end]
    scale = arrays[f"model.layers.{layer}.engram.embed.scale"][start:end]
    return np.concatenate([table.ravel(), scale.ravel()]).tobytes()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt")
    make_checkpoint(folder, vocab_size=400, n_heads=6, head_dim=64, files=3, seed=3)
    return folder


@pytest.mark.parametrize("tp, chunk", [(3, 1000), (4, 8 * 1024 * 1024), (12, 4096)])
def test_shards_are_numpy_slices_of_the_source_tensors(checkpoint, tmp_path, tp, chunk):
    arrays = numpy_checkpoint(checkpoint)
    plans = plan(checkpoint, tp)
    assert len(plans) == 2 * tp
    out = tmp_path / "engram"
    for shard in plans:
        result = cut_shard(shard, out, chunk_bytes=chunk)
        data = (out / shard.name).read_bytes()
        assert data == expected_shard(arrays, shard.layer, shard.row_start, shard.row_end)
        manifest = json.loads((out / shard.manifest_name).read_text())
        assert manifest["xxh3_128"] == xxhash.xxh3_128(data).hexdigest() == result["xxh3_128"]
        assert manifest["sha256"] is None  # this machine has xxhash: no second, slower digest
        assert manifest["rows"] == [shard.row_start, shard.row_end] and manifest["size"] == len(data)
        for piece in manifest["tensors"]:
            rows = shard.row_end - shard.row_start
            source = arrays[piece["name"]]
            assert piece["shape"] == [rows, source.shape[1]] and piece["source_shape"] == list(source.shape)
            part = np.frombuffer(data, np.uint8)[piece["offset"]: piece["offset"] + piece["nbytes"]].reshape(rows, -1)
            assert np.array_equal(part, source[shard.row_start: shard.row_end])
        # The gate (first dimension != rows) is never cut into a shard.
        assert [p["name"].rsplit(".", 2)[-2] for p in manifest["tensors"]] == ["embed", "embed"]
    # Ranks tile each layer exactly.
    for layer in (1, 14):
        joined = b"".join((out / s.name).read_bytes()[: (s.row_end - s.row_start) * 64] for s in plans if s.layer == layer)
        assert joined == arrays[f"model.layers.{layer}.engram.embed.weight"].tobytes()
    leftovers = [p.name for p in out.iterdir() if p.name.endswith((".partial", ".tmp", ".partial.json"))]
    assert leftovers == []


def test_recutting_is_idempotent(checkpoint, tmp_path):
    shard = plan(checkpoint, 4)[5]
    first = cut_shard(shard, tmp_path)
    before = (tmp_path / shard.name).read_bytes()
    second = cut_shard(shard, tmp_path)
    assert (tmp_path / shard.name).read_bytes() == before and first["sha256"] == second["sha256"]


def test_a_truncated_source_never_leaves_a_file_under_the_final_name(checkpoint, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    plans = plan(copy, 4)
    victim = plans[-1]  # layer 14, last rank: its rows are at the end of the table
    source = Path(victim.pieces[0].source_file)
    with open(source, "r+b") as f:
        f.truncate(victim.pieces[0].source_offset + victim.pieces[0].length // 2)
    out = tmp_path / "engram"
    with pytest.raises(OperationFailed, match="is not the planned file"):
        cut_shard(victim, out)
    assert not (out / victim.name).exists() and not (out / victim.manifest_name).exists()
    # Past the identity check (same size, but the data is gone mid-file), the reader stops and
    # the partial file keeps its temporary name.
    with open(source, "r+b") as f:
        f.truncate(source.stat().st_size)
    spec = victim.spec()
    spec["sources"] = {}
    with pytest.raises(hostside.HostError, match="ends early"):
        hostside.cut_one(victim.root, str(out), dict(spec, size=spec["size"] + 10**6,
                         tensors=[dict(t, nbytes=t["nbytes"] + 10**6) for t in spec["tensors"]]))
    assert not (out / victim.name).exists() and (out / (victim.name + ".partial")).exists()


def test_config_that_disagrees_with_the_tensors_is_refused(checkpoint, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    config = json.loads((copy / "config.json").read_text())
    text = config["text_config"]
    # A self-consistent config (num_embeddings follow the rule) for another vocab size.
    from sparkctl.engram.layout import EngramConfig, bucket_sizes

    sizes = bucket_sizes(EngramConfig((1, 14), {}, 3, 6, 450))
    text.update(engram_vocab_size=450, engram_num_embeddings=[sum(sizes[1]), sum(sizes[14])])
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="model.layers.1.engram.embed.weight has .* rows but the config's layout gives layer 1"):
        plan(copy, 4)
    proc = run_cli("-i", str(REPO / "inventory.example.yaml"), "pack-engram", "-p", "tp4", "-c", str(copy),
                   "--dry-run", "--json", timeout=60)
    assert proc.returncode == 2
    error = json.loads(proc.stdout)  # --json: still exactly one document, the error's
    assert error["ok"] is False and error["exit_code"] == 2 and "config and tensors disagree" in error["error"]
    assert "config and tensors disagree" in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_table_is_refused(checkpoint, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.14.engram.embed.weight"]
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match="no Engram table for layer 14"):
        plan(copy, 4)


def test_memory_stays_bounded_while_cutting_a_large_shard(tmp_path):
    folder = tmp_path / "big"
    make_checkpoint(folder, vocab_size=20000, n_heads=12, head_dim=128, files=2, layer_ids=(1,))
    shard = plan(folder, 1)[0]
    assert shard.size > 60 * 2**20
    chunk = 1 << 20
    tracemalloc.start()
    try:
        cut_shard(shard, tmp_path / "out", chunk_bytes=chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A fixed ring of 4 chunk buffers shared by reader, hasher and writer; never the table (60+ chunks).
    assert peak < 6 * chunk, peak
    assert (tmp_path / "out" / shard.name).stat().st_size == shard.size


@pytest.mark.skipif(not os.access(STOCK_PYTHON, os.X_OK), reason="no system python3")
def test_host_programs_run_on_a_stock_python_without_xxhash(checkpoint, tmp_path):
    """What a host runs: ``python3 engram.pyz op`` (the shipped zip) with the request on stdin, stdlib only."""
    from sparkctl.ops.engram import host_program

    has_xxhash = subprocess.run([STOCK_PYTHON, "-c", "import xxhash"], capture_output=True).returncode == 0
    program = tmp_path / "engram.pyz"
    program.write_bytes(host_program())
    shard = plan(checkpoint, 4)[2]
    dest = tmp_path / "engram"

    def host(op, request):
        proc = subprocess.run([STOCK_PYTHON, "-I", str(program), op], input=json.dumps(request).encode(),
                              capture_output=True, timeout=60)
        return proc.returncode, json.loads(proc.stdout or "null"), proc.stderr.decode()

    code, result, err = host("cut", {"root": shard.root, "dest": str(dest), "specs": [shard.spec()]})
    assert code == 0, err
    data = (dest / shard.name).read_bytes()
    arrays = numpy_checkpoint(checkpoint)
    assert data == expected_shard(arrays, shard.layer, shard.row_start, shard.row_end)
    manifest = json.loads((dest / shard.manifest_name).read_text())
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["xxh3_128"] == (xxhash.xxh3_128(data).hexdigest() if has_xxhash else None)

    code, result, err = host("verify", {"dest": str(dest), "specs": [shard.spec()]})
    assert code == 0 and result["shards"][0]["status"] == "ok", (result, err)
    assert result["shards"][0]["algorithms"] == (["xxh3_128"] if has_xxhash else ["sha256"])
    with open(dest / shard.name, "r+b") as f:
        f.seek(shard.size // 2)
        byte = f.read(1)
        f.seek(shard.size // 2)
        f.write(bytes([byte[0] ^ 0x40]))
    code, result, err = host("verify", {"dest": str(dest), "specs": [shard.spec()]})
    assert result["shards"][0]["status"] == "corrupt" and "sha256" in result["shards"][0]["detail"]

    # A shard cut here (xxh3 only in its manifest) on a host without xxhash: said plainly.
    if not has_xxhash:
        local = tmp_path / "local"
        cut_shard(shard, local)
        code, result, err = host("verify", {"dest": str(local), "specs": [shard.spec()]})
        assert result["shards"][0]["status"] == "unverifiable" and "python3-xxhash" in result["shards"][0]["detail"]

    other = plan(checkpoint, 3)[2]
    code, result, err = host("verify", {"dest": str(dest), "specs": [dict(shard.spec(), rows=[0, 1])]})
    assert result["shards"][0]["status"] == "stale"
    code, result, err = host("verify", {"dest": str(dest), "specs": [other.spec()]})
    assert result["shards"][0]["status"] == "missing"
    code, result, err = host("cut", {"root": str(tmp_path / "elsewhere"), "dest": str(dest), "specs": [shard.spec()]})
    assert code == hostside.EXIT_SOURCE and "cannot read" in err


def test_the_content_sample_sees_the_first_last_and_spread_blocks_only(tmp_path):
    from sparkctl.engram.hostside import SAMPLE_BLOCKS, SAMPLE_BYTES, sample_sha256

    data_start, size = 100, 100 + 40 * SAMPLE_BYTES
    path = tmp_path / "f"
    path.write_bytes(bytes(size))

    def sample() -> str:
        with open(path, "rb") as f:
            return sample_sha256(f, data_start, size)

    def poke(offset: int) -> str:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(b"\x01")
        changed = sample()
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(b"\x00")
        return changed

    base = sample()
    assert poke(data_start) != base and poke(size - 1) != base  # first and last block
    eighth = data_start + 7 * (size - data_start - SAMPLE_BYTES) // (SAMPLE_BLOCKS - 1)
    assert poke(eighth + 5) != base  # inside the 8th block
    assert poke(eighth + SAMPLE_BYTES + 5) == base  # between blocks: not read
    assert poke(50) == base  # the header is not part of the sample (it is hashed on its own)
    small = tmp_path / "small"
    small.write_bytes(b"h" * 10 + b"x" * 1000)
    with open(small, "rb") as f:
        assert sample_sha256(f, 10, 1010) == __import__("hashlib").sha256(b"x" * 1000).hexdigest()
