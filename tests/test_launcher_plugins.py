"""The launchers as plugins: the profile's ``launcher`` chooses one, and serve, status, logs, stop
and ``up`` ask it instead of comparing the name (sparkctl/launchers/)."""

from __future__ import annotations

import inspect

import pytest

from sparkctl import launchers
from sparkctl.cli import serve_cmd
from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.ops import docker_up, native_up
from sparkctl.ops.native_up import NO_IMAGE
from sparkctl.ops.up import Up, UpOptions

INVENTORY = "cluster: onebox\nhosts:\n  - name: spark\n    address: 127.0.0.1\n    role: head\n"


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return load_inventory(str(path))


def single_box(launcher: str):
    return load_profile("single-box", sets=[f"launcher={launcher}"])


def test_an_unknown_launcher_names_the_field():
    with pytest.raises(ConfigError) as err:
        launchers.get("podman")
    assert err.value.field == "launcher"
    assert "docker" in str(err.value) and "native" in str(err.value)


def test_the_profile_chooses_its_launcher():
    native, docker = launchers.of(single_box("native").profile), launchers.of(single_box("docker").profile)
    assert (native.name, native.runs_containers) == ("native", False)
    assert (docker.name, docker.runs_containers) == ("docker", True)
    assert launchers.of(load_profile("sandbox").profile) is docker  # one object per launcher


@pytest.mark.parametrize("verb,args,kwargs", [
    ("serve", 4, {"dry_run": True, "timeout": None, "log_tail": 40, "parallel": False, "replica": None,
                  "locks": {"break_lock": False, "force_break_lock": False}, "pool_factory": None}),
    ("status", 5, {"watch": None, "pool_factory": None}),
    ("logs", 4, {"sets": [], "tail": 100, "follow": False, "pool_factory": None}),
    ("stop", 4, {"every_host": True, "break_lock": False, "force_break_lock": False, "grace_s": 60,
                 "pool_factory": None}),
])
def test_every_launchers_cli_half_takes_what_the_verb_hands_over(verb, args, kwargs):
    """serve_cmd hands each verb to the launcher's CLI half with the same arguments, whichever it is."""
    fronts = {name: serve_cmd.front(single_box(name).profile) for name in launchers.names()}
    assert fronts["docker"].__name__ == "sparkctl.cli.containers_cmd"
    assert fronts["native"].__name__ == "sparkctl.cli.native_cmd"
    for front in fronts.values():
        inspect.signature(getattr(front, verb)).bind(*[None] * args, **kwargs)  # TypeError if it cannot take them


def test_native_status_refuses_watch_before_asking_any_host():
    front = serve_cmd.front(single_box("native").profile)
    with pytest.raises(ConfigError) as err:
        front.status(None, None, [], single_box("native"), None, watch=5.0, pool_factory=None)
    assert err.value.field == "--watch"


def test_up_serves_the_single_box_with_the_native_launchers_steps(inventory):
    up = Up(inventory, "single-box", UpOptions(), pool=None, out=None)
    assert up.launcher.name == "native" and up.serve_plan is None
    assert up.native_plan.host == "spark" and [h.name for h in up.hosts] == ["spark"]
    assert up.endpoint == up.native_plan.endpoint == f"http://127.0.0.1:{up.profile.serving.port}"
    steps = {s.name: s for s in up.steps.steps}
    assert steps["serve"].look is native_up.look_serve and steps["serve"].act is native_up.act_serve
    up.steps.look(["build", "distribute", "engram"])  # no host is asked: a host process has no image
    assert {r.name: (r.status, r.reason) for r in up.steps.records() if r.name in ("build", "distribute", "engram")} \
        == {name: ("skipped", NO_IMAGE) for name in ("build", "distribute", "engram")}


def test_up_serves_the_same_profile_in_a_container_with_the_docker_launchers_steps(inventory):
    up = Up(inventory, "single-box", UpOptions(sets=("launcher=docker",)), pool=None, out=None)
    assert up.launcher.name == "docker" and up.native_plan is None
    assert up.serving.plan is up.serve_plan and up.serving.hosts == ["spark"]
    steps = {s.name: s for s in up.steps.steps}
    assert [s.name for s in up.steps.steps] == ["setup", "doctor", "checkpoint", "build", "distribute", "engram",
                                               "serve", "smoke"]
    assert (steps["build"].look, steps["distribute"].act, steps["serve"].act) == \
        (docker_up.look_build, docker_up.act_distribute, docker_up.act_serve)


def test_native_stop_dry_run_names_the_process_without_asking_the_host(inventory):
    doc = launchers.get("native").plan_stop(inventory, inventory.hosts, single_box("native"), pool=None)
    assert doc["ok"] and doc["dry_run"]
    assert doc["hosts"] == [{"name": "spark", "ok": True, "error": None,
                             "would_stop": ["the native engine of single-box (SIGTERM, then SIGKILL after the grace)"]}]


def test_the_containers_serve_plan_refuses_a_host_process(inventory):
    from sparkctl.ops.serve import build_plan

    with pytest.raises(ConfigError) as err:
        build_plan(inventory, "single-box")
    assert err.value.field == "launcher" and "launcher=docker" in str(err.value)
