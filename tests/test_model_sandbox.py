"""model sync against the sandbox cluster: real sshd per host, real files on each host's NVMe.

Every test syncs into its own model_dir (an inventory copy with another ``paths.model_dir``), so the
tests neither see each other's copies nor touch what other suites put in /mnt/nvme.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clirun import REPO, run_cli
from sandbox_fixture import give_to_user, sandbox_cluster  # noqa: F401  (the session's cluster)
from sparkctl.commands import probes
from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.model.agent import MANIFEST_NAME, PART_SUFFIX
from sparkctl.ops.doctor import verdicts

pytestmark = pytest.mark.sandbox


class Site:
    """One test's view of the cluster: its inventory file and each host's model_dir on this machine."""

    def __init__(self, cluster, tmp_path: Path, label: str):
        import shutil

        self.cluster = cluster
        self.model_dir = f"/mnt/nvme/model-tests/{label}"
        text = Path(cluster.info.inventory).read_text()
        assert "model_dir: /mnt/nvme/models/DeepSeek-V4.1-Flash\n" in text
        text = text.replace("model_dir: /mnt/nvme/models/DeepSeek-V4.1-Flash\n", f"model_dir: {self.model_dir}\n")
        self.inventory = tmp_path / "inventory.yaml"
        self.inventory.write_text(text)
        self.hosts = list(cluster.info.hosts)
        for host in self.hosts:
            shutil.rmtree(self.local(host, self.model_dir), ignore_errors=True)

    @staticmethod
    def local(host, path: str) -> Path:
        """Where a host's /mnt/nvme/... lives on the control machine."""
        return Path(host.nvme_dir) / Path(path).relative_to("/mnt/nvme")

    def copy(self, host) -> Path:
        return self.local(host, self.model_dir)

    def sync(self, *args: str, timeout: float = 300):
        return run_cli("-i", str(self.inventory), "--json", "model", "sync", *args, timeout=timeout)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "sparkctl", "-i", str(self.inventory), "--json", "model", "sync", *args]


def by_host(result) -> dict:
    return {h["name"]: h for h in result.json()["hosts"]}


def same_files(source: Path, copy: Path, skip=()) -> None:
    names = sorted(p.name for p in source.iterdir() if p.name not in skip)
    assert sorted(p.name for p in copy.iterdir() if p.name != MANIFEST_NAME) == names
    for name in names:
        assert (copy / name).read_bytes() == (source / name).read_bytes(), name


def test_sync_then_nothing_then_only_the_damaged_files(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "repair")
    source = Path(make_checkpoint(tmp_path / "ckpt", vocab_size=5000, files=4, seed=1).path)
    sizes = {p.name: p.stat().st_size for p in source.iterdir()}
    total = sum(sizes.values())

    planned = site.sync("--source", str(source), "--dry-run")
    assert planned.code == 0, planned
    assert planned.json()["dry_run"] is True
    assert {h["status"] for h in planned.json()["hosts"]} == {"planned"}
    assert not any(site.copy(h).exists() and any(site.copy(h).iterdir()) for h in site.hosts)

    first = site.sync("--source", str(source))
    assert first.code == 0, first
    assert first.json()["source"] == str(source)
    # Progress: bytes per host and in total (on stderr; stdout is the one JSON document).
    progress = [line for line in first.stderr.splitlines() if line.strip().startswith("sent ")]
    assert progress and all(h.name in progress[-1] for h in site.hosts), first.stderr
    for host in site.hosts:
        row = by_host(first)[host.name]
        assert row["status"] == "synced" and row["files_sent"] == len(sizes) and row["bytes_sent"] == total, row
        same_files(source, site.copy(host))
        kept = json.loads((site.copy(host) / MANIFEST_NAME).read_text())
        assert {n: e["size"] for n, e in kept["files"].items()} == sizes
        assert not list(site.copy(host).glob("*" + PART_SUFFIX))

    again = site.sync("--source", str(source))
    assert again.code == 0, again
    assert all(h["status"] == "unchanged" and h["bytes_sent"] == 0 for h in again.json()["hosts"]), again

    shards = sorted(n for n in sizes if n.endswith(".safetensors"))
    truncated_host, flipped_host, clean_host = site.hosts
    truncated = site.copy(truncated_host) / shards[0]
    os.truncate(truncated, sizes[shards[0]] - 12345)
    flipped = site.copy(flipped_host) / shards[1]
    with open(flipped, "r+b") as handle:  # one byte, far from the first MiB
        handle.seek(sizes[shards[1]] - 7)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x80]))
    untouched = {n: (site.copy(truncated_host) / n).stat().st_ino for n in sizes if n != shards[0]}

    repaired = site.sync("--source", str(source))
    assert repaired.code == 0, repaired
    rows = by_host(repaired)
    assert rows[truncated_host.name]["status"] == "synced" and rows[truncated_host.name]["files_sent"] == 1
    assert rows[truncated_host.name]["bytes_sent"] == sizes[shards[0]]
    assert rows[flipped_host.name]["status"] == "synced" and rows[flipped_host.name]["bytes_sent"] == sizes[shards[1]]
    assert rows[clean_host.name]["status"] == "unchanged" and rows[clean_host.name]["bytes_sent"] == 0
    for host in site.hosts:
        same_files(source, site.copy(host))
    assert {n: (site.copy(truncated_host) / n).stat().st_ino for n in untouched} == untouched


