"""pack-engram's hosts as steps of the one runner: each host's ``shards`` step looks (what is there,
re-hashed), then acts (writes what is missing), told to the run's reporter under the host's name; a
host that cannot take its shards stops the pack before anything is written, the others' steps
``skipped`` saying why; ``--verify`` is a step that only looks. The hosts are this machine (its own
python3 runs the shipped host program, each host with an engram dir of its own); the document keeps
its shape."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.engram.config import load_engram_config
from sparkctl.engram.layout import plan_layout
from sparkctl.engram.safetensors_index import is_engram_tensor, load_tensors
from sparkctl.engram.shards import plan_shards
from sparkctl.ops.engram import PackPlan
from sparkctl.ops.engram_pack import SHARDS, VERIFY, pack, verify
from sparkctl.output import Output
from sparkctl.remote.process import local
from sparkctl.remote.result import RemoteError
from sparkctl.reporter import DONE, LOOKED, STARTED, Reporter

ENGRAM = "/engram-dir-of-the-plan"  # the plan's folder; each host's is its own folder here


class Host:
    """This machine as one host: every path under ENGRAM is the host's own folder; ``free``: what
    its df says (None: the truth); ``unreachable``: a connection that fails with that cause."""

    def __init__(self, name: str, root, free: int | None = None, unreachable: str | None = None):
        self.name, self.root, self.free, self.unreachable = name, str(root), free, unreachable
        self.inner = local()

    def connect(self):
        if self.unreachable:
            raise RemoteError(self.name, self.unreachable, "connection refused")
        return self

    def _mapped(self, argv):
        return [a.replace(ENGRAM, self.root) for a in argv]

    def run(self, argv, *, stdin=None, timeout=None, **kwargs):
        argv = self._mapped(argv)
        if self.free is not None and "df -B1" in " ".join(argv):
            from sparkctl.remote.result import CommandResult

            return CommandResult(0, f"Avail\n{self.free}\n", "", 0.0)
        if stdin is not None and argv[0] == "python3" and argv[2] != "receive":  # a request: its paths too
            stdin = stdin.replace(json.dumps(ENGRAM).encode(), json.dumps(self.root).encode())
        return self.inner.run(argv, stdin=stdin, timeout=timeout, **kwargs)

    def run_stream_in(self, argv, chunks, **kwargs):
        return self.inner.run_stream_in(self._mapped(argv), chunks, **kwargs)


class Pool:
    def __init__(self, hosts):
        self.hosts = {h.name: h for h in hosts}

    def get(self, target):
        return self.hosts[target.name]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    make_checkpoint(folder, vocab_size=300, n_heads=2, files=2, seed=3)
    config = load_engram_config(folder)
    layout = plan_layout(config, 2)
    tensors = load_tensors(folder, lambda n: is_engram_tensor(n, config.layer_ids))
    return PackPlan("p", str(folder), config, layout, [SimpleNamespace(name="h1"), SimpleNamespace(name="h2")],
                    ENGRAM, plan_shards(layout, tensors, str(folder.resolve()), config.source))


INVENTORY = SimpleNamespace(ssh_target=lambda host: SimpleNamespace(name=host.name))


def _out() -> Output:
    out = Output()
    out._reporter = Reporter()  # recorded only: the test reads the events
    return out


def _told(reporter: Reporter, host: str, step: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.status) for e in reporter.events if e.host == host and e.step == step]


def _ended(reporter: Reporter, host: str, step: str):
    return next(e for e in reporter.events if e.host == host and e.step == step and e.kind == DONE)


def test_each_host_writes_its_shards_as_a_step_and_a_rerun_finds_them_verified(plan, tmp_path):
    hosts = [Host("h1", tmp_path / "h1"), Host("h2", tmp_path / "h2")]
    out = _out()
    report = pack(plan, INVENTORY, pool=Pool(hosts), out=out)
    assert report.ok and report.stage == "done", report.to_json()
    for rank, host in enumerate(hosts):
        assert _told(out.reporter, host.name, SHARDS) == [(LOOKED, "planned"), (STARTED, None), (DONE, "changed")]
        assert _ended(out.reporter, host.name, SHARDS).reason.startswith(f"wrote {len(plan.shards_of_rank(rank))} of ")
        written = sorted(p.name for p in (tmp_path / host.name).iterdir() if p.name.startswith("engram-"))
        assert written == sorted(n for s in plan.shards_of_rank(rank) for n in (s.name, s.name[:-4] + ".json"))
    assert {s["action"] for h in report.to_json()["hosts"] for s in h["shards"]} == {"written"}
    progress = [e for e in out.reporter.events if e.kind == "progress"]
    assert [e.status for e in progress] == ["started", "done"]  # one transfer for every host's bytes
    assert {h.host: h.sent for h in progress[-1].hosts} == {
        h.name: sum(s.size for s in plan.shards_of_rank(r)) for r, h in enumerate(hosts)}

    again = _out()
    second = pack(plan, INVENTORY, pool=Pool(hosts), out=again)
    assert second.ok and {s["action"] for h in second.to_json()["hosts"] for s in h["shards"]} == {"skipped"}
    for host in hosts:  # nothing to do: the look is the end, nothing started
        assert _told(again.reporter, host.name, SHARDS) == [(LOOKED, "ok"), (DONE, "ok")]
        assert "present and verified" in _ended(again.reporter, host.name, SHARDS).reason


class Counted(Host):
    """A host that counts the host program's runs per operation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ops: list[str] = []
        self.target = SimpleNamespace(name=self.name)  # what fan_out's connections carry

    def run(self, argv, **kwargs):
        if argv[0] == "python3":
            self.ops.append(argv[2])
        return super().run(argv, **kwargs)

    def run_stream_in(self, argv, chunks, **kwargs):
        self.ops.append(argv[2])
        return super().run_stream_in(argv, chunks, **kwargs)


