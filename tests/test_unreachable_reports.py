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