def test_from_a_host_to_the_others(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "from")
    head = site.hosts[0]
    folder = "/mnt/nvme/model-tests/from-source"
    import shutil

    shutil.rmtree(site.local(head, folder), ignore_errors=True)
    source = Path(make_checkpoint(site.local(head, folder), vocab_size=3000, files=3, seed=2).path)
    give_to_user(head.nvme_dir)  # the login user's, as on a real box
    total = sum(p.stat().st_size for p in source.iterdir())
    result = site.sync("--source", folder, "--from", head.name, "--bwlimit", "50")
    assert result.code == 0, result
    rows = by_host(result)
    assert set(rows) == {h.name for h in site.hosts}  # the head's own model_dir is another folder: it gets a copy too
    for host in site.hosts:
        assert rows[host.name]["status"] == "synced" and rows[host.name]["bytes_sent"] == total, rows
        same_files(source, site.copy(host))
    # The source folder itself is left as it was (no manifest, no part files written there).
    assert not (source / MANIFEST_NAME).exists()
    assert site.sync("--source", folder, "--from", head.name).json()["hosts"][1]["status"] == "unchanged"
    # A folder the host does not have: one line naming host and folder, exit 1.
    absent = site.sync("--source", "/mnt/nvme/model-tests/absent", "--from", head.name)
    assert absent.code == 1 and "Traceback" not in absent.stderr, absent
    assert head.name in absent.stderr and "no such folder: /mnt/nvme/model-tests/absent" in absent.stderr


def test_a_killed_sync_resumes_without_resending_what_arrived(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "resume")
    source = Path(make_checkpoint(tmp_path / "ckpt", vocab_size=12000, files=2, seed=3).path)
    sizes = {p.name: p.stat().st_size for p in source.iterdir()}
    total = sum(sizes.values())
    proc = subprocess.Popen(site.argv("--source", str(source), "--bwlimit", "2"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)})

    def on_disk(host) -> int:
        folder = site.copy(host)
        if not folder.exists():
            return 0
        return sum(p.stat().st_size for p in folder.iterdir() if p.name != MANIFEST_NAME)

    deadline = time.monotonic() + 240
    while min(on_disk(h) for h in site.hosts) < total // 3:
        assert proc.poll() is None, "the sync ended before it could be killed"
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Wait for the receivers to see the end of their streams and settle.
    stable, last = 0, None
    while stable < 6:
        now = [on_disk(h) for h in site.hosts]
        stable = stable + 1 if now == last else 0
        last = now
        time.sleep(0.5)
    arrived = dict(zip([h.name for h in site.hosts], last))
    assert all(0 < n < total for n in arrived.values()), arrived
    assert any(list(site.copy(h).glob("*" + PART_SUFFIX)) for h in site.hosts)
    for host in site.hosts:  # nothing half-written under a final name
        for path in site.copy(host).iterdir():
            if not path.name.endswith(PART_SUFFIX) and path.name != MANIFEST_NAME:
                assert path.read_bytes() == (source / path.name).read_bytes(), path

    resumed = site.sync("--source", str(source))
    assert resumed.code == 0, resumed
    for host in site.hosts:
        row = by_host(resumed)[host.name]
        assert row["status"] == "synced" and row["bytes_sent"] == total - arrived[host.name], (row, arrived)
        same_files(source, site.copy(host))
        assert not list(site.copy(host).glob("*" + PART_SUFFIX))


