"""Engram layout: the prime rule, the engine's head split, and ``pack-engram --dry-run --json``
from a folder that holds only config.json (the TP4 vLLM report Appendix B)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import run_cli
from sparkctl.engram.layout import EngramConfig, LayoutError, is_prime, next_prime, plan_layout, split_heads

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_INVENTORY = str(REPO / "inventory.example.yaml")

# The TP4 vLLM report Appendix B: rank bounds of layer 1 and layer 14 at TP4, and the nodes that hold them.
APPENDIX_B = {
    1: [0, 96000564, 192001740, 288003654, 384006168],
    14: [0, 96003054, 192007016, 288011564, 384016682],
}
APPENDIX_B_NODES = ["spark-153", "spark-147", "spark-166", "spark-148"]

PUBLISHED = {
    "engram_layer_ids": [1, 14],
    "engram_vocab_size": 16000000,
    "engram_max_ngram_size": 3,
    "engram_n_heads": 12,
    "engram_num_embeddings": [384006168, 384016682],
}


def engram_cli(*args: str):
    """The real CLI (global options, exit codes) with pack-engram registered (tests/clirun.py)."""
    return run_cli(*args, timeout=120)


def write_config(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def test_is_prime_agrees_with_a_sieve():
    limit = 20000
    sieve = [True] * limit
    sieve[0] = sieve[1] = False
    for i in range(2, int(limit ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = [False] * len(sieve[i * i::i])
    assert [n for n in range(limit) if is_prime(n)] == [n for n in range(limit) if sieve[n]]
    # Strong pseudoprimes to small bases and a Carmichael number are not primes.
    assert not any(is_prime(n) for n in (561, 2047, 3215031751, 3825123056546413051))
    assert next_prime(16000000) == 16000057 and next_prime(16000057) == 16000057


def test_published_config_gives_appendix_b_bounds():
    config = EngramConfig((1, 14), {}, 3, 12, 16000000)
    layout = plan_layout(config, 4)
    for layer in layout.layers:
        bounds = [layout.layer(layer.layer).ranks[0].start] + [r.end for r in layer.ranks]
        assert bounds == APPENDIX_B[layer.layer]
    # Primes are never reused: layer 14 starts after layer 1's last prime.
    assert layout.layer(14).heads[0] > layout.layer(1).heads[-1]
    assert len(set(layout.layer(1).heads + layout.layer(14).heads)) == 48


def test_engine_split_last_rank_takes_fewer_and_empty_rank_is_refused():
    assert split_heads(24, 5) == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 24)]
    assert split_heads(24, 8) == [(i * 3, i * 3 + 3) for i in range(8)]
    with pytest.raises(LayoutError, match="rank 6 without an Engram head"):
        split_heads(24, 7)  # ceil(24/7) = 4 fills 6 ranks
    with pytest.raises(LayoutError, match="rank 24"):
        split_heads(24, 32)


def test_dry_run_json_from_config_only_dir_reproduces_appendix_b(tmp_path):
    checkpoint = write_config(tmp_path / "ckpt", PUBLISHED)
    proc = engram_cli("-i", EXAMPLE_INVENTORY, "pack-engram", "--profile", "tp4", "--checkpoint", str(checkpoint),
                      "--hosts", ",".join(APPENDIX_B_NODES), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["tp"] == 4
    assert [layer["layer"] for layer in doc["layers"]] == [1, 14]
    for layer in doc["layers"]:
        bounds = APPENDIX_B[layer["layer"]]
        assert layer["rows"] == bounds[-1] == sum(layer["heads"])
        assert len(layer["heads"]) == 24
        assert layer["ranks"] == [
            {"rank": r, "host": APPENDIX_B_NODES[r], "start": bounds[r], "end": bounds[r + 1], "bytes": None}
            for r in range(4)
        ]
        assert set(layer) == {"layer", "rows", "heads", "ranks"}
    assert set(doc) == {"tp", "shard_layout", "layers"} and doc["shard_layout"] == "tensors"  # vLLM profile


def test_keys_at_top_level_work_and_hosts_default_to_the_profile_selection(tmp_path):
    checkpoint = write_config(tmp_path / "ckpt", {"model_type": "deepseek_v41", **PUBLISHED})
    proc = engram_cli("-i", EXAMPLE_INVENTORY, "--json", "pack-engram", "-p", "tp4", "-c", str(checkpoint), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    # Head first, then the first workers in inventory order (select_hosts).
    assert [r["host"] for r in doc["layers"][0]["ranks"]] == ["spark-153", "spark-147", "spark-157", "spark-158"]
    assert [r["end"] for r in doc["layers"][1]["ranks"]] == APPENDIX_B[14][1:]


def test_tp8_gives_three_heads_per_rank(tmp_path):
    checkpoint = write_config(tmp_path / "ckpt", {"text_config": PUBLISHED})
    proc = engram_cli("-i", EXAMPLE_INVENTORY, "pack-engram", "-p", "tp8-1m", "-c", str(checkpoint), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["tp"] == 8
    for layer in doc["layers"]:
        heads, ranks = layer["heads"], layer["ranks"]
        assert len(ranks) == 8
        assert ranks[0]["start"] == 0 and ranks[-1]["end"] == layer["rows"]
        for r, rank in enumerate(ranks):
            assert rank["end"] - rank["start"] == sum(heads[3 * r: 3 * r + 3])
            if r:
                assert rank["start"] == ranks[r - 1]["end"]
        assert len({rank["host"] for rank in ranks}) == 8


def test_tp_that_leaves_a_rank_without_a_head_is_refused(tmp_path):
    checkpoint = write_config(tmp_path / "ckpt", PUBLISHED)
    proc = engram_cli("-i", EXAMPLE_INVENTORY, "pack-engram", "-p", "tp8-1m", "--set", "tensor_parallel=7",
                      "-c", str(checkpoint), "--dry-run", "--json")
    assert proc.returncode == 2, proc
    error = json.loads(proc.stdout)  # --json: still exactly one document, the error's
    assert error["ok"] is False and "TP7 leaves rank 6 without an Engram head" in error["error"]
    assert "TP7 leaves rank 6 without an Engram head" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_num_embeddings_that_disagree_with_the_rule_are_refused(tmp_path):
    bad = dict(PUBLISHED, engram_num_embeddings=[384006168, 384016683])
    checkpoint = write_config(tmp_path / "ckpt", {"text_config": bad})
    proc = engram_cli("-i", EXAMPLE_INVENTORY, "pack-engram", "-p", "tp4", "-c", str(checkpoint), "--dry-run", "--json")
    assert proc.returncode == 2
    assert "config.json" in proc.stderr
    assert "layer 14 is 384016683" in proc.stderr and "gives 384016682 rows" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("change, expect", [
    ({"engram_n_heads": None}, "missing engram_n_heads"),
    ({"engram_num_embeddings": [384006168]}, "has 1 entries for 2 Engram layers"),
    ({"engram_max_ngram_size": 1}, "engram_max_ngram_size: must be an integer >= 2"),
    ({"engram_layer_ids": "1,14"}, "engram_layer_ids: must be a non-empty list"),
])
def test_bad_engram_keys_name_the_key(tmp_path, change, expect):
    data = {k: v for k, v in {**PUBLISHED, **change}.items() if v is not None}
    checkpoint = write_config(tmp_path / "ckpt", data)
    proc = engram_cli("-i", EXAMPLE_INVENTORY, "pack-engram", "-p", "tp4", "-c", str(checkpoint), "--dry-run")
    assert proc.returncode == 2
    assert expect in proc.stderr, proc.stderr


def test_missing_checkpoint_dir_is_a_usage_error(tmp_path):
    proc = engram_cli("-i", EXAMPLE_INVENTORY, "pack-engram", "-p", "tp4", "-c", str(tmp_path / "nope"), "--dry-run")
    assert proc.returncode == 2 and "checkpoint directory not found" in proc.stderr
