"""distribute's per-host work as steps of the one runner (ops/steps.py): each host's ``load`` looks
(its plan from its engine's facts: ``ok`` when it has the image, ``skipped`` for the source, failed
when it cannot be planned and no retry is left) and acts (waits for its end in the one shared
stream: ``changed`` or failed with one line), told to the run's reporter; and --connect-timeout on
distribute and build, down to the bulk streams' ssh client."""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from clirun import run_cli
from sparkctl.ops import distribute as D
from sparkctl.ops.host_steps import HostDecisions
from sparkctl.remote.openssh import BULK_SSH_OPTIONS, Route, client_argv, peer_argv
from sparkctl.remote.result import HostResult
from sparkctl.remote.target import SSHTarget
from sparkctl.reporter import Reporter

L1, L2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
SOURCE = D.SourceImage("img:1", "sha256:" + "a" * 64, (L1, L2), (), 10_000_000, "spark-1")


@dataclass
class _Host:
    name: str
    fabric_address: str = ""


def _store(name: str, *images: D.ImageEntry, free: int | None = None) -> HostResult:
    return HostResult(name, True, D.ImageStore(name, "overlay2", False, "28.0", list(images), free_bytes=free), None, None, 0.0)


FACTS = {
    "spark-2": _store("spark-2", D.ImageEntry(SOURCE.id, ("img:1",), (), SOURCE.layers)),  # has it
    "spark-3": _store("spark-3", D.ImageEntry("sha256:old", ("img:1",), (), (L1,))),  # has the first layer
    "spark-4": HostResult("spark-4", False, None, "spark-4: connection refused", "refused", 0.0),
    "spark-5": _store("spark-5", D.ImageEntry(SOURCE.id, ("other:2",), (), SOURCE.layers)),  # has it, another tag
}


class _Sends(D._Distribution):
    """The distribution with its rounds replaced: each host's end written and decided in ``order``."""

    ends: dict = {}
    order: list = []
    interrupt: bool = False

    def send_rounds(self) -> None:
        if self.interrupt:
            raise KeyboardInterrupt
        for name in self.order:
            for key, value in self.ends[name].items():
                setattr(self.reports[name], key, value)
            self.decisions.decide([name])


def _distribution(cls=D._Distribution, *, dry_run=False, retries=1, **extra) -> D._Distribution:
    chosen = [_Host(n) for n in ("spark-1", *FACTS)]
    options = D.DistributeOptions(tag="img:1", source="spark-1", dry_run=dry_run, retries=retries)
    dist = cls(SOURCE, _Host("spark-1"), chosen, None, None, options,
               {h.name: D._row(h.name, _Host("spark-1")) for h in chosen}, None, {}, None, None)
    dist.facts = dict(FACTS)
    dist.decisions = HostDecisions([h.name for h in chosen])
    for key, value in extra.items():
        setattr(dist, key, value)
    return dist


def _steps(reporter: Reporter) -> dict:
    return {name: (r.status, r.reason) for name in ("spark-1", *FACTS) for r in reporter.steps([D.LOAD], name)}


def test_each_hosts_look_is_its_plan_and_a_dry_run_only_looks():
    reporter = Reporter()
    dist = _distribution(dry_run=True)
    D._load_every_host(dist, reporter)
    steps = _steps(reporter)
    assert steps["spark-1"] == ("skipped", "the source of the image")
    assert steps["spark-2"][0] == "ok" and "has img:1" in steps["spark-2"][1]
    assert steps["spark-3"] == ("planned", "send thin (1 of 2 layers): has 1 of 2 layers")
    assert steps["spark-4"] == ("failed", "connection refused")  # a dry run retries nothing
    assert steps["spark-5"][0] == "planned" and "tag it img:1" in steps["spark-5"][1]
    assert not any(e.kind in ("started", "done") for e in reporter.events)  # nothing acted
    rows = {r.name: (r.status, r.mode, r.error) for r in dist.reports.values()}
    assert rows == {"spark-1": ("skipped", "none", None), "spark-2": ("skipped", "none", None),
                    "spark-3": ("planned", "thin", None), "spark-4": ("failed", "none", "spark-4: connection refused"),
                    "spark-5": ("skipped", "none", None)}