def test_a_host_too_small_is_refused_before_anything_is_sent(sandbox_cluster, tmp_path):
    from sparkctl.sandbox import cluster

    site = Site(sandbox_cluster, tmp_path, "small")
    source = Path(make_checkpoint(tmp_path / "ckpt", vocab_size=3000, files=2, seed=4).path)
    total = sum(p.stat().st_size for p in source.iterdir())
    small = site.hosts[2]
    site.copy(small).mkdir(parents=True)
    give_to_user(small.nvme_dir)
    mounted = cluster.exec_in_host(sandbox_cluster.info, small.name,
                                   ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", site.model_dir])
    assert mounted.returncode == 0, mounted.stderr
    try:
        result = site.sync("--source", str(source))
        assert result.code == 1, result
        rows = by_host(result)
        row = rows[small.name]
        assert row["status"] == "failed" and row["bytes_sent"] == 0
        assert "not enough room" in row["error"] and f"({total} bytes)" in row["error"], row
        assert all(rows[h.name]["status"] == "synced" for h in site.hosts if h is not small)
        listing = cluster.exec_in_host(sandbox_cluster.info, small.name, ["ls", "-A", site.model_dir])
        assert listing.returncode == 0 and listing.stdout.strip() == b""
        assert small.name in result.stderr and "not enough room" in result.stderr
    finally:
        cluster.exec_in_host(sandbox_cluster.info, small.name, ["umount", site.model_dir])


def test_without_the_engram_tables_on_an_engram_on_disk_profile(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "no-tables")
    source = Path(make_checkpoint(tmp_path / "ckpt", vocab_size=5000, files=2, seed=5, table_files=True).path)
    index = json.loads((source / "model.safetensors.index.json").read_text())
    tables = sorted({f for t, f in index["weight_map"].items() if ".engram.embed." in t})
    assert len(tables) == 2
    saved = sum((source / n).stat().st_size for n in tables)

    refused = site.sync("--source", str(source), "-p", "sandbox", "--set", "engram.mode=memory", "--without-engram-tables")
    assert refused.code == 2 and "engram.mode=memory" in refused.stderr, refused

    result = site.sync("--source", str(source), "-p", "sandbox", "--set", "engram.mode=disk", "--without-engram-tables")
    assert result.code == 0, result
    total = sum(p.stat().st_size for p in source.iterdir())
    for host in site.hosts:
        row = by_host(result)[host.name]
        assert row["bytes_sent"] == total - saved, row
        same_files(source, site.copy(host), skip=tables)
        kept = json.loads((site.copy(host) / MANIFEST_NAME).read_text())
        assert sorted(kept["left_out"]) == tables
        # doctor's checkpoint check (its probe run on the host) knows why they are absent.
        from sparkctl.sandbox import cluster

        probe = cluster.exec_in_host(sandbox_cluster.info, host.name, probes.checkpoint_argv(site.model_dir))
        verdict = verdicts.check_checkpoint(probes.parse_checkpoint(probe.stdout.decode()), site.model_dir)
        assert verdict.status == "pass" and "left out" in verdict.detail, verdict


def test_pack_engram_on_hosts_reads_the_kept_manifest(sandbox_cluster, tmp_path):
    site = Site(sandbox_cluster, tmp_path, "pack")
    engram_dir = "/mnt/nvme/model-tests/pack-engram"
    site.inventory.write_text(site.inventory.read_text().replace("engram_dir: /mnt/nvme/engram\n", f"engram_dir: {engram_dir}\n"))
    source = Path(make_checkpoint(tmp_path / "ckpt", vocab_size=3000, files=2, seed=6, table_files=True).path)
    tables = sorted({f for t, f in json.loads((source / "model.safetensors.index.json").read_text())["weight_map"].items()
                     if ".engram.embed." in t})
    pack = ("-i", str(site.inventory), "--json", "pack-engram", "-p", "sandbox", "--set", "tensor_parallel=3",
            "--set", "engram.mode=disk", "--source", "on-hosts")

    assert site.sync("--source", str(source), "-p", "sandbox", "--set", "engram.mode=disk",
                     "--without-engram-tables").code == 0
    refused = run_cli(*pack)  # no host can be the reference: one line naming each host's problem
    assert refused.code == 1, refused
    for host in site.hosts:
        assert f"{host.name}: {site.model_dir}/{tables[0]} was left out by `model sync --without-engram-tables`" in refused.stderr
    assert "--source local" in refused.stderr and "Traceback" not in refused.stderr

    full = site.sync("--source", str(source))
    assert full.code == 0 and all(h["files_sent"] == len(tables) for h in full.json()["hosts"]), full
    damaged = site.hosts[1]
    table = site.copy(damaged) / tables[0]
    os.truncate(table, table.stat().st_size - 64)
    proc = run_cli(*pack)
    assert proc.code == 1, proc
    rows = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert "model sync's manifest says" in rows[damaged.name]["error"] and tables[0] in rows[damaged.name]["error"]
    assert damaged.name in rows[damaged.name]["error"]


def test_from_the_hub_once_then_to_every_host(sandbox_cluster, tmp_path):
    from hubserver import FakeHub

    site = Site(sandbox_cluster, tmp_path, "hub")
    source = Path(make_checkpoint(tmp_path / "repo", vocab_size=3000, files=2, seed=8).path)
    token = "hf_SANDBOXtoken_fedcba9876543210"
    with FakeHub("deepseek-ai/Tiny-Flash", str(source)) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_TOKEN": token, "HF_HOME": str(tmp_path / "hf-home"),
               "HF_HUB_DISABLE_TELEMETRY": "1"}
        result = run_cli("-i", str(site.inventory), "--json", "model", "sync", "--source",
                         "hf:deepseek-ai/Tiny-Flash@main", "--download-dir", str(tmp_path / "dl"), env=env, timeout=300)
        assert result.code == 0, result
        assert token not in result.stdout + result.stderr
        downloads = [r for r in hub.requests if r["method"] == "GET" and "/resolve/" in r["path"]]
        assert len(downloads) == len(hub.files)  # once, whatever the number of hosts
        doc = result.json()
        assert doc["source"] == "hf:deepseek-ai/Tiny-Flash@main"
        for host in site.hosts:
            assert by_host(result)[host.name]["status"] == "synced"
            same_files(source, site.copy(host))
            kept = json.loads((site.copy(host) / MANIFEST_NAME).read_text())
            for name, meta in hub.files.items():
                if name.endswith(".safetensors"):  # the hub's LFS sha256, kept with every copy
                    assert kept["files"][name]["sha256"] == meta["sha256"]


