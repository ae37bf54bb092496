"""Each host's steps on every host at once (ops/host_steps.HostSteps): a host that cannot be reached,
or whose step meets an error no step foresaw, fails that step with one line naming why, and the other
hosts go on; a host already known dead fails without being reached again."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from sparkctl.ops.host_steps import HostSteps
from sparkctl.ops.steps import CHANGED, Look, Step, StepFailed
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


# ---------------------------------------------------------------- work the acts share (act alongside)

def _waiting_steps(names, pool=None):
    """Each host's act waits for its host's end in the shared work (``ends``), then ends with it."""
    ends = {n: threading.Event() for n in names}
    outcome = {n: ("changed", f"{n} sent") for n in names}
    contexts = {n: SimpleNamespace(name=n, conn=None, thread=None) for n in names}

    def act(ctx, look):
        ctx.thread = threading.get_ident()
        ends[ctx.name].wait()
        if outcome[ctx.name][0] == "failed":
            raise StepFailed(outcome[ctx.name][1])
        return outcome[ctx.name]
    targets = {n: SimpleNamespace(name=n) for n in names} if pool else {}
    steps = HostSteps([Step("load", lambda ctx: Look(True, "send"), act)], contexts, targets, Reporter(), pool=pool)
    return steps, contexts, ends, outcome


@pytest.mark.parametrize("ends_first", [True, False])  # the shared work ends before, or after, the acts start
@pytest.mark.parametrize("connected", [False, True])
def test_the_shared_work_runs_here_while_each_host_acts_and_waits_for_its_end(ends_first, connected):
    names = ["a", "b", "c"]
    pool = Pool([FakeTransport(n) for n in names]) if connected else None
    steps, contexts, ends, outcome = _waiting_steps(names, pool)
    steps.look()
    here = threading.get_ident()
    outcome["b"] = ("failed", "b: refused the stream")

    senders = []

    def send():
        senders.append(threading.get_ident())
        if not ends_first:
            while any(c.thread is None for c in contexts.values()):  # every act waits already
                threading.Event().wait(0.01)
        for name in ("c", "b", "a"):
            ends[name].set()
    steps.act(alongside=send)
    assert [steps.status(n, "load") for n in names] == [("changed", "a sent"), ("failed", "b: refused the stream"),
                                                        ("changed", "c sent")]
    assert all(c.thread not in (None, here) for c in contexts.values())  # the acts ran in threads of their own
    assert senders == [here]  # the shared work in the caller's (an interrupt reaches it)


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_what_stops_the_shared_work_is_raised_after_every_act_ended_released(error):
    steps, contexts, ends, _ = _waiting_steps(["a", "b"])
    steps.look()
    released = []

    def release():
        released.append(True)
        for event in ends.values():
            event.set()

    def send():
        ends["a"].set()
        raise error("stopped")
    with pytest.raises(error):
        steps.act(alongside=send, release=release)
    assert released == [True]
    assert [steps.status(n, "load")[0] for n in ("a", "b")] == ["changed", "changed"]  # both ended before the raise
    assert not any(t.name.startswith("sparkctl-host-") for t in threading.enumerate())


def test_without_a_pool_the_looks_run_here_in_order_and_an_unforeseen_error_fails_its_host_alone():
    order: list = []
    contexts = {n: SimpleNamespace(name=n, acted=False, conn=None) for n in ("b", "broken", "a")}

    def look(ctx):
        order.append((ctx.name, threading.get_ident()))
        return _look(ctx)
    steps = HostSteps([Step("thing", look, _act)], contexts, {}, Reporter(), pool=None)
    steps.look()
    assert order == [(n, threading.get_ident()) for n in ("b", "broken", "a")]
    assert steps.failed() == ["broken"]
    steps.act()
    assert contexts["a"].acted and contexts["b"].acted and not contexts["broken"].acted
    assert all(c.conn is None for c in contexts.values())  # no connection was asked for
