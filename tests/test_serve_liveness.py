"""The health wait's liveness look on recorded facts: a rank docker restarts (its restart policy) ends
the wait at once, naming the host and the rank, even when it reads ``running`` at every look; so does
one that exited, vanished, was replaced or restarted by hand. The hosts answer through recorded
transports (their containers as ``docker inspect`` prints them)."""

from __future__ import annotations

import json
import socket

import pytest
import yaml

from sparkctl.commands import native as N
from sparkctl.commands.serve import container_argv, parse_containers
from sparkctl.config.inventory import load_inventory
from sparkctl.ops.health import wait_healthy
from sparkctl.ops.liveness import RankWatch
from sparkctl.ops.native import why_not_alive as native_why_not
from sparkctl.ops.serve import HostOutcome, ServeReport, ServeRun, build_plan
from sparkctl.remote.fake import Answer, FakeTransport

STARTED = "2026-12-02T08:00:00.123456789Z"
ID = "c" * 64


def _inspect(status="running", restarts=0, code=0, started=STARTED, cid=ID, rank=1) -> dict:
    return {"Id": cid, "Name": "/sparkctl-sandbox", "RestartCount": restarts,
            "State": {"Status": status, "ExitCode": code, "StartedAt": started, "FinishedAt": "2026-12-02T08:00:03Z"},
            "HostConfig": {"RestartPolicy": {"Name": "on-failure"}},
            "Config": {"Image": "sparkctl-sandbox:latest", "Labels": {"sparkctl.profile": "sandbox", "sparkctl.rank": str(rank)}}}


def _seen(**kw):
    return parse_containers(json.dumps([_inspect(**kw)]))[0]


def test_the_run_serve_started_is_alive_and_anything_else_is_named_with_host_and_rank():
    def watch():
        return RankWatch("spark-3", 2, "sparkctl-sandbox", ID)

    assert watch().why_not(_seen()) is None
    looping = watch().why_not(_seen(restarts=3, started="2026-12-02T08:01:10Z"))
    assert looping == ("spark-3 (rank 2): container sparkctl-sandbox failed and docker restarted it 3 times since serve "
                       "started it (running again since 2026-12-02T08:01:10)")
    assert "restarting after exit code 1" in watch().why_not(_seen(status="restarting", restarts=1, code=1))
    assert watch().why_not(_seen(status="exited", code=1)).startswith(
        "spark-3 (rank 2): container sparkctl-sandbox exited with code 1 at 2026-12-02T08:00:03")
    assert watch().why_not(None) == "spark-3 (rank 2): container sparkctl-sandbox is gone"
    assert "replaced by another container (dddddddddddd, serve started cccccccccccc)" in watch().why_not(_seen(cid="d" * 64))
    by_hand = watch()
    assert by_hand.why_not(_seen()) is None  # the first look learns when it started
    assert "was restarted at 2026-12-02T08:02:00" in by_hand.why_not(_seen(started="2026-12-02T08:02:00Z"))


@pytest.fixture
def serve_run(tmp_path):
    hosts = [{"name": n, "address": f"10.9.0.{i + 11}", **({"role": "head"} if i == 0 else {})} for i, n in enumerate("ab")]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "hosts": hosts}))
    inventory = load_inventory(str(path))
    plan = build_plan(inventory, "sandbox", sets=["tensor_parallel=2"], who="t", when="now")
    report = ServeReport(plan, [HostOutcome(h.name, h.rank) for h in plan.hosts])
    looks = {"a": [_inspect(rank=0)], "b": [_inspect(), _inspect(restarts=1, started="2026-12-02T08:00:20Z")]}

    def containers(name):
        def answer(argv, stdin):  # each look answers the host's next recorded state (the last one stays)
            states = looks[name]
            return Answer(stdout=json.dumps([states.pop(0) if len(states) > 1 else states[0]]))
        return answer

    # the look is one `docker inspect` of the container's name per host (no listing, no shell)
    transports = {n: FakeTransport(n, {(lambda argv: argv == container_argv(plan.container)): containers(n)}) for n in "ab"}

    class Pool:
        def get(self, target):
            return transports[target.name]

    run = ServeRun(plan, inventory, report, pool=Pool(), reporter=None)
    run.watches = {h.name: RankWatch(h.name, h.rank, plan.container, ID) for h in plan.hosts}
    return run, transports


def test_a_restart_between_two_looks_is_seen_even_where_answers_are_kept(serve_run):
    run, transports = serve_run
    assert run.why_not_alive() is None
    # Nothing but facts ran on the host between the looks, so a run that keeps answers (up) would hand
    # back the first look's; the liveness look asks again.
    assert all(t.changes == 0 for t in transports.values())
    assert run.why_not_alive() == ("b (rank 1): container sparkctl-sandbox failed and docker restarted it 1 time since "
                                   "serve started it (running again since 2026-12-02T08:00:20)")
    assert [c.argv for c in transports["b"].calls] == [container_argv(run.plan.container)] * 2


def test_a_host_that_does_not_answer_is_named_with_its_rank(serve_run):
    run, transports = serve_run
    transports["b"].unreachable = "connection refused"
    assert run.why_not_alive().startswith("b (rank 1): ")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_wait_that_reaches_its_timeout_still_names_the_rank_that_restarted():
    looks = []

    def check_alive():  # healthy at the scheduled look (never reached), restarted by the deadline
        looks.append(1)
        return "spark-3 (rank 2): container x failed and docker restarted it 1 time since serve started it"

    waited = wait_healthy(f"http://127.0.0.1:{_closed_port()}", "m", timeout_s=0.3, initial_s=0.05,
                          first_alive_s=60, alive_every_s=60, check_alive=check_alive)
    assert not waited.ok and waited.stopped_by.startswith("spark-3 (rank 2)") and looks == [1]


def test_the_native_engine_replaced_or_gone_is_named_with_its_host():
    plan = type("Plan", (), {"host": "spark-1", "paths": type("P", (), {"pidfile": "/s/engine.pid"})()})()
    assert native_why_not(N.ProcessState("running", 41), plan, 41) is None
    assert native_why_not(N.ProcessState("running", 57), plan, 41) == (
        "spark-1: the engine process (/s/engine.pid) was replaced: pid 57 runs, serve started pid 41")
    assert native_why_not(N.ProcessState("stale", 41), plan, 41) == "spark-1: the engine process (/s/engine.pid) is gone (stale, pid 41)"
