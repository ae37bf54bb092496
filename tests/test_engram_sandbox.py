"""pack-engram against the sandbox cluster: real sshd per host, real files on each host's NVMe.

Every test packs into its own engram dir (an inventory copy with another ``paths.engram_dir``), so
tests neither see each other's shards nor touch what other suites put in /mnt/nvme.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash

from clirun import run_cli
from sandbox_fixture import give_to_user, sandbox_cluster  # noqa: F401  (the session's cluster)
from sparkctl.engram.checkpoint_maker import make_checkpoint

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parent.parent
TP = "tensor_parallel=3"  # the test cluster has 3 hosts


def engram_cli(*args: str, timeout: float = 300):
    """``sparkctl ARGS`` in this process (tests/clirun.py): a fresh interpreter per call cost ~1 s of CPU."""
    return run_cli(*args, timeout=timeout)


class Site:
    """One test's view of the cluster: its inventory file and each host's engram dir on this machine."""

    def __init__(self, cluster, tmp_path: Path, label: str):
        self.cluster = cluster
        self.engram_dir = f"/mnt/nvme/engram-tests/{label}"
        self.model_dir = f"/mnt/nvme/engram-tests/{label}-model"
        text = Path(cluster.info.inventory).read_text()
        assert "engram_dir: /mnt/nvme/engram\n" in text
        text = text.replace("engram_dir: /mnt/nvme/engram\n", f"engram_dir: {self.engram_dir}\n")
        text = text.replace("model_dir: /mnt/nvme/models/DeepSeek-V4.1-Flash\n", f"model_dir: {self.model_dir}\n")
        self.inventory = tmp_path / "inventory.yaml"
        self.inventory.write_text(text)
        self.hosts = list(cluster.info.hosts)
        for host in self.hosts:
            shutil.rmtree(self.local(host, self.engram_dir), ignore_errors=True)
            shutil.rmtree(self.local(host, self.model_dir), ignore_errors=True)

    @staticmethod
    def local(host, path: str) -> Path:
        """Where a host's /mnt/nvme/... lives on the control machine."""
        return Path(host.nvme_dir) / Path(path).relative_to("/mnt/nvme")

    def shard_dir(self, rank: int) -> Path:
        return self.local(self.hosts[rank], self.engram_dir)

    def pack(self, *args: str, timeout: float = 300):
        return engram_cli("-i", str(self.inventory), "--json", "pack-engram", "-p", "sandbox", "--set", TP, *args, timeout=timeout)


def numpy_tables(folder: Path) -> dict[str, np.ndarray]:
    """Engram tensors as (rows, row_bytes) uint8 memmaps, read with numpy and the format alone."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out = {}
    for file_name in sorted(set(index["weight_map"].values())):
        with open(folder / file_name, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, entry in header.items():
            if ".engram.embed." in name:
                begin, end = entry["data_offsets"]
                data = np.memmap(folder / file_name, dtype=np.uint8, mode="r", offset=8 + n + begin, shape=(end - begin,))
                out[name] = data.reshape(entry["shape"][0], -1)
    return out


def assert_hosts_hold_numpy_slices(site: Site, checkpoint: Path, layout: dict) -> None:
    tables = numpy_tables(checkpoint)
    for layer in layout["layers"]:
        for rank in layer["ranks"]:
            name = f"engram-l{layer['layer']}-r{rank['rank']}of{layout['tp']}"
            data = (site.shard_dir(rank["rank"]) / f"{name}.bin").read_bytes()
            a, b = rank["start"], rank["end"]
            weight = tables[f"model.layers.{layer['layer']}.engram.embed.weight"][a:b]
            scale = tables[f"model.layers.{layer['layer']}.engram.embed.scale"][a:b]
            assert data == weight.tobytes() + scale.tobytes(), name
            manifest = json.loads((site.shard_dir(rank["rank"]) / f"{name}.json").read_text())
            assert manifest["xxh3_128"] == xxhash.xxh3_128(data).hexdigest()
            # The sandbox hosts' python3 has no xxhash: the host recorded a sha256 it can re-check.
            assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
            assert manifest["rows"] == [a, b] and manifest["size"] == rank["bytes"] == len(data)
            assert [t["offset"] for t in manifest["tensors"]] == [0, weight.nbytes]


def layout_of(site: Site, checkpoint: Path) -> dict:
    proc = site.pack("-c", str(checkpoint), "--dry-run")
    assert proc.returncode == 0, proc.stderr or proc.stdout[-4000:]  # with --json the reason is in the document
    return json.loads(proc.stdout)


def test_packed_shards_on_hosts_are_numpy_slices_and_a_rerun_skips_them(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "slices")
    checkpoint = tmp_path / "ckpt"
    make_checkpoint(checkpoint, vocab_size=3000, head_dim=64, files=3, seed=11)
    layout = layout_of(site, checkpoint)
    assert [r["host"] for r in layout["layers"][0]["ranks"]] == [h.name for h in site.hosts]

    proc = site.pack("-c", str(checkpoint))
    assert proc.returncode == 0, proc.stderr or proc.stdout[-4000:]  # with --json the reason is in the document
    report = json.loads(proc.stdout)
    assert report["ok"] and report["mode"] == "push" and report["stage"] == "done"
    assert {s["action"] for h in report["hosts"] for s in h["shards"]} == {"written"}
    assert_hosts_hold_numpy_slices(site, checkpoint, layout)
    # Each host holds only its own rank's shards, and no temporary names are left behind.
    for rank, host in enumerate(site.hosts):
        names = sorted(p.name for p in site.shard_dir(rank).iterdir() if not p.name.startswith("."))
        assert names == sorted([f"engram-l{l}-r{rank}of3.{ext}" for l in (1, 14) for ext in ("bin", "json")])

    again = site.pack("-c", str(checkpoint))
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert {s["action"] for h in second["hosts"] for s in h["shards"]} == {"skipped"}
    assert all(h["needed_bytes"] == 0 for h in second["hosts"])

    verify = site.pack("-c", str(checkpoint), "--verify")
    assert verify.returncode == 0, verify.stderr
    checked = json.loads(verify.stdout)
    assert checked["ok"] and {s["status"] for h in checked["hosts"] for s in h["shards"]} == {"ok"}


def receivers_shipped_to(engram_dir: str) -> set[str]:
    """The folders of the shipped host programs now receiving into ``engram_dir`` (from /proc)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if len(argv) > 3 and argv[1].endswith("/engram.pyz") and argv[2] == "receive" and argv[3] == engram_dir:
            found.add(os.path.dirname(argv[1]))
    return found