def test_a_link_lost_mid_file_is_resumed_in_the_same_run(sandbox_cluster, tmp_path):
    """The session carrying one host's stream dies mid-file (its sshd session killed): that host's
    round fails, the retry checks it again and continues from the part it kept."""
    from sparkctl.sandbox import cluster, procs

    site = Site(sandbox_cluster, tmp_path, "lost-link")
    # ~20 MB at 3 MB/s a host: the cut comes at 2 MiB, seconds before the stream could end (a loaded
    # machine only slows the stream, which widens that margin).
    source = Path(make_checkpoint(tmp_path / "ckpt", vocab_size=6000, files=2, seed=9).path)
    total = sum(p.stat().st_size for p in source.iterdir())
    victim = site.hosts[1]
    proc = subprocess.Popen(site.argv("--source", str(source), "--bwlimit", "3"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    listener = cluster.host_pids(sandbox_cluster.info, victim.name)["sshd"]

    def receivers() -> list[int]:
        found = []
        for pid in procs.descendants(listener):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"receive" in cmdline and any(part.endswith(b"agent.pyz") for part in cmdline):
                found.append(pid)
        return found

    deadline = time.monotonic() + 240
    while not list(site.copy(victim).glob("*" + PART_SUFFIX)) or \
            sum(p.stat().st_size for p in site.copy(victim).glob("*" + PART_SUFFIX)) < 2 << 20:
        assert proc.poll() is None and time.monotonic() < deadline, "no progress before the link could be cut"
        time.sleep(0.1)
    sessions = {procs.parent_of(pid) for pid in receivers()}
    assert sessions, "the receiver was not found"
    procs.signal_pids([pid for pid in sessions if pid], signal.SIGKILL)  # the link carrying the stream is gone
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr + stdout
    rows = {h["name"]: h for h in json.loads(stdout)["hosts"]}
    assert all(row["status"] == "synced" for row in rows.values()), rows
    assert f"retrying {victim.name}" in stderr
    retry_plan = [line for line in stderr.splitlines() if line.strip().startswith(victim.name) and "resuming" in line]
    assert retry_plan, stderr
    for host in site.hosts:
        same_files(source, site.copy(host))
    assert rows[site.hosts[0].name]["bytes_sent"] == total


def test_from_the_hub_through_one_host_to_the_others(sandbox_cluster, tmp_path):
    """--from HOST with a hub source: downloaded here, sent to HOST once, HOST sends to the others."""
    from hubserver import FakeHub

    site = Site(sandbox_cluster, tmp_path, "hub-relay")
    relay, last = site.hosts[0], site.hosts[2]
    source = Path(make_checkpoint(tmp_path / "repo", vocab_size=3000, files=2, seed=10, table_files=True).path)
    tables = sorted({f for t, f in json.loads((source / "model.safetensors.index.json").read_text())["weight_map"].items()
                     if ".engram.embed." in t})
    log = Path(last.logfile("sshd"))
    log_before = log.stat().st_size
    with FakeHub("deepseek-ai/Tiny-Flash", str(source)) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
        result = run_cli("-i", str(site.inventory), "--json", "model", "sync", "--source", "hf:deepseek-ai/Tiny-Flash",
                         "--from", relay.name, "-p", "sandbox", "--set", "engram.mode=disk", "--without-engram-tables",
                         "--download-dir", str(tmp_path / "dl"), env=env, timeout=300)
        assert result.code == 0, result
        assert len([r for r in hub.requests if r["method"] == "GET" and "/resolve/" in r["path"]]) == len(hub.files)
    doc = result.json()
    assert doc["source"] == "hf:deepseek-ai/Tiny-Flash" and [h["name"] for h in doc["hosts"]] == [h.name for h in site.hosts]
    total = sum(p.stat().st_size for p in source.iterdir() if p.name not in tables)
    for host in site.hosts:
        row = by_host(result)[host.name]
        assert row["status"] == "synced" and row["bytes_sent"] == total, row
        same_files(source, site.copy(host), skip=tables)
        assert sorted(json.loads((site.copy(host) / MANIFEST_NAME).read_text())["left_out"]) == tables
    # Host to host: the relay itself logged in to the last host over the fabric.
    with open(log, errors="replace") as handle:
        handle.seek(log_before)
        assert f"Accepted publickey for nvidia from {relay.fabric_address} " in handle.read()