def test_the_pack_after_a_look_takes_its_findings_instead_of_asking_each_host_again(plan, tmp_path):
    """up's engram step: its look (shard_actions) asked every host; the pack that acts on it does not
    ask again, and the next pack (another run) does."""
    from sparkctl.ops.engram import shard_actions

    hosts = [Counted("h1", tmp_path / "h1"), Counted("h2", tmp_path / "h2")]
    actions = shard_actions(plan, INVENTORY, pool=Pool(hosts))
    assert {a.action for acts in actions.values() for a in acts} == {"write"}
    report = pack(plan, INVENTORY, pool=Pool(hosts), out=_out())
    assert report.ok and {s["action"] for h in report.to_json()["hosts"] for s in h["shards"]} == {"written"}
    for rank, host in enumerate(hosts):
        assert host.ops == ["probe"] + ["receive"] * len(plan.shards_of_rank(rank))
        host.ops.clear()
    again = pack(plan, INVENTORY, pool=Pool(hosts), out=_out())
    assert {s["action"] for h in again.to_json()["hosts"] for s in h["shards"]} == {"skipped"}
    assert [h.ops for h in hosts] == [["probe"], ["probe"]]  # looked again, listing and re-hash in one run


class Shrinking(Host):
    """A host whose df answers what ``free`` says at each call (or fails with ``df_error``): its disk
    used by something else between up's look and the pack."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.target = SimpleNamespace(name=self.name)
        self.df_error: str | None = None
        self.dfs = 0

    def run(self, argv, **kwargs):
        if "df -B1" in " ".join(argv):
            self.dfs += 1
            if self.df_error:
                from sparkctl.remote.result import CommandResult

                return CommandResult(1, "", self.df_error, 0.0)
        return super().run(argv, **kwargs)


def _nothing_written(tmp_path, hosts) -> bool:
    return not [p for h in hosts if (tmp_path / h.name).exists() for p in (tmp_path / h.name).glob("engram-*")]


def test_a_kept_look_whose_room_was_used_since_refuses_the_pack_before_anything_is_written(plan, tmp_path):
    """up's look saw room; an image loaded on the same disk took it before the pack: the pack reads the
    free space again (the shards' re-hash is kept) and refuses instead of filling the disk."""
    from sparkctl.ops.engram import shard_actions

    hosts = [Shrinking("h1", tmp_path / "h1", free=10**12), Shrinking("h2", tmp_path / "h2", free=10**12)]
    shard_actions(plan, INVENTORY, pool=Pool(hosts))
    assert [h.dfs for h in hosts] == [1, 1] and set(plan.looked) == {"h1", "h2"}
    hosts[1].free = 10  # the room the look saw, gone
    out = _out()
    doc = pack(plan, INVENTORY, pool=Pool(hosts), out=out).to_json()
    assert [h.dfs for h in hosts] == [2, 2]  # one df more each, no second listing or re-hash
    assert not doc["ok"] and doc["stage"] == "space"
    small = doc["hosts"][1]
    assert small["cause"] == "space" and small["error"].startswith("h2: not enough free space")
    assert small["free_bytes"] == 10 < small["needed_bytes"] and doc["hosts"][0]["ok"]
    assert _ended(out.reporter, "h2", SHARDS).reason.startswith("not enough free space in ")
    assert _ended(out.reporter, "h1", SHARDS).status == "skipped"
    assert not any(e.kind == STARTED for e in out.reporter.events)
    assert _nothing_written(tmp_path, hosts)


def test_a_kept_look_whose_free_space_cannot_be_read_again_fails_with_the_df_error(plan, tmp_path):
    from sparkctl.ops.engram import shard_actions

    hosts = [Shrinking("h1", tmp_path / "h1", free=10**12), Shrinking("h2", tmp_path / "h2", free=10**12)]
    shard_actions(plan, INVENTORY, pool=Pool(hosts))
    hosts[0].df_error = "df: /engram: Input/output error"
    out = _out()
    doc = pack(plan, INVENTORY, pool=Pool(hosts), out=out).to_json()
    assert not doc["ok"] and doc["stage"] == "probe"  # could not be checked: never "enough space"
    row = doc["hosts"][0]
    assert row["error"].startswith("h1: ") and "Input/output error" in row["error"] and "df of " in row["error"]
    assert row["free_bytes"] is None and "not enough free space" not in row["error"]
    failed = _ended(out.reporter, "h1", SHARDS)
    assert failed.status == "failed" and "Input/output error" in failed.reason
    assert _ended(out.reporter, "h2", SHARDS).status == "skipped"
    assert not any(e.kind == STARTED for e in out.reporter.events)
    assert _nothing_written(tmp_path, hosts)


def test_a_host_without_room_stops_the_pack_before_anything_is_written(plan, tmp_path):
    hosts = [Host("h1", tmp_path / "h1"), Host("h2", tmp_path / "h2", free=10)]
    out = _out()
    report = pack(plan, INVENTORY, pool=Pool(hosts), out=out)
    doc = report.to_json()
    assert not report.ok and doc["stage"] == "space"
    small = doc["hosts"][1]
    assert small["cause"] == "space" and small["error"].startswith("h2: not enough free space")
    assert small["free_bytes"] == 10 < small["needed_bytes"] and doc["hosts"][0]["ok"]
    failed = _ended(out.reporter, "h2", SHARDS)
    assert failed.status == "failed" and failed.reason.startswith("not enough free space in ")
    skipped = _ended(out.reporter, "h1", SHARDS)
    assert (skipped.status, skipped.reason) == ("skipped", "not run: nothing is written while h2 cannot take its shards")
    assert not any(e.kind == STARTED for e in out.reporter.events)
    assert not [p for h in hosts if (tmp_path / h.name).exists() for p in (tmp_path / h.name).glob("engram-*")]


def test_an_unreachable_host_fails_its_step_with_its_cause_and_nothing_is_written(plan, tmp_path):
    hosts = [Host("h1", tmp_path / "h1", unreachable="refused"), Host("h2", tmp_path / "h2")]
    out = _out()
    doc = pack(plan, INVENTORY, pool=Pool(hosts), out=out).to_json()
    assert doc["stage"] == "probe" and not doc["ok"]
    assert doc["hosts"][0]["cause"] == "refused" and doc["hosts"][0]["error"].startswith("h1")
    assert _ended(out.reporter, "h1", SHARDS).status == "failed"
    assert _ended(out.reporter, "h2", SHARDS).status == "skipped"
    assert not (tmp_path / "h2").exists() or not list((tmp_path / "h2").glob("engram-*"))


def test_verify_only_looks_and_names_a_corrupted_shard(plan, tmp_path):
    hosts = [Host("h1", tmp_path / "h1"), Host("h2", tmp_path / "h2")]
    assert pack(plan, INVENTORY, pool=Pool(hosts), out=_out()).ok
    victim = tmp_path / "h2" / plan.shards_of_rank(1)[0].name
    data = bytearray(victim.read_bytes())
    data[7] ^= 0xFF
    victim.write_bytes(bytes(data))
    out = _out()
    report = verify(plan, INVENTORY, pool=Pool(hosts), out=out)
    assert not report.ok
    bad = report.to_json()["hosts"][1]
    assert not bad["ok"] and bad["error"].startswith(f"{victim.name}: corrupt")
    assert _told(out.reporter, "h2", VERIFY) == [(LOOKED, "failed")]
    assert _told(out.reporter, "h1", VERIFY) == [(LOOKED, "ok")]  # it only looks: nothing starts
    assert not any(e.kind == STARTED for e in out.reporter.events)
