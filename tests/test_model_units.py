"""model sync without a cluster: the agent on real files (receivers are real subprocesses running the
shipped zip), the plan, the Engram-table rule, doctor's checkpoint check, and the hub path against a
local endpoint that answers the way the hub does."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from clirun import run_cli
from hubserver import FakeHub
from sparkctl.commands import probes
from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.errors import ConfigError
from sparkctl.model import agent
from sparkctl.model.plan import engram_table_files, parse_source, plan_host, weight_map_of, without
from sparkctl.ops.doctor import verdicts
from sparkctl.ops.model_sync import agent_zip


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    made = make_checkpoint(str(tmp_path / "src"), vocab_size=3000, layer_ids=(1, 14), files=4, seed=3)
    return Path(made.path)


@pytest.fixture
def agent_file(tmp_path) -> str:
    path = tmp_path / "agent.pyz"
    path.write_bytes(agent_zip())
    return str(path)


def send(source: Path, dest: Path, manifest: dict, agent_path: str, bwlimit=None) -> dict:
    plan = plan_host("h", manifest, agent.check(str(dest), manifest))
    spec = {"root": str(source), "algo": manifest["algo"], "manifest": manifest, "bwlimit": bwlimit,
            "targets": [{"name": "h", "where": "here", "files": plan.send,
                         "argv": ["python3", agent_path, "receive", str(dest)]}]}
    return agent.send_all(spec, lambda doc: None)["h"]


def states(dest: Path, manifest: dict) -> dict:
    return {n: s["state"] for n, s in agent.check(str(dest), manifest)["files"].items()}


@pytest.mark.integration
def test_first_copy_then_only_what_differs(checkpoint, tmp_path, agent_file):
    manifest = agent.build(str(checkpoint), "sha256")
    dest = tmp_path / "dest"
    first = send(checkpoint, dest, manifest, agent_file)
    assert first["ok"], first
    assert first["bytes_sent"] == sum(e["size"] for e in manifest["files"].values())
    assert set(states(dest, manifest).values()) == {"ok"}
    kept = json.loads((dest / agent.MANIFEST_NAME).read_text())
    assert kept["files"] == manifest["files"]
    # A rerun sends nothing.
    again = plan_host("h", manifest, agent.check(str(dest), manifest))
    assert again.unchanged and again.bytes_to_send == 0
    # One file truncated, one byte flipped in another: exactly those two are resent.
    shards = sorted(n for n in manifest["files"] if n.endswith(".safetensors"))
    truncated, flipped, untouched = dest / shards[0], dest / shards[1], dest / shards[2]
    with open(truncated, "r+b") as handle:
        handle.truncate(os.path.getsize(truncated) // 2)
    with open(flipped, "r+b") as handle:
        handle.seek(os.path.getsize(flipped) - 100)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x01]))
    untouched_inode = os.stat(untouched).st_ino
    found = states(dest, manifest)
    assert found[shards[0]] == "size" and found[shards[1]] == "content" and found[shards[2]] == "ok"
    repaired = send(checkpoint, dest, manifest, agent_file)
    assert repaired["ok"], repaired
    assert repaired["bytes_sent"] == manifest["files"][shards[0]]["size"] + manifest["files"][shards[1]]["size"]
    assert set(states(dest, manifest).values()) == {"ok"}
    assert os.stat(untouched).st_ino == untouched_inode


@pytest.mark.integration
def test_a_part_file_is_continued_and_a_wrong_part_never_gets_the_final_name(checkpoint, tmp_path, agent_file):
    manifest = agent.build(str(checkpoint), "sha256")
    name = max(manifest["files"], key=lambda n: manifest["files"][n]["size"])
    size = manifest["files"][name]["size"]
    dest = tmp_path / "dest"
    dest.mkdir()
    data = (checkpoint / name).read_bytes()
    (dest / (name + agent.PART_SUFFIX)).write_bytes(data[: size // 3])
    plan = plan_host("h", manifest, agent.check(str(dest), manifest))
    assert {"file": name, "offset": size // 3} in plan.send and plan.resumed_bytes == size // 3
    result = send(checkpoint, dest, manifest, agent_file)
    assert result["ok"], result
    total = sum(e["size"] for e in manifest["files"].values())
    assert result["bytes_sent"] == total - size // 3
    assert (dest / name).read_bytes() == data
    # A part whose prefix is not the file's: the digest fails, the part is dropped, no final name.
    os.unlink(dest / name)
    (dest / (name + agent.PART_SUFFIX)).write_bytes(b"\xff" * (size // 2))
    bad = send(checkpoint, dest, manifest, agent_file)
    assert not bad["ok"] and name in bad["error"] and "expected" in bad["error"]
    assert not (dest / name).exists() and not (dest / (name + agent.PART_SUFFIX)).exists()
    assert not (dest / agent.MANIFEST_NAME).exists() or json.loads((dest / agent.MANIFEST_NAME).read_text())
    assert send(checkpoint, dest, manifest, agent_file)["ok"]
    assert (dest / name).read_bytes() == data


@pytest.mark.integration
def test_a_stream_cut_mid_file_keeps_the_part_under_its_part_name(checkpoint, tmp_path, agent_file):
    manifest = agent.build(str(checkpoint), "sha256")
    name = max(manifest["files"], key=lambda n: manifest["files"][n]["size"])
    entry = manifest["files"][name]
    dest = tmp_path / "dest"
    header = {"file": name, "offset": 0, "size": entry["size"], "algo": "sha256", "digest": entry["sha256"]}
    cut = 1000
    stream = (json.dumps(header) + "\n").encode() + (checkpoint / name).read_bytes()[:cut]
    proc = subprocess.run(["python3", agent_file, "receive", str(dest)], input=stream, capture_output=True, timeout=60)
    assert proc.returncode == 3
    line = json.loads(proc.stdout.decode().splitlines()[-1])
    assert line["ok"] is False and line["kept"] == cut
    assert not (dest / name).exists()
    assert os.path.getsize(dest / (name + agent.PART_SUFFIX)) == cut


@pytest.mark.integration
def test_the_receiver_refuses_names_outside_its_folder(tmp_path, agent_file):
    header = {"file": "../escape", "offset": 0, "size": 1, "algo": "sha256", "digest": "00"}
    proc = subprocess.run(["python3", agent_file, "receive", str(tmp_path / "d")], capture_output=True, timeout=60,
                          input=(json.dumps(header) + "\nx").encode())
    assert proc.returncode != 0 and not (tmp_path / "escape").exists()
    assert plan_host("h", {"algo": "sha256", "files": {"../x": {"size": 1, "sha256": "0"}}},
                     {"free": 10, "files": {"../x": {"state": "refused", "part": 0}}}).refused


def test_room_is_checked_before_sending_with_the_numbers():
    manifest = {"algo": "sha256", "files": {"a": {"size": 1000, "sha256": "x"}, "b": {"size": 500, "sha256": "y"}}}
    check = {"free": 1200, "files": {"a": {"state": "missing", "part": 100}, "b": {"state": "missing", "part": 0}}}
    plan = plan_host("h", manifest, check)
    assert plan.bytes_to_send == 1400 and plan.refused
    assert "1400 bytes" in plan.refused and "1200 bytes" in plan.refused
    check["free"] = 1400
    assert plan_host("h", manifest, check).refused is None


def test_xxh3_when_the_module_is_there(checkpoint):
    pytest.importorskip("xxhash")
    manifest = agent.build(str(checkpoint), "xxh3_128")
    assert all(len(e["xxh3_128"]) == 32 for e in manifest["files"].values())
    assert set(states(checkpoint, manifest).values()) == {"ok"}


def test_engram_only_files_are_found_from_the_index(checkpoint):
    weight_map = weight_map_of((checkpoint / "model.safetensors.index.json").read_text(), "index")
    tables = engram_table_files(weight_map)
    for name in tables:
        assert all(".engram.embed." in t for t, f in weight_map.items() if f == name)
    mixed = {"a.weight": "one.safetensors", "model.layers.1.engram.embed.weight": "one.safetensors",
             "model.layers.1.engram.embed.scale": "two.safetensors", "model.layers.14.engram.embed.weight": "two.safetensors",
             "model.layers.1.engram.gate.weight": "three.safetensors"}
    assert engram_table_files(mixed) == ["two.safetensors"]
    manifest = {"algo": "sha256", "files": {"one.safetensors": {"size": 1}, "two.safetensors": {"size": 7}}}
    kept = without(manifest, ["two.safetensors"])
    assert list(kept["files"]) == ["one.safetensors"] and kept["left_out"] == {"two.safetensors": 7}


def test_sources_parse():
    assert parse_source("hf:deepseek-ai/DeepSeek-V4.1-Flash@main").revision == "main"
    assert parse_source("hf:deepseek-ai/DeepSeek-V4.1-Flash").kind == "hub"
    assert parse_source("/data/ckpt").path == "/data/ckpt"
    for bad in ("hf:nope", "hf:a/b/c", "hf:../x"):
        with pytest.raises(ConfigError):
            parse_source(bad)


def _doctor_checkpoint(folder: Path):
    proc = subprocess.run(probes.checkpoint_argv(str(folder)), capture_output=True, text=True, timeout=60)
    return verdicts.check_checkpoint(probes.parse_checkpoint(proc.stdout), str(folder))


def test_doctor_fails_a_truncated_shard(checkpoint):
    assert _doctor_checkpoint(checkpoint).status == "pass"
    shard = sorted(checkpoint.glob("*.safetensors"))[1]
    full = os.path.getsize(shard)
    with open(shard, "r+b") as handle:
        handle.truncate(full - 4096)
    result = _doctor_checkpoint(checkpoint)
    assert result.status == "fail" and shard.name in result.detail and f"of {full} bytes" in result.detail


@pytest.mark.integration
def test_doctor_uses_the_kept_manifest(checkpoint, tmp_path, agent_file):
    manifest = agent.build(str(checkpoint), "sha256")
    dest = tmp_path / "dest"
    assert send(checkpoint, dest, manifest, agent_file)["ok"]
    passed = _doctor_checkpoint(dest)
    assert passed.status == "pass" and "manifest" in passed.detail
    kept = json.loads((dest / agent.MANIFEST_NAME).read_text())
    shard = sorted(dest.glob("*.safetensors"))[0]
    kept["files"][shard.name]["size"] += 8  # what the manifest says wins over the header
    (dest / agent.MANIFEST_NAME).write_text(json.dumps(kept))
    failed = _doctor_checkpoint(dest)
    assert failed.status == "fail" and shard.name in failed.detail and "manifest" in failed.detail


# ---------------------------------------------------------------------------------------------- the hub


@pytest.mark.integration
def test_hub_download_resumed_verified_and_the_token_never_printed(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text("{}")
    (repo / "model-00001-of-00001.safetensors").write_bytes(os.urandom(24 << 20))
    token = "hf_TESTtoken_0123456789abcdef"
    with FakeHub("org/tiny", str(repo)) as hub:
        shard = "model-00001-of-00001.safetensors"
        hub.stop_after[shard] = 16 << 20  # the first download breaks off after 16 MiB
        env = {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": token, "HF_HOME": str(tmp_path / "hf-home"),
               "HF_HUB_DISABLE_TELEMETRY": "1"}
        args = ("-i", str(REPO_INVENTORY), "model", "sync", "--source", "hf:org/tiny", "--download-only",
                "--download-dir", str(tmp_path / "dl"), "--json")
        result = run_cli(*args, env=env, timeout=300)
        assert result.code == 0, result
        assert token not in result.stdout + result.stderr
        assert result.json() == {"source": "hf:org/tiny", "hosts": []}
        for name in hub.files:
            assert (tmp_path / "dl" / name).read_bytes() == (repo / name).read_bytes()
        gets = [r for r in hub.requests if r["method"] == "GET" and r["path"].endswith("/" + shard)]
        # huggingface_hub writes in 10 MiB blocks: it continued from the last whole block, not from 0.
        starts = [int(r["range"][6:].split("-")[0]) for r in gets if r["range"]]
        assert starts and 0 < starts[0] <= 16 << 20, gets
        assert {r["auth"] for r in hub.requests} == {f"Bearer {token}"}  # sent, as a header only
        kept = json.loads((tmp_path / "dl" / agent.MANIFEST_NAME).read_text())
        assert kept["files"][shard]["sha256"] == hub.files[shard]["sha256"]
        # A rerun downloads nothing.
        before = len(hub.requests)
        assert run_cli(*args, env=env, timeout=300).code == 0
        assert not [r for r in hub.requests[before:] if r["method"] == "GET" and "/resolve/" in r["path"]]


@pytest.mark.integration
def test_hub_content_that_differs_from_its_sha256_is_refused(checkpoint, tmp_path):
    with FakeHub("org/tiny", str(checkpoint)) as hub:
        shard = sorted(n for n in hub.files if n.endswith(".safetensors"))[0]
        hub.lie_about[shard] = "0" * 64
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
        result = run_cli("-i", str(REPO_INVENTORY), "model", "sync", "--source", "hf:org/tiny", "--download-only",
                         "--download-dir", str(tmp_path / "dl"), env=env, timeout=300)
    assert result.code == 1, result
    assert shard in result.stderr and "the hub says" in result.stderr and "Traceback" not in result.stderr


def test_bad_input_is_one_line_exit_2(tmp_path):
    for args, field in ((["--source", "hf:not-a-repo"], "--source"),
                        (["--source", str(tmp_path / "absent")], "--source"),
                        (["--source", str(tmp_path), "--from", "nope"], "--from"),
                        (["--source", str(tmp_path), "--without-engram-tables"], "--without-engram-tables")):
        result = run_cli("-i", str(REPO_INVENTORY), "model", "sync", *args)
        assert result.code == 2, result
        assert field in result.stderr and "Traceback" not in result.stderr


REPO_INVENTORY = Path(__file__).resolve().parent.parent / "inventory.example.yaml"


@pytest.mark.integration
def test_the_bandwidth_limit_holds_each_stream(checkpoint, tmp_path, agent_file):
    import time

    manifest = agent.build(str(checkpoint), "sha256")
    total = sum(e["size"] for e in manifest["files"].values())
    rate = total / 1e6 / 2.0  # MB/s that make the whole copy last two seconds
    started = time.monotonic()
    result = send(checkpoint, tmp_path / "dest", manifest, agent_file, bwlimit=rate)
    assert result["ok"], result
    assert time.monotonic() - started >= 1.9  # a lower bound: a loaded machine is only slower


@pytest.mark.integration
def test_one_writer_per_copy(checkpoint, tmp_path, agent_file):
    import fcntl

    manifest = agent.build(str(checkpoint), "sha256")
    dest = tmp_path / "dest"
    dest.mkdir()
    held = os.open(dest, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # another sync is writing here
    try:
        busy = send(checkpoint, dest, manifest, agent_file)
        assert not busy["ok"] and busy["error"] == f"another model sync is writing into {dest}", busy
        assert list(dest.iterdir()) == []
    finally:
        os.close(held)
    assert send(checkpoint, dest, manifest, agent_file)["ok"]


@pytest.mark.integration
def test_a_part_that_shrank_since_the_check_is_dropped_not_continued(checkpoint, tmp_path, agent_file):
    manifest = agent.build(str(checkpoint), "sha256")
    name = max(manifest["files"], key=lambda n: manifest["files"][n]["size"])
    entry, data = manifest["files"][name], (checkpoint / name).read_bytes()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / (name + agent.PART_SUFFIX)).write_bytes(data[:1000])  # the check saw 2000 bytes; 1000 are left
    header = {"file": name, "offset": 2000, "size": entry["size"], "algo": "sha256", "digest": entry["sha256"]}
    proc = subprocess.run(["python3", agent_file, "receive", str(dest)], capture_output=True, timeout=60,
                          input=(json.dumps(header) + "\n").encode() + data[2000:])
    line = json.loads(proc.stdout.decode().splitlines()[-1])
    assert proc.returncode == 1 and line["ok"] is False and "shrank to 1000 bytes" in line["error"], line
    assert not (dest / name).exists() and not (dest / (name + agent.PART_SUFFIX)).exists()


def test_pack_engram_local_reads_a_kept_manifest(tmp_path):
    source = Path(make_checkpoint(str(tmp_path / "ckpt"), vocab_size=3000, files=2, table_files=True).path)
    manifest = agent.build(str(source), "sha256")
    del manifest["problems"]
    index = json.loads((source / "model.safetensors.index.json").read_text())
    tables = sorted({f for t, f in index["weight_map"].items() if ".engram.embed." in t})
    pack = ("-i", str(REPO_INVENTORY), "pack-engram", "-p", "sandbox", "--set", "engram.mode=disk",
            "-c", str(source), "--dry-run")
    (source / agent.MANIFEST_NAME).write_text(json.dumps(manifest))
    assert run_cli(*pack).code == 0
    os.truncate(source / tables[1], (source / tables[1]).stat().st_size - 1)
    truncated = run_cli(*pack)
    assert truncated.code == 2 and f"{tables[1]} is " in truncated.stderr and "manifest says" in truncated.stderr, truncated
    (source / agent.MANIFEST_NAME).write_text(json.dumps(without(manifest, tables)))
    for name in tables:
        os.unlink(source / name)
    left_out = run_cli(*pack)
    assert left_out.code == 2 and "left out by `model sync --without-engram-tables`" in left_out.stderr, left_out
    assert "Traceback" not in truncated.stderr + left_out.stderr
