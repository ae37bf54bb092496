"""up's plan without a cluster: its eight steps' looks (stand-ins here) through the one runner, and
what a step about to act changes for the looks after it."""

from __future__ import annotations

from sparkctl.ops.steps import FAILED, OK, PLANNED, SKIPPED, Look, Step, StepRun
from sparkctl.ops.up import STEPS, Up, UpReport
from sparkctl.reporter import Reporter


def planned_up(looks: dict[str, Look | Exception]) -> UpReport:
    """An Up whose steps look as ``looks`` says (an exception: the look fails); its plan."""

    def looker(name):
        def look(up):
            found = looks.get(name, Look(False, f"{name} already true"))
            if isinstance(found, Exception):
                raise found
            return found
        return look

    up = Up.__new__(Up)
    up.reporter = Reporter()
    up.steps = StepRun([Step(n, looker(n), lambda u, look: (OK, ""), gate="looks once setup has prepared the hosts"
                             if n == "setup" else "") for n in STEPS], up, up.reporter)
    up.report = UpReport("sandbox", up.steps.records())
    return up.plan()


def test_a_build_about_to_act_makes_the_copy_and_the_serve_act_too():
    plan = planned_up({"build": Look(True, "build patch of sparkctl/v4:patch")})
    status = {s.name: (s.status, s.reason) for s in plan.steps}
    assert status["build"][0] == PLANNED
    assert status["distribute"] == (PLANNED, "the image changes: copy its new layers to the other hosts")
    assert status["serve"] == (PLANNED, "the image changes: the engines restart on it")
    assert status["checkpoint"] == (OK, "checkpoint already true")


def test_a_skipped_copy_stays_skipped_when_the_build_acts():
    plan = planned_up({"build": Look(True, "build"), "distribute": Look(False, "no image", {"skip": True})})
    assert plan.step("distribute").status == SKIPPED


def test_engram_looks_again_after_the_checkpoint_it_cuts_from():
    plan = planned_up({"checkpoint": Look(True, "copy what differs"), "engram": RuntimeError("spark-2: shard source missing")})
    assert plan.step("engram").status == PLANNED
    assert plan.step("engram").reason == "looks again after the checkpoint step (cannot look: spark-2: shard source missing)"
    alone = planned_up({"engram": RuntimeError("spark-2: shard source missing")})
    assert alone.step("engram").status == FAILED and not alone.ok


def test_setup_about_to_act_leaves_every_other_look_for_after_it():
    plan = planned_up({"setup": Look(True, "prepare spark-2: folders"), "build": RuntimeError("no docker access")})
    assert [s.status for s in plan.steps] == [PLANNED] * len(STEPS)
    assert {s.reason for s in plan.steps[1:]} == {"looks once setup has prepared the hosts"}
    assert plan.ok and plan.to_json()["steps"][0] == {"name": "setup", "status": PLANNED,
                                                      "reason": "prepare spark-2: folders",
                                                      "seconds": round(plan.steps[0].seconds, 3)}
