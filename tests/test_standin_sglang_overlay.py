"""The stand-in SGLang with the SGLang line's overlay (images/sandbox-sglang/adapter on PYTHONPATH):
it serves Engram rows from the packed shards `pack-engram` writes, refuses missing or wrong ones as
the real row store would, honours the switches its adapters read and refuses the others."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx
import pytest

from sparkctl.engram import packed
from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.engram.config import load_engram_config
from sparkctl.engram.layout import plan_layout
from sparkctl.engram.safetensors_index import is_engram_tensor, load_tensors
from sparkctl.engram.shards import cut_shard, plan_shards
from sparkctl.standin import engram_nvme, overlay
from test_standin_support import REPO, Proc, free_port, standin_config, wait_http

pytestmark = pytest.mark.integration  # stand-in SGLang served as a process

ADAPTER = REPO / "images" / "sandbox-sglang" / "adapter"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sglang-overlay") / "model"
    make_checkpoint(str(path), vocab_size=64, n_heads=4, head_dim=64, table_files=True, seed=5)
    return path


def pack(model: Path, dest: Path, tp: int, layout: str = packed.LAYOUT) -> list:
    config = load_engram_config(model)
    tensors = load_tensors(model, lambda n: is_engram_tensor(n, config.layer_ids))
    shards = plan_shards(plan_layout(config, tp), tensors, str(model), config.source, layout)
    for shard in shards:
        cut_shard(shard, dest)
    return shards


def sglang_argv(model: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "sparkctl.standin", "sglang", "--model-path", str(model), "--served-model-name", "dsv41",
            "--host", "127.0.0.1", "--port", str(port), "--tp-size", "1", "--context-length", "4096"]


def env_for(engram: Path, **extra) -> dict:
    return {"PYTHONPATH": f"{REPO}:{ADAPTER}", "OFFLOAD_MODE": "nvme", "DSV41_PACKED_DIR": str(engram), **extra}


def test_a_rank_opens_its_packed_shards_and_reads_the_checkpoints_rows(model, tmp_path):
    shards = pack(model, tmp_path, 2)
    store = engram_nvme.attach(str(tmp_path), str(model), 1, 2)
    mine = [s for s in shards if s.rank == 1]
    assert sorted(store.shards) == [1, 14]
    for shard in mine:
        table = engram_nvme.find_table(str(model), shard.layer)
        for row in (shard.row_start, shard.row_end - 1):
            assert store.read(shard.layer, row) == table.record(row)
        with pytest.raises(engram_nvme.EngramError, match="not this rank's"):
            store.read(shard.layer, shard.row_start - 1)


@pytest.mark.parametrize("damage, message", [
    ("missing", "engram-l14-r0of2.bin: no such file"),
    ("vllm", "not a packed Engram shard"),
    ("other-tp", "header says lo"),
    ("truncated", "a complete shard of rows"),
    ("flipped", "differs from the checkpoint's"),
])
def test_a_missing_or_wrong_shard_is_refused_naming_it(model, tmp_path, damage, message):
    pack(model, tmp_path, 2)
    target = tmp_path / "engram-l14-r0of2.bin"
    if damage == "missing":
        target.unlink()
    elif damage == "vllm":
        pack(model, tmp_path, 2, "tensors")
    elif damage == "other-tp":  # rank 1's file of TP2 under rank 0's name: another row range
        shutil.copy(tmp_path / "engram-l14-r1of2.bin", target)
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:-1])
    else:
        data = bytearray(target.read_bytes())
        data[-1] ^= 0xFF  # the last record's last scale byte
        target.write_bytes(bytes(data))
    with pytest.raises(engram_nvme.EngramError, match=message):
        engram_nvme.attach(str(tmp_path), str(model), 0, 2)


def test_the_switches_are_what_the_adapters_read(model, tmp_path):
    base = {"PYTHONPATH": str(ADAPTER)}
    known = overlay.check_switches({**base, "OFFLOAD_MODE": "nvme", "DSV41_PACKED_DIR": "/engram"})
    assert {"OFFLOAD_MODE", "DSV41_PACKED_DIR", "DSV41_SOURCE", "DSV41_IO_THREADS", "DSV41_CACHE_GIB"} <= known
    with pytest.raises(overlay.StartupError, match="no switch DSV41_FAST_LOAD"):
        overlay.check_switches({**base, "DSV41_FAST_LOAD": "1"})
    with pytest.raises(overlay.StartupError, match="this image has no overlay"):
        overlay.check_switches({"PYTHONPATH": str(tmp_path), "OFFLOAD_MODE": "nvme"})
    assert overlay.check_switches({"PYTHONPATH": str(tmp_path)}) is None  # stock SGLang, nothing asked of it


def test_the_engine_serves_with_its_shards_and_exits_1_without(model, tmp_path):
    pack(model, tmp_path / "engram", 1)
    port = free_port()
    ok = Proc(sglang_argv(model, port), tmp_path / "ok.log", env=env_for(tmp_path / "engram"))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", proc=ok)
        assert "File-backed Engram layer=14 rank=0/1" in ok.output and "packed=True" in ok.output
        answer = httpx.post(f"{url}/v1/chat/completions", json={"model": "dsv41", "max_tokens": 4,
                                                                 "messages": [{"role": "user", "content": "hello there"}]})
        assert answer.status_code == 200
        engram = standin_config(url, proc=ok)["engram"]
        assert engram["offload"] == "nvme" and engram["layers"] == [1, 14] and engram["rows_read"] > 0
        shard = tmp_path / "engram" / "engram-l14-r0of1.bin"
        shard.write_bytes(shard.read_bytes()[:4096])  # the rows vanish under a serving engine
        broken = httpx.post(f"{url}/v1/chat/completions", json={"model": "dsv41", "max_tokens": 4,
                                                                 "messages": [{"role": "user", "content": "hello again"}]})
        assert broken.status_code == 500 and "engram-l14-r0of1.bin" in broken.text
    finally:
        ok.stop()
    pack(model, tmp_path / "engram", 1)
    (tmp_path / "engram" / "engram-l1-r0of1.bin").unlink()
    refused = Proc(sglang_argv(model, free_port()), tmp_path / "refused.log", env=env_for(tmp_path / "engram"))
    assert refused.wait() == 1
    line = next(l for l in refused.output.splitlines() if l.startswith("ERROR"))
    assert "engram-l1-r0of1.bin: no such file" in line and "pack-engram" in line
    stock = Proc(sglang_argv(model, free_port()), tmp_path / "stock.log",
                 env={"PYTHONPATH": str(REPO), "OFFLOAD_MODE": "nvme"})
    assert stock.wait() == 1 and "this image has no overlay" in stock.output
