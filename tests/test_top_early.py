"""`top`'s first frame does not wait for the slowest host: the deployment is known once rank 0's record
is read, and the first sample is drawn host by host as each answers, an unreachable host named in its
row. The hosts answer through recorded transports; a slow host is one held until the test lets it go
(never a sleep, so nothing depends on which of two threads runs first)."""

from __future__ import annotations

import threading

from sparkctl.ops.top import find_watched, take_snapshot
from sparkctl.remote.fake import Answer, FakeTransport
from test_host_probe import run_probe
from test_top_find import PROFILE, Pool, _host, _inventory, _record

HELD_S = 60  # how long a held host waits to be let go: reached only when the code under test waits for it


def _held(name: str, answer: Answer, release: threading.Event, answered: list) -> FakeTransport:
    def slow(argv, stdin):
        release.wait(HELD_S)
        answered.append(name)
        return answer

    return FakeTransport(name, {(lambda argv: True): slow})


def test_rank_0s_record_is_enough_and_the_other_hosts_are_not_waited_for(tmp_path):
    inventory = _inventory(tmp_path)
    release, answered = threading.Event(), []
    pool = Pool([_host("a", _record("a", 0)), _host("b", _record("b", 1)),
                 _held("c", Answer(stdout=_record("c", 2)), release, answered)])
    try:
        endpoint, about = find_watched(inventory, PROFILE, pool=pool)
        assert endpoint == "http://10.9.0.11:8000" and about == {"profile": "sandbox", "hosts": ["a", "b", "c"]}
        assert answered == []  # c was still being asked when the deployment was known
    finally:
        release.set()


def test_without_rank_0s_record_every_host_is_still_waited_for(tmp_path):
    inventory = _inventory(tmp_path)
    release, answered = threading.Event(), []
    pool = Pool([_host("a", ""), _host("b", _record("b", 1)),
                 _held("c", Answer(stdout=_record("c", 2)), release, answered)])
    release.set()  # c answers when asked: a worker's record is used only once every host answered
    endpoint, about = find_watched(inventory, PROFILE, pool=pool)
    assert answered == ["c"] and about["note"].startswith("rank 0's deployment record was not read")


def test_the_first_sample_is_drawn_host_by_host_and_an_unreachable_host_is_named(tmp_path):
    inventory = _inventory(tmp_path)
    probe = Answer(stdout=run_probe(tmp_path, 0.1))
    release, answered, frames = threading.Event(), [], []
    pool = Pool([FakeTransport("a", {(lambda argv: True): probe}), _held("b", probe, release, answered),
                 FakeTransport("c", unreachable="connection refused")])

    def show(snapshot):
        frames.append({v.name: (v.sample is not None, v.error, v.waiting) for v in snapshot.hosts})
        if frames[-1]["a"][0] and frames[-1]["c"][1]:
            release.set()  # b answers only once a and c are drawn: b never holds them back

    try:
        snapshot = take_snapshot(inventory, inventory.hosts, None, pool=pool, interval_s=0.1, show=show)
    finally:
        release.set()
    before_b = [f for f in frames if f["b"] == (False, None, "sampling…")]
    assert before_b and before_b[-1]["a"][0] and "connection refused" in before_b[-1]["c"][1]
    assert frames[-1]["b"][0] and len(frames) == 3  # one frame per host, as it answered
    assert [v.sample is not None for v in snapshot.hosts] == [True, True, False] and not snapshot.ok
    assert snapshot.hosts[2].error.startswith("c: ") and snapshot.waiting is None
