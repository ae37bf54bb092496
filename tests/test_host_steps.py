"""Each host's steps on every host at once (ops/host_steps.HostSteps): a host that cannot be reached,
or whose step meets an error no step foresaw, fails that step with one line naming why, and the other
hosts go on; a host already known dead fails without being reached again."""

from __future__ import annotations

from types import SimpleNamespace

from sparkctl.ops.host_steps import HostSteps
from sparkctl.ops.steps import CHANGED, Look, Step
from sparkctl.remote.fake import FakeTransport
from sparkctl.reporter import DONE, LOOKED, Reporter


class Pool:
    def __init__(self, transports):
        self.transports, self.asked = {t.name: t for t in transports}, []

    def get(self, target):
        self.asked.append(target.name)
        return self.transports[target.name]


def _look(ctx) -> Look:
    if ctx.name == "broken":
        raise KeyError("free")  # an answer without the field a step expects: not a step's failure
    return Look(True, "will change")


def _act(ctx, look) -> tuple[str, str]:
    ctx.acted = True
    return CHANGED, "changed"


def _steps(names, unreachable=()):
    contexts = {n: SimpleNamespace(name=n, acted=False, conn=None) for n in names}
    pool = Pool([FakeTransport(n, unreachable="refused" if n in unreachable else None) for n in names])
    steps = HostSteps([Step("thing", _look, _act)], contexts, {n: SimpleNamespace(name=n) for n in names}, Reporter(),
                      pool=pool)
    return steps, contexts, pool


def test_a_host_not_reached_or_broken_fails_alone_and_the_others_act():
    steps, contexts, pool = _steps(["a", "down", "broken", "known-dead"], unreachable=("down",))
    steps.fail("known-dead", "the agent could not be copied there")
    steps.look(["a", "down", "broken"])
    assert steps.status("down", "thing")[0] == "failed" and steps.causes["down"] == "refused"
    status, reason = steps.status("broken", "thing")
    assert status == "failed" and "\n" not in reason and "free" in reason
    assert sorted(steps.failed()) == ["broken", "down", "known-dead"]
    steps.end_failed()
    steps.act([n for n in contexts if n not in steps.failed()])
    assert steps.status("a", "thing") == ("changed", "changed") and contexts["a"].acted
    assert not any(c.acted for n, c in contexts.items() if n != "a")
    assert "known-dead" not in pool.asked
    ends = {e.host: e.status for e in steps.runs["a"].reporter.events if e.kind == DONE}
    assert ends == {"a": "changed", "down": "failed", "broken": "failed", "known-dead": "failed"}
    looks = [e.host for e in steps.runs["a"].reporter.events if e.kind == LOOKED and e.status == "failed"]
    assert sorted(looks) == ["broken", "down", "known-dead"]


def test_stop_ends_every_step_before_acting():
    steps, contexts, _ = _steps(["a", "b"], unreachable=("b",))
    steps.look()
    steps.stop("not run: b cannot be reached")
    assert steps.status("a", "thing") == ("skipped", "not run: b cannot be reached")
    assert steps.status("b", "thing")[0] == "failed" and not contexts["a"].acted
