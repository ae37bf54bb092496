"""A deploy lock whose holder provably no longer exists (this machine, this boot, process gone) is
released with a line saying so; any other is still refused. The real lock scripts run here under sh."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from sparkctl.commands.lock import lock_argv
from sparkctl.ops.lock import LockRefused, deploy_lock, this_process
from sparkctl.ops.up import UpReport, UpStep
from sparkctl.reporter import NOTE, Reporter
from test_fact_failures import LocalConnection


def _site(tmp_path):
    conn = LocalConnection(str(tmp_path))
    inventory = SimpleNamespace(head=SimpleNamespace(name="spark-1"), ssh_target=lambda host: host,
                                model=SimpleNamespace(paths=SimpleNamespace(state_dir=str(tmp_path / "state"))))
    return inventory, SimpleNamespace(get=lambda target: conn), str(tmp_path / "state" / "deploy.lock")


def _plant(path: str, **holder) -> None:
    info = {"who": "alice@laptop", "when": "2026-01-01T00:00:00Z", "what": "serve", "token": "old",
            "holder": {**this_process(), **holder}}
    assert subprocess.run(lock_argv(info, path)).returncode == 0


def _dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def test_a_dead_holder_on_this_machine_and_boot_is_released_saying_so(tmp_path):
    inventory, pool, path = _site(tmp_path)
    pid = _dead_pid()
    _plant(path, pid=pid, started="1")
    reporter = Reporter()
    with deploy_lock(inventory, pool, verb="serve", what="serve x", reporter=reporter) as held:
        info = json.loads(open(f"{path}/info.json").read())
        assert info["token"] == held.token  # ours now
    said = [e.reason for e in reporter.events if e.kind == NOTE]
    assert said[0] == f"deploy lock on spark-1 ({path})"
    assert any("releasing a stale deploy lock" in line and f"process {pid}" in line for line in said), said


@pytest.mark.parametrize("holder, why", [
    ({"boot": "an-earlier-boot"}, "--break-lock"),  # before a reboot (or a clone of this machine)
    ({"host": "another-machine"}, "--break-lock"),  # another machine's processes cannot be seen
    ({}, "still runs"),  # this very process: live
])
def test_any_other_holder_is_still_refused(tmp_path, holder, why):
    inventory, pool, path = _site(tmp_path)
    dead = {"pid": _dead_pid(), "started": "1"} if holder else {}
    _plant(path, **dead, **holder)
    with pytest.raises(LockRefused, match=why):
        with deploy_lock(inventory, pool, verb="serve", what="serve x"):
            pass
    assert json.loads(open(f"{path}/info.json").read())["token"] == "old"


def test_up_json_on_a_refusal_carries_the_error():
    report = UpReport("sandbox", [UpStep("doctor")], message="the deploy lock spark-1:/x is held by bob@ci")
    doc = report.to_json()
    assert doc["ok"] is False and "held by bob@ci" in doc["error"]