def test_a_host_whose_facts_failed_is_asked_again_only_while_a_retry_is_left():
    dist = _distribution()
    look = dist.look("spark-4")
    assert look.act and look.reason == "connection refused: asked again in the next round" and dist.retry_first == ["spark-4"]
    with pytest.raises(D.StepFailed, match="^connection refused$"):
        _distribution(retries=0).look("spark-4")
    short = _distribution(facts={**FACTS, "spark-3": _store("spark-3", free=1000)}, retries=0)
    with pytest.raises(D.StepFailed, match="GB free where docker keeps its images"):
        short.look("spark-3")
    assert short.reports["spark-3"].status == "failed"


ENDS = {
    "spark-3": {"status": "loaded", "bytes_sent": 3 * 1048576, "seconds": 1.25, "address": "10.1.0.3"},
    "spark-4": {"status": "failed", "error": "spark-4: connection refused", "attempts": 2},
    "spark-5": {"status": "skipped", "retagged": True},
}


@pytest.mark.parametrize("order", [["spark-3", "spark-4", "spark-5"], ["spark-5", "spark-4", "spark-3"]])
def test_each_hosts_act_ends_with_its_own_outcome_whichever_host_ends_first(order):
    reporter = Reporter()
    dist = _distribution(_Sends, ends=ENDS, order=order)
    D._load_every_host(dist, reporter)
    steps = _steps(reporter)
    assert steps["spark-1"] == ("skipped", "the source of the image") and steps["spark-2"][0] == "ok"
    assert steps["spark-3"] == ("changed", "loaded thin, 3.0 MiB in 1.2s via 10.1.0.3")
    assert steps["spark-4"] == ("failed", "connection refused")
    assert steps["spark-5"] == ("changed", "had the image: tagged it img:1")
    started = {e.host for e in reporter.events if e.kind == "started"}
    assert started == {"spark-3", "spark-4", "spark-5"}  # only the hosts whose look said act
    report = D.DistributionReport("img:1", SOURCE.id, list(dist.reports.values()))
    assert not report.ok and [h["status"] for h in report.to_json()["hosts"]] == ["skipped", "skipped", "loaded", "failed", "skipped"]


