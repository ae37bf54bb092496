"""The one step runner (sparkctl.ops.steps.StepRun) and the one reporter it tells (sparkctl.reporter)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from sparkctl.ops.steps import CHANGED, FAILED, OK, PLANNED, SKIPPED, Look, Step, StepFailed, StepRun, run_steps
from sparkctl.reporter import DONE, LOOKED, NOTE, STARTED, Reporter, console_renderer


class World:
    """A run context: a few facts the steps look at and change, and a log of what was called."""

    def __init__(self, **facts):
        self.facts = dict(facts)
        self.calls: list[str] = []


def fact_step(name: str, fact: str, *, gate: str = "", fails: bool = False) -> Step:
    """A step that makes ``fact`` true when it is not."""

    def look(world: World) -> Look:
        world.calls.append(f"look {name}")
        if world.facts.get(fact) is None:
            return Look(False, f"{fact} does not apply", {"skip": True})
        return Look(not world.facts[fact], f"{fact} is {'missing' if not world.facts[fact] else 'there'}")

    def act(world: World, look: Look) -> tuple[str, str]:
        world.calls.append(f"act {name}")
        if fails:
            raise StepFailed(f"cannot make {fact}")
        world.facts[fact] = True
        return CHANGED, f"made {fact}"

    return Step(name, look, act, gate=gate)


def statuses(run: StepRun) -> dict[str, str]:
    return {r.name: r.status for r in run.records()}


def test_a_look_changes_nothing_and_says_planned_ok_or_skipped():
    world = World(image=False, model=True, shards=None)
    steps = [fact_step("build", "image"), fact_step("copy", "model"), fact_step("cut", "shards")]
    run = run_steps(steps, world, Reporter(), dry_run=True)
    assert statuses(run) == {"build": PLANNED, "copy": OK, "cut": SKIPPED}
    assert world.facts == {"image": False, "model": True, "shards": None}
    assert not [c for c in world.calls if c.startswith("act")]


def test_act_reuses_the_plans_look_until_a_step_changes_something():
    world = World(image=False, model=True)
    run = run_steps([fact_step("build", "image"), fact_step("copy", "model")], world, Reporter())
    assert statuses(run) == {"build": CHANGED, "copy": OK}
    # build acted on its plan's look; copy looked again after build changed something
    assert world.calls == ["look build", "look copy", "act build", "look copy"]
    second = run_steps([fact_step("build", "image"), fact_step("copy", "model")], world, Reporter())
    assert statuses(second) == {"build": OK, "copy": OK}


def test_the_first_failure_stops_the_run_and_names_itself_in_the_rest():
    world = World(image=False, model=False)
    run = run_steps([fact_step("build", "image", fails=True), fact_step("copy", "model")], world, Reporter())
    records = {r.name: r for r in run.records()}
    assert records["build"].status == FAILED and records["build"].reason == "cannot make image"
    assert records["copy"].status == SKIPPED and records["copy"].reason == "not run: build failed"
    assert "act copy" not in world.calls and run.failed == "build"


def test_keep_going_runs_every_step_past_a_failure():
    world = World(image=False, model=False)
    run = run_steps([fact_step("build", "image", fails=True), fact_step("copy", "model")], world, Reporter(),
                    keep_going=True)
    assert statuses(run) == {"build": FAILED, "copy": CHANGED}


def test_a_look_that_raises_fails_its_step_before_anything_acts():
    def broken(world):
        raise RuntimeError("cannot ask docker:\n permission denied")

    world = World(model=False)
    run = run_steps([Step("build", broken, lambda w, look: (OK, "")), fact_step("copy", "model")], world, Reporter())
    records = {r.name: r for r in run.records()}
    assert records["build"].status == FAILED and records["build"].reason == "cannot look: cannot ask docker: permission denied"
    assert records["copy"].status == SKIPPED and world.facts["model"] is False


def test_a_bug_in_a_step_is_raised_not_reported():
    def buggy(world, look):
        raise KeyError("hosts")

    with pytest.raises(KeyError):
        run_steps([Step("build", lambda w: Look(True, "go"), buggy)], World(), Reporter())


def test_a_gate_that_will_act_leaves_the_later_steps_unlooked():
    world = World(prepared=False, image=False)
    steps = [fact_step("setup", "prepared", gate="looks once setup has prepared the hosts"), fact_step("build", "image")]
    run = run_steps(steps, world, Reporter(), dry_run=True)
    assert [(r.name, r.status, r.reason) for r in run.records()] == [
        ("setup", PLANNED, "prepared is missing"), ("build", PLANNED, "looks once setup has prepared the hosts")]
    assert world.calls == ["look setup"]


def test_a_first_step_alone_then_the_rest_as_up_runs_them_around_its_lock():
    world = World(prepared=False, image=False)
    steps = [fact_step("setup", "prepared", gate="wait"), fact_step("build", "image")]
    run = StepRun(steps, world, Reporter())
    run.look(["setup"])
    run.act(["setup"])
    assert statuses(run) == {"setup": CHANGED, "build": PLANNED}
    run.look(["build"])
    run.act(["build"])
    assert statuses(run) == {"setup": CHANGED, "build": CHANGED}


def test_every_step_reports_its_look_start_and_end_in_order():
    reporter = Reporter()
    run_steps([fact_step("build", "image")], World(image=False), reporter)
    kinds = [(e.kind, e.step, e.status) for e in reporter.events]
    assert kinds == [(LOOKED, "build", PLANNED), (STARTED, "build", None), (DONE, "build", CHANGED)]
    assert reporter.events[-1].seconds >= 0


def test_per_host_steps_are_recorded_apart():
    reporter = Reporter()
    run_steps([fact_step("folders", "ok")], World(ok=False), reporter, host="spark-1")
    run_steps([fact_step("folders", "ok")], World(ok=True), reporter, host="spark-2")
    assert [r.status for r in reporter.steps(["folders"], "spark-1")] == [CHANGED]
    assert [r.status for r in reporter.steps(["folders"], "spark-2")] == [OK]
    assert [r.status for r in reporter.steps(["folders"])] == [PLANNED]  # never reported for the run itself


def _drawn(style: str, events) -> str:
    buffer = io.StringIO()
    reporter = Reporter(console_renderer(Console(file=buffer, force_terminal=style == "rich", width=60), style))
    for emit in events:
        emit(reporter)
    return buffer.getvalue()


EVENTS = [lambda r: r.looked("build", PLANNED, "inputs changed"), lambda r: r.started("build"),
          lambda r: r.note("building [patch] layer"), lambda r: r.done("build", CHANGED, "built patch " + "x" * 80, 1.25),
          lambda r: r.warning("could not release the lock"), lambda r: r.done("folders", OK, "already so", 0, "spark-2")]


def test_plain_lines_are_what_a_log_greps():
    assert _drawn("plain", EVENTS).splitlines() == [
        "== build", "building [patch] layer", "build: changed: built patch " + "x" * 80,
        "warning: could not release the lock", "spark-2: folders: ok: already so"]


def test_json_lines_carry_every_event_looks_included():
    docs = [json.loads(line) for line in _drawn("json", EVENTS).splitlines()]
    assert [d["event"] for d in docs] == [LOOKED, STARTED, NOTE, DONE, "warning", DONE]
    assert docs[3] == {"event": DONE, "step": "build", "status": CHANGED, "reason": "built patch " + "x" * 80, "seconds": 1.25}
    assert docs[5]["host"] == "spark-2" and "host" not in docs[0]


def test_rich_text_keeps_brackets_in_the_words():
    text = _drawn("rich", EVENTS)
    assert "building [patch] layer" in text and "changed" in text and "\x1b[" in text  # coloured on a terminal


def _unreachable_after(world: World, name: str):
    from sparkctl.remote.result import RemoteError

    def look(w):
        w.calls.append(f"look {name}")
        raise RemoteError("spark-2", "timeout", "connection timed out")

    return Step(name, look, lambda w, look: (OK, ""))


def test_a_host_lost_fails_every_undecided_step_and_tries_nothing_more_there():
    world = World(prepared=True, image=False)
    steps = [fact_step("folders", "prepared"), _unreachable_after(world, "fabric"), fact_step("runtime", "image")]
    run = run_steps(steps, world, Reporter(), host="spark-2", keep_going=True)
    records = {r.name: (r.status, r.reason) for r in run.records()}
    assert records["folders"] == (OK, "prepared is there")
    assert records["fabric"] == records["runtime"] == (FAILED, "spark-2: connection timed out [timeout]")
    assert world.calls == ["look folders", "look fabric"] and run.lost


def test_the_verbs_own_errors_go_up_instead_of_failing_a_step():
    class NeedsPassword(Exception):
        pass

    def act(w, look):
        raise NeedsPassword("spark-1: sudo asks for a password")

    with pytest.raises(NeedsPassword):
        run_steps([Step("folders", lambda w: Look(True, "to create"), act)], World(), Reporter(), raise_on=(NeedsPassword,))


def test_a_step_that_sees_only_some_steps_keeps_its_look_when_another_changed_something():
    """``sees``: up's Engram look is not redone (a python3 per host) because the image changed."""
    world = World(image=False, model=False, shards=True)
    sees_model = fact_step("cut", "shards")
    sees_model.sees = ("copy",)
    run = run_steps([fact_step("build", "image"), sees_model], world, Reporter())
    assert statuses(run) == {"build": CHANGED, "cut": OK}
    assert world.calls == ["look build", "look cut", "act build"]  # build changed the image, not what cut sees
    world = World(model=False, shards=True)
    run_steps([fact_step("copy", "model"), sees_model], world, Reporter())
    assert world.calls == ["look copy", "look cut", "act copy", "look cut"]  # copy did change what it sees


