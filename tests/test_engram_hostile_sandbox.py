"""pack-engram --source on-hosts with one host's copy damaged, on the sandbox: a damaged header is that
host's problem (host and file named, the others still reported); a byte flipped where the sampled
check does not look is found by --full-check; every report says which source check ran."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from sandbox_fixture import sandbox_cluster, give_to_user  # noqa: F401  (the session's cluster)
from sparkctl.engram.checkpoint_maker import make_checkpoint
from test_engram_sandbox import Site

pytestmark = pytest.mark.sandbox

FILE = "model-00001-of-00002.safetensors"


def spread(site, tmp_path, label):
    checkpoint = tmp_path / f"ckpt-{label}"
    make_checkpoint(checkpoint, vocab_size=4000, head_dim=64, files=2, seed=5)
    for host in site.hosts:
        shutil.copytree(checkpoint, site.local(host, site.model_dir))
        give_to_user(host.nvme_dir)  # the login user's, as on a real box
    return site.local(site.hosts[1], site.model_dir) / FILE


def test_a_damaged_header_on_one_host_is_that_hosts_problem(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "badheader")
    victim = spread(site, tmp_path, "h")
    with open(victim, "r+b") as f:
        f.seek(8)
        f.write(b"X")  # the JSON header no longer parses
    proc = site.pack("--source", "on-hosts")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    hosts = {h["host"]: h for h in report["hosts"]}
    bad = hosts.pop(site.hosts[1].name)
    assert not bad["ok"] and site.hosts[1].name in bad["error"] and FILE in bad["error"]
    assert len(hosts) == 2  # the others are reported too
    assert "sampled" in report["source_check"]


def test_a_flipped_byte_outside_the_samples_is_found_by_the_full_check(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "flip")
    victim = spread(site, tmp_path, "f")
    with open(victim, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        begin = header["model.layers.1.engram.embed.weight"]["data_offsets"][0]
        where = 8 + length + begin + 200_000  # between the first two 64 KiB sample blocks of ~12 MB of data
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0xFF]))

    sampled = site.pack("--source", "on-hosts", "--dry-run")
    assert sampled.returncode == 0, sampled.stderr  # the sampled check cannot see it

    proc = site.pack("--source", "on-hosts", "--full-check")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["source_check"].startswith("full")
    bad = next(h for h in report["hosts"] if h["host"] == site.hosts[1].name)
    assert not bad["ok"] and "full check" in bad["error"] and FILE in bad["error"]
    assert not any(site.shard_dir(r).exists() and any(site.shard_dir(r).glob("engram-*")) for r in range(3))

    with open(victim, "r+b") as f:  # repaired: the full check passes and the shards are cut
        f.seek(where)
        f.write(byte)
    proc = site.pack("--source", "on-hosts", "--full-check")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["source_check"].startswith("full")


def test_full_check_needs_on_hosts(cli):
    result = cli("-i", "inventory.example.yaml", "pack-engram", "-p", "tp4", "-c", "/nonexistent", "--full-check")
    assert result.code == 2 and "--full-check" in result.stderr and "on-hosts" in result.stderr
