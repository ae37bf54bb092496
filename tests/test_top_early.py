"""`top`'s first frame does not wait for the slowest host: the deployment is known once rank 0's record
is read, and the first sample is drawn host by host as each answers, an unreachable host named in its
row. The hosts answer through recorded transports; a slow host is one held until the test lets it go
(never a sleep, so nothing depends on which of two threads runs first)."""

from __future__ import annotations

import json
import threading

import pytest

from sparkctl.commands.serve import parse_containers
from sparkctl.ops.top import find_watched, record_is_live, take_snapshot
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


def _rank_0(host: str, when: str) -> dict:
    return {"profile": "sandbox", "endpoint": f"http://{host}:8000", "hosts": [host], "host": host, "rank": 0,
            "container": PROFILE.container.name, "when": when}


def _containers(running: bool) -> str:
    """`docker inspect` of the profile's rank-0 container, running or exited."""
    return json.dumps([{"Id": "c0ffee", "Name": f"/{PROFILE.container.name}",
                        "State": {"Status": "running" if running else "exited"},
                        "Config": {"Labels": {"sparkctl.profile": "sandbox", "sparkctl.rank": "0"}}}])


def _rank_0_host(name: str, record: dict, running: bool, wait_for: threading.Event, done: threading.Event,
                 answered: list) -> FakeTransport:
    """A host holding a rank-0 record: it answers once ``wait_for`` is set, and sets ``done`` when it
    said whether the record's container runs."""
    def read_record(argv, stdin):
        wait_for.wait(HELD_S)
        return Answer(stdout=json.dumps(record))

    def containers(argv, stdin):
        answered.append(name)
        done.set()
        return Answer(stdout=_containers(running))

    return FakeTransport(name, {(lambda argv: "sparkctl-record" in argv): read_record,
                                (lambda argv: "sparkctl-containers" in argv): containers})


@pytest.mark.parametrize("first", ["stale", "live"])
def test_the_live_rank_0_wins_over_a_stale_one_whichever_answers_first(tmp_path, first):
    """a holds a rank-0 record from an older deployment (its container exited), b today's (running):
    b's is followed, whether a or b answers first; a stale record never stops the search."""
    inventory = _inventory(tmp_path)
    stale_done, release, go, answered = threading.Event(), threading.Event(), threading.Event(), []
    go.set()
    # stale first: b answers only once a said its container is not running; live first: a is held
    # until the search is over (it must not be waited for)
    stale = _rank_0_host("a", _rank_0("a", "2026-01-02T00:00:00Z"), False,
                         go if first == "stale" else release, stale_done, answered)
    live = _rank_0_host("b", _rank_0("b", "2026-01-01T00:00:00Z"), True,
                        stale_done if first == "stale" else go, threading.Event(), answered)
    try:
        endpoint, about = find_watched(inventory, PROFILE, pool=Pool([stale, live, _host("c", "")]))
        seen = list(answered)  # before a is let go
    finally:
        release.set()
    assert endpoint == "http://b:8000" and about == {"profile": "sandbox", "hosts": ["b"]}
    assert seen == (["a", "b"] if first == "stale" else ["b"])  # a live rank 0 ends the search


def test_without_a_live_rank_0_the_newest_record_serves_and_says_its_container_is_not_running(tmp_path):
    inventory = _inventory(tmp_path)
    go, done, answered = threading.Event(), threading.Event(), []
    go.set()
    old = _rank_0_host("a", _rank_0("a", "2026-01-01T00:00:00Z"), False, go, threading.Event(), answered)
    new = _rank_0_host("b", _rank_0("b", "2026-01-02T00:00:00Z"), False, go, done, answered)
    endpoint, about = find_watched(inventory, PROFILE, pool=Pool([old, new, _host("c", "")]))
    assert endpoint == "http://b:8000" and sorted(answered) == ["a", "b"]
    assert about["note"] == (f"no running rank 0 found: using b's record, whose container {PROFILE.container.name} "
                             "is not running there")


def test_a_natively_launched_rank_0_is_live_without_a_container():
    native = {**_rank_0("a", "2026-01-01T00:00:00Z"), "launcher": "native"}
    assert record_is_live(native, []) is None and record_is_live(_rank_0("a", "x"), []) is False
    assert record_is_live(_rank_0("a", "x"), parse_containers(_containers(True))) is True


def test_a_rank_0_whose_docker_cannot_answer_is_still_followed_by_its_record(tmp_path):
    """A stopped Docker engine on rank 0's host: its record was read, only the liveness is unknown."""
    inventory = _inventory(tmp_path)
    head = FakeTransport("a", {
        (lambda argv: "sparkctl-record" in argv): Answer(stdout=json.dumps(_rank_0("a", "2026-01-01T00:00:00Z"))),
        (lambda argv: "sparkctl-containers" in argv):
            Answer(exit_code=1, stderr="Cannot connect to the Docker daemon at unix:///var/run/docker.sock"),
    })
    endpoint, about = find_watched(inventory, PROFILE, pool=Pool([head, _host("b", ""), _host("c", "")]))
    assert endpoint == "http://a:8000" and about == {"profile": "sandbox", "hosts": ["a"]}