def test_a_killed_pack_resumes_where_it_stopped(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "resume")
    checkpoint = tmp_path / "ckpt"
    # ~100 MiB per shard: long enough to be caught mid-write.
    make_checkpoint(checkpoint, vocab_size=50000, head_dim=256, files=2, seed=5)
    layout = layout_of(site, checkpoint)
    env = {k: v for k, v in os.environ.items() if k != "SPARKCTL_INVENTORY"}
    proc = subprocess.Popen([sys.executable, "-m", "sparkctl", "-i", str(site.inventory), "pack-engram",
                             "-p", "sandbox", "--set", TP, "-c", str(checkpoint)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partials: list[Path] = []
    shipped: set[str] = set()  # the folders the hosts' receivers run from (/tmp is the machine's own)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            partials = [p for r in range(3) if site.shard_dir(r).is_dir()
                        for p in site.shard_dir(r).glob("*.bin.partial") if p.stat().st_size > 8 * 2**20]
            shipped |= receivers_shipped_to(site.engram_dir)
            if partials and shipped:
                break
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert partials, "the pack finished before it could be interrupted"
    # Each host's receiver saw its sender go, flushed what it got and removed the folder it was shipped
    # to: the sizes are read after that, whenever it happens. A receiver that started after the last
    # look above (another rank's, still starting then) counts too: the pack is gone, so no new one
    # starts, and the sizes are read once none is left.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shipped |= receivers_shipped_to(site.engram_dir)
        if not [f for f in shipped if os.path.exists(f)] and not receivers_shipped_to(site.engram_dir):
            break
        time.sleep(0.2)
    assert shipped and not [f for f in shipped if os.path.exists(f)]
    interrupted = {}
    for rank in range(3):
        for partial in site.shard_dir(rank).glob("*.bin.partial"):
            name = partial.name[: -len(".partial")]
            interrupted[name] = partial.stat().st_size
            # Half-written data never carries the final name.
            assert not (site.shard_dir(rank) / name).exists()
            assert not (site.shard_dir(rank) / name.replace(".bin", ".json")).exists()
    assert interrupted

    proc2 = site.pack("-c", str(checkpoint))
    assert proc2.returncode == 0, proc2.stderr
    report = json.loads(proc2.stdout)
    shards = {s["file"]: s for h in report["hosts"] for s in h["shards"]}
    resumed = [s for s in shards.values() if s["action"] == "resumed"]
    assert resumed, shards
    for shard in resumed:
        assert shard["resumed_from"] == interrupted[shard["file"]] > 0
        size = next(r["bytes"] for l in layout["layers"] for r in l["ranks"]
                    if f"engram-l{l['layer']}-r{r['rank']}of3.bin" == shard["file"])
        assert shard["bytes"] == size - shard["resumed_from"]  # only the rest was sent
    assert_hosts_hold_numpy_slices(site, checkpoint, layout)
    assert not [p for r in range(3) for p in site.shard_dir(r).glob("*.partial*")]


def test_a_host_whose_nvme_is_too_small_fails_before_anything_is_written(sandbox_cluster, tmp_path):
    from sparkctl.sandbox import cluster

    site = Site(sandbox_cluster, tmp_path, "small")
    checkpoint = tmp_path / "ckpt"
    make_checkpoint(checkpoint, vocab_size=3000, head_dim=64, files=2)
    small = site.hosts[1]
    site.local(small, site.engram_dir).mkdir(parents=True)
    give_to_user(small.nvme_dir)
    # A real 64 KiB filesystem at that host's engram dir, inside its own mount namespace.
    mounted = cluster.exec_in_host(sandbox_cluster.info, small.name,
                                   ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", site.engram_dir])
    assert mounted.returncode == 0, mounted.stderr
    try:
        proc = site.pack("-c", str(checkpoint))
        assert proc.returncode == 1, proc
        report = json.loads(proc.stdout)
        assert report["stage"] == "space" and not report["ok"]
        by_host = {h["host"]: h for h in report["hosts"]}
        assert by_host[small.name]["cause"] == "space"
        assert "not enough free space" in by_host[small.name]["error"]
        assert by_host[small.name]["free_bytes"] < by_host[small.name]["needed_bytes"]
        assert all(by_host[h.name]["ok"] for h in site.hosts if h.name != small.name)
        # Nothing was written anywhere, not even on the hosts with room.
        for rank, host in enumerate(site.hosts):
            folder = site.shard_dir(rank)
            assert not folder.exists() or not [p for p in folder.iterdir() if p.name.startswith("engram-")]
        listing = cluster.exec_in_host(sandbox_cluster.info, small.name, ["ls", "-A", site.engram_dir])
        assert listing.returncode == 0 and listing.stdout.strip() == b""
    finally:
        cluster.exec_in_host(sandbox_cluster.info, small.name, ["umount", site.engram_dir])


def test_a_corrupted_shard_is_caught_by_verify_and_rewritten_by_the_next_pack(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "corrupt")
    checkpoint = tmp_path / "ckpt"
    make_checkpoint(checkpoint, vocab_size=2000, head_dim=64, files=2, seed=2)
    layout = layout_of(site, checkpoint)
    assert site.pack("-c", str(checkpoint)).returncode == 0
    victim = site.shard_dir(2) / "engram-l14-r2of3.bin"
    with open(victim, "r+b") as f:
        f.seek(12345)
        byte = f.read(1)
        f.seek(12345)
        f.write(bytes([byte[0] ^ 0xFF]))

    proc = site.pack("-c", str(checkpoint), "--verify")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    statuses = {(h["host"], s["file"]): s["status"] for h in report["hosts"] for s in h["shards"]}
    assert statuses.pop((site.hosts[2].name, "engram-l14-r2of3.bin")) == "corrupt"
    assert set(statuses.values()) == {"ok"} and len(statuses) == 5
    bad_host = next(h for h in report["hosts"] if h["host"] == site.hosts[2].name)
    assert not bad_host["ok"] and "corrupt" in bad_host["error"]

    repaired = site.pack("-c", str(checkpoint))
    assert repaired.returncode == 0, repaired.stderr
    actions = {s["file"]: s["action"] for h in json.loads(repaired.stdout)["hosts"] for s in h["shards"]}
    assert actions.pop("engram-l14-r2of3.bin") == "replaced" and set(actions.values()) == {"skipped"}
    assert_hosts_hold_numpy_slices(site, checkpoint, layout)


def test_on_hosts_mode_cuts_from_each_hosts_copy_and_refuses_a_different_copy(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "onhosts")
    checkpoint = tmp_path / "ckpt"
    make_checkpoint(checkpoint, vocab_size=2500, head_dim=96, files=3, seed=9)
    for host in site.hosts:
        shutil.copytree(checkpoint, site.local(host, site.model_dir))
        give_to_user(host.nvme_dir)  # the login user's, as on a real box
    layout = layout_of(site, checkpoint)

    dry = site.pack("--source", "on-hosts", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == layout  # planned from the hosts' copy: same layout, same bytes

    # One host's copy differs (a file of another size) -> refused before anything is cut anywhere.
    odd = site.local(site.hosts[1], site.model_dir) / "model-00002-of-00003.safetensors"
    with open(odd, "ab") as f:
        f.write(b"\0" * 8)
    proc = site.pack("--source", "on-hosts")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    bad = next(h for h in report["hosts"] if h["host"] == site.hosts[1].name)
    assert not bad["ok"] and "differs" in bad["error"]
    assert not any(site.shard_dir(r).exists() and any(site.shard_dir(r).glob("engram-*")) for r in range(3))

    with open(odd, "r+b") as f:
        f.truncate(odd.stat().st_size - 8)
    proc = site.pack("--source", "on-hosts")
    assert proc.returncode == 0, proc.stderr or proc.stdout[-4000:]  # with --json the reason is in the document
    report = json.loads(proc.stdout)
    assert report["mode"] == "on-hosts" and {s["action"] for h in report["hosts"] for s in h["shards"]} == {"written"}
    assert_hosts_hold_numpy_slices_sha256(site, checkpoint, layout)

    # The same shards from the control machine's copy are recognised as complete.
    push = site.pack("-c", str(checkpoint))
    assert push.returncode == 0, push.stderr
    assert {s["action"] for h in json.loads(push.stdout)["hosts"] for s in h["shards"]} == {"skipped"}


def assert_hosts_hold_numpy_slices_sha256(site: Site, checkpoint: Path, layout: dict) -> None:
    """As above, for shards a host cut itself: its stock python3 has no xxhash, so sha256 only."""
    tables = numpy_tables(checkpoint)
    for layer in layout["layers"]:
        for rank in layer["ranks"]:
            name = f"engram-l{layer['layer']}-r{rank['rank']}of3"
            data = (site.shard_dir(rank["rank"]) / f"{name}.bin").read_bytes()
            a, b = rank["start"], rank["end"]
            expected = (tables[f"model.layers.{layer['layer']}.engram.embed.weight"][a:b].tobytes()
                        + tables[f"model.layers.{layer['layer']}.engram.embed.scale"][a:b].tobytes())
            assert data == expected, name
            manifest = json.loads((site.shard_dir(rank["rank"]) / f"{name}.json").read_text())
            assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
            assert manifest["xxh3_128"] is None


def test_an_unreachable_host_stops_the_pack_before_anything_is_written(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "unreachable")
    checkpoint = tmp_path / "ckpt"
    make_checkpoint(checkpoint, vocab_size=1000, head_dim=64, files=2)
    # The last host's sshd is asked on a port nobody listens on: refused at once.
    text = site.inventory.read_text()
    last = site.hosts[-1]
    marker = f"    address: {last.address}\n"
    assert marker in text
    site.inventory.write_text(text.replace(marker, marker + "    ssh: {port: 2}\n"))
    proc = site.pack("-c", str(checkpoint))
    assert proc.returncode == 1, proc
    report = json.loads(proc.stdout)
    assert report["stage"] == "probe"
    by_host = {h["host"]: h for h in report["hosts"]}
    assert by_host[last.name]["cause"] == "refused" and by_host[last.name]["error"].startswith(last.name)
    assert all(by_host[h.name]["ok"] for h in site.hosts[:-1])
    for rank in range(3):
        assert not site.shard_dir(rank).exists() or not any(site.shard_dir(rank).glob("engram-*"))


def test_a_checkpoint_with_the_same_headers_but_other_tables_is_cut_again(sandbox_cluster, tmp_path):
    """A new download of the tables (same shapes, so the same safetensors headers) must not leave the
    old shards in place: the shards' specs carry a sample of the tensor bytes."""
    site = Site(sandbox_cluster, tmp_path, "revision")
    checkpoint = tmp_path / "ckpt"
    make_checkpoint(checkpoint, vocab_size=2000, head_dim=64, files=2, seed=21)
    layout = layout_of(site, checkpoint)
    assert site.pack("-c", str(checkpoint)).returncode == 0

    revised = tmp_path / "revised"
    make_checkpoint(revised, vocab_size=2000, head_dim=64, files=2, seed=22)
    for path in sorted(checkpoint.glob("*.safetensors")):
        with open(path, "rb") as old, open(revised / path.name, "rb") as new:
            assert old.read(8 + 4096)[:8] == new.read(8)  # same header length ...
        shutil.copyfile(revised / path.name, path)
    assert layout_of(site, checkpoint) == layout  # ... and the same plan: only the bytes changed

    proc = site.pack("-c", str(checkpoint))
    assert proc.returncode == 0, proc.stderr or proc.stdout[-4000:]  # with --json the reason is in the document
    actions = {s["action"] for h in json.loads(proc.stdout)["hosts"] for s in h["shards"]}
    assert actions == {"replaced"}, actions
    assert_hosts_hold_numpy_slices(site, checkpoint, layout)

    # --source on-hosts: a host whose copy is the old revision is refused before anything is cut.
    old = tmp_path / "old"
    make_checkpoint(old, vocab_size=2000, head_dim=64, files=2, seed=21)
    for host in site.hosts:
        shutil.copytree(checkpoint if host is not site.hosts[2] else old, site.local(host, site.model_dir))
    proc = site.pack("--source", "on-hosts")
    assert proc.returncode == 1
    bad = next(h for h in json.loads(proc.stdout)["hosts"] if h["host"] == site.hosts[2].name)
    assert not bad["ok"] and "sampled contents" in bad["error"]
