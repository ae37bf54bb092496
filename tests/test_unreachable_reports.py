"""Reports about hosts that did not answer: what the deployment record still knows is shown, and the
reason each host did not answer is named."""

from __future__ import annotations

from sparkctl.ops.status import Deployment, HostState, StatusReport


def test_status_shows_the_recorded_rank_of_an_unreachable_host():
    states = [HostState("spark-1", "10.0.0.1", record={"rank": 0, "hosts": ["spark-1", "spark-2", "spark-3"]}),
              HostState("spark-2", "10.0.0.2", reachable=False, error="spark-2: SSH handshake did not finish"),
              HostState("spark-3", "10.0.0.3", record={"rank": 2})]
    deployment = Deployment(["spark-1", "spark-2", "spark-3"], "spark-1", "http://10.0.0.1:8000", "m",
                            states[0].record)
    hosts = {h["name"]: h for h in StatusReport("p", states, deployment).to_json()["hosts"]}
    assert hosts["spark-2"]["rank"] == 1 and hosts["spark-2"]["role"] is not None
    assert hosts["spark-2"]["reachable"] is False


def test_status_without_a_deployment_gives_each_unreachable_hosts_reason():
    from sparkctl.ops import status as status_op

    states = [HostState("spark-1", "10.0.0.1"),
              HostState("spark-2", "10.0.0.2", reachable=False, error="spark-2: connection to 10.0.0.2:22 refused")]
    original = status_op.gather_states, status_op.held_lock
    status_op.gather_states = lambda *a, **k: states
    status_op.held_lock = lambda *a, **k: None
    try:
        from sparkctl.config.profile import load_profile

        report = status_op.gather_status(None, [], load_profile("tp4").profile, pool=None)
    finally:
        status_op.gather_states, status_op.held_lock = original
    assert "spark-2: connection to 10.0.0.2:22 refused" in report.problems[0]


def test_status_tells_each_hosts_verdict_as_a_step_that_only_looks(monkeypatch):
    """status changes nothing: each host is a step whose look is its verdict (as doctor's checks),
    told to the reporter: the host's own problems fail it, a host outside the deployment is skipped."""
    from sparkctl.commands.serve import Container
    from sparkctl.config.profile import load_profile
    from sparkctl.ops import status as status_op
    from sparkctl.reporter import Reporter

    def container(rank: int, status: str) -> Container:
        return Container("c" * 64, "sparkctl-tp4", "img:latest", status, 0 if status == "running" else 137, "", "", "",
                         {"sparkctl.profile": "tp4", "sparkctl.rank": str(rank)})

    states = [HostState("spark-1", "10.0.0.1", containers=[container(0, "running")],
                        record={"rank": 0, "profile": "tp4", "hosts": ["spark-1", "spark-2", "spark-3"]}),
              HostState("spark-2", "10.0.0.2", containers=[container(1, "exited")]),
              HostState("spark-3", "10.0.0.3", reachable=False, error="spark-3: connection to 10.0.0.3:22 refused"),
              HostState("spark-4", "10.0.0.4")]
    monkeypatch.setattr(status_op, "gather_states", lambda *a, **k: states)
    monkeypatch.setattr(status_op, "held_lock", lambda *a, **k: None)
    reporter = Reporter()
    report = status_op.gather_status(None, [], load_profile("tp4").profile, pool=None, reporter=reporter)
    told = {e.host: (e.kind, e.step, e.status, e.reason) for e in reporter.events}
    assert told["spark-1"] == ("looked", "state", "ok", "rank 0: sparkctl-tp4 running")
    assert told["spark-2"][2] == "failed" and told["spark-2"][3].startswith("container sparkctl-tp4 ")
    assert told["spark-3"][2:] == ("failed", "connection to 10.0.0.3:22 refused")
    assert told["spark-4"][2:] == ("skipped", "not in the deployment")
    assert not report.ok and set(told) == {"spark-1", "spark-2", "spark-3", "spark-4"}
    assert status_op.gather_status(None, [], load_profile("tp4").profile, pool=None).states == states  # no reporter: told nothing
