"""model sync's retry ships the agent again to a host whose transfer failed; when that copy fails,
the host fails with that reason in one line naming it, and no later step runs the agent that is no
longer there (which used to end in python3's "can't open file .../agent.pyz"). The host answers
through a recorded transport."""

from __future__ import annotations

from types import SimpleNamespace

from sparkctl.ops.model_sync import Agents, HostReport, _ship_again
from sparkctl.remote.fake import Answer, FakeTransport

FULL = "mktemp: failed to create directory via template '/tmp/sparkctl-model.XXXXXX': No space left on device"


def _host(name: str) -> FakeTransport:
    made = []

    def mktemp(argv, stdin):
        made.append(argv)
        if len(made) > 1:  # /tmp filled up since the first copy
            return Answer(1, "", FULL)
        return Answer(stdout="/tmp/sparkctl-model.abc123\n")

    return FakeTransport(name, {("mktemp",): mktemp, ("sh", "-c"): Answer(), ("rm", "-rf"): Answer()})


class Pool:
    def __init__(self, transports):
        self.transports = {t.name: t for t in transports}

    def get(self, target):
        return self.transports[target.name]


def test_a_failed_second_copy_of_the_agent_is_the_hosts_one_line_reason():
    transport = _host("spark-2")
    pool = Pool([transport])
    target = SimpleNamespace(name="spark-2")
    agents = Agents(pool)
    agents.install(transport)
    assert agents.paths == {"spark-2": "/tmp/sparkctl-model.abc123/agent.pyz"}
    report = HostReport("spark-2", status="failed", error="the stream ended after 3 of 5 files")
    run = SimpleNamespace(targets={"spark-2": target}, agents=agents, reports={"spark-2": report}, pool=pool)

    again = _ship_again(run, [SimpleNamespace(name="spark-2")])

    assert again == []  # nothing to check or send to on this host any more
    assert report.status == "failed" and "\n" not in report.error
    assert report.error == ("the transfer failed (the stream ended after 3 of 5 files) and could not copy the sync "
                            f"agent to spark-2 again for the retry: mktemp failed: {FULL}")
    assert "spark-2" not in agents.paths  # the removed copy's path is not run by a later step
    assert ["rm", "-rf", "--", "/tmp/sparkctl-model.abc123"] in [c.argv for c in transport.calls]


def test_a_second_copy_that_works_keeps_the_host_in_the_retry():
    transport = FakeTransport("spark-3", {("mktemp",): Answer(stdout="/tmp/sparkctl-model.x\n"), ("sh", "-c"): Answer(),
                                          ("rm", "-rf"): Answer()})
    pool = Pool([transport])
    agents = Agents(pool)
    agents.install(transport)
    host = SimpleNamespace(name="spark-3")
    run = SimpleNamespace(targets={"spark-3": host}, agents=agents, pool=pool,
                          reports={"spark-3": HostReport("spark-3", error="the stream ended")})
    assert _ship_again(run, [host]) == [host] and "spark-3" in agents.paths