def test_an_interrupted_stream_ends_every_waiting_step_and_is_raised():
    reporter = Reporter()
    dist = _distribution(_Sends, interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        D._load_every_host(dist, reporter)
    steps = _steps(reporter)
    assert steps["spark-2"][0] == "ok"
    assert {steps[n][0] for n in ("spark-3", "spark-4", "spark-5")} == {"failed"}
    assert steps["spark-3"][1].startswith("stopped: ")


# ---------------------------------------------------------------------------------------------- --connect-timeout


TARGET = SSHTarget(name="spark-2", address="192.168.1.2", port=22, user="nvidia")


def test_the_bulk_ssh_client_takes_the_connect_timeout_in_whole_seconds():
    route = Route("spark-2", TARGET, "192.168.1.2")
    assert client_argv(route, ["docker", "load"])[1:1 + len(BULK_SSH_OPTIONS)] == BULK_SSH_OPTIONS  # the default is kept
    argv = client_argv(route, ["docker", "load"], connect_timeout=2.5)
    assert "ConnectTimeout=3" in argv and "ConnectTimeout=10" not in argv
    wrapped = D.pick_transport("openssh", connect_timeout=0.2)._open(route)._wrap(["docker", "load"])
    assert "ConnectTimeout=1" in wrapped
    host = _Host("spark-2", "10.1.0.2")
    assert "ConnectTimeout=7" in peer_argv(host, TARGET, "spark-2", ["docker", "load"], connect_timeout=7)
    assert "ConnectTimeout=7" in D.relay_ssh_argv(host, TARGET, "spark-2", connect_timeout=7)


@pytest.fixture
def silent_host(tmp_path):
    """An inventory whose hosts accept TCP and never greet (an sshd that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    (tmp_path / "known_hosts").write_text("")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"cluster: t\nknown_hosts: {tmp_path / 'known_hosts'}\nhosts:\n"
                         f"  - name: spark-1\n    address: 127.0.0.1\n    role: head\n    ssh: {{port: {port}, user: nvidia}}\n")
    yield str(inventory)
    listener.close()


@pytest.mark.parametrize("verb", [["distribute", "--from", "spark-1"], ["build", "--on", "spark-1"]])
def test_distribute_and_build_on_give_up_after_the_connect_timeout_asked(silent_host, verb):
    result = run_cli("-i", silent_host, verb[0], "--image", "sandbox", *verb[1:], "--connect-timeout", "0.3")
    assert result.code == 1, result
    assert "spark-1" in result.stderr and "within 0.3s" in result.stderr and "Traceback" not in result.stderr, result
    refused = run_cli("-i", silent_host, verb[0], "--image", "sandbox", *verb[1:], "--connect-timeout", "0")
    assert refused.code == 2 and "--connect-timeout" in refused.stderr, refused


# ---------------------------------------------------------------------------------------------- the rounds


@dataclass
class _Ran:
    exit_code: int
    stderr: str = ""


class _Tagger:
    """A host connection that answers ``docker tag``: failing the first ``fail`` times."""

    def __init__(self, fail: int):
        self.fail, self.asked = fail, []

    def get(self, target):
        return self

    def run(self, argv, timeout=None):
        self.asked.append(list(argv))
        return _Ran(1 if len(self.asked) <= self.fail else 0, "no such image")


class _Rounds(D._Distribution):
    """The rounds with the streams replaced: ``outcomes[attempt][host]`` is how that host's send ends."""

    outcomes: list = []
    sent: list = []

    def send(self, plans, *, direct):
        attempt = len(self.sent)
        self.sent.append(sorted(p.name for p in plans))
        for plan in plans:
            ok = self.outcomes[attempt][plan.name]
            report = self.reports[plan.name]
            report.status, report.error = ("loaded", None) if ok else ("failed", f"{plan.name}: lost")
            report.bytes_sent += 1048576
        return 7


def test_a_failed_host_is_tried_again_with_fresh_facts_and_an_ended_one_never(monkeypatch):
    """retries=2: round 1 fails spark-3's send and spark-5's re-tag, and could not read spark-4; round 2
    ends all three, so no third round is tried and each host's act reads its own end."""
    fresh = {"spark-3": FACTS["spark-3"], "spark-4": FACTS["spark-2"], "spark-5": FACTS["spark-5"]}
    asked = []

    def facts_again(targets, fn, *, pool):
        asked.append(list(targets))
        return [HostResult(t, True, replace(fresh[t].value, name=t), None, None, 0.0) for t in targets]

    monkeypatch.setattr(D, "fan_out", facts_again)
    reporter = Reporter()
    dist = _distribution(_Rounds, retries=2, outcomes=[{"spark-3": False}, {"spark-3": True}], sent=[],
                         pool=_Tagger(fail=1), targets={n: n for n in FACTS}, out=SimpleNamespace(reporter=reporter))
    dist.options.retry_delay = 0
    D._load_every_host(dist, reporter)
    assert dist.sent == [["spark-3"], ["spark-3"]] and [sorted(a) for a in asked] == [["spark-3", "spark-4", "spark-5"]]
    rows = {r.name: (r.status, r.attempts) for r in dist.reports.values()}
    assert rows == {"spark-1": ("skipped", 0), "spark-2": ("skipped", 1), "spark-3": ("loaded", 2),
                    "spark-4": ("loaded", 2), "spark-5": ("loaded", 2)}
    steps = _steps(reporter)
    assert steps["spark-3"][0] == "changed" and steps["spark-3"][1].startswith("loaded thin, 2.0 MiB")
    assert steps["spark-4"][0] == "ok" and steps["spark-5"] == ("changed", "had the image: tagged it img:1")
    assert dist.source_bytes == 14 and len(dist.pool.asked) == 2  # spark-5 tagged again, once
    notes = [e.reason for e in reporter.events if e.kind == "note"]
    assert {"  spark-3: lost", "  spark-4: connection refused", "  spark-5: docker tag failed: no such image"} <= set(notes)
    assert notes[-1].startswith("retrying ") and notes[-1].endswith("(attempt 2 of 3), each with its own read")