def test_without_relook_the_plan_is_what_runs():
    world = World(image=False, model=True)
    run_steps([fact_step("build", "image"), fact_step("copy", "model")], world, Reporter(), relook=False)
    assert world.calls == ["look build", "look copy", "act build"]


def test_the_outputs_reporter_draws_json_lines_when_asked_and_plain_lines_in_a_log(monkeypatch):
    from sparkctl.output import Output

    for wanted, first in (("json", '{"event": "started", "step": "build", "reason": ""}'), ("", "== build")):
        monkeypatch.setenv("SPARKCTL_EVENTS", wanted)
        out, buffer = Output(), io.StringIO()
        out._console = Console(file=buffer, force_terminal=False, width=300)
        out.reporter.started("build")
        out.reporter.done("build", CHANGED, "built patch", 1.0)
        assert buffer.getvalue().splitlines()[0] == first
        assert [e.kind for e in out.reporter.events] == [STARTED, DONE]


class _Report:
    ok, stage, message = False, "lock", ""

    def fail(self, stage, message):
        self.ok, self.stage, self.message = False, stage, message


def _serve_run(fail_at: str = "", error: Exception | None = None):
    """A serve's stage sequence with its stages stood in for: which ran, and where it stopped."""
    from sparkctl.ops.serve import ServeRun, StageFailed

    serve = ServeRun.__new__(ServeRun)
    serve.report, serve.events, ran = _Report(), Reporter(), []

    def stage(name):
        def work(*args):
            ran.append(name)
            if name == fail_at:
                serve.report.fail("start", f"{name} failed on spark-2")
                raise error or StageFailed(f"{name} failed on spark-2")
        return work

    for method in ("facts", "files", "replace", "room", "start", "health", "record", "commit"):
        setattr(serve, method, stage(method))
    return serve, ran


def test_the_serve_stages_run_through_the_runner_and_stop_at_the_first_failure():
    serve, ran = _serve_run()
    serve.run(None, 50, None)
    assert serve.report.ok and serve.report.stage == "done" and len(ran) == 8
    assert [r.status for r in serve.events.steps()] == [OK, CHANGED, CHANGED, OK, CHANGED, OK, CHANGED, CHANGED]

    failed, ran = _serve_run("start")
    failed.run(None, 50, None)
    assert ran == ["facts", "files", "replace", "room", "start"]
    assert not failed.report.ok and failed.report.message == "start failed on spark-2"
    assert {r.name: r.status for r in failed.events.steps()}["commit"] == SKIPPED


def test_an_error_no_serve_stage_foresaw_goes_up_unchanged():
    serve, ran = _serve_run("room", error=RuntimeError("cannot write /etc/x"))
    with pytest.raises(RuntimeError, match="cannot write /etc/x"):
        serve.run(None, 50, None)
    assert ran[-1] == "room"
