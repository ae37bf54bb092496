"""The deploy lock's shell script, run for real here: one winner, and a loser always learns who holds it."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

from sparkctl.commands.lock import LOCK_HELD, NOT_HOLDER, lock_argv, unlock_argv


def test_concurrent_lockers_one_wins_and_every_loser_sees_the_details(tmp_path):
    path = str(tmp_path / "sparkctl" / "deploy.lock")

    def take(i: int):
        return subprocess.run(lock_argv({"who": f"runner-{i}", "token": f"t{i}"}, path), capture_output=True, text=True)

    for round_ in range(5):
        with ThreadPoolExecutor(max_workers=12) as pool:
            results = list(pool.map(take, range(12)))
        winners = [i for i, r in enumerate(results) if r.returncode == 0]
        assert len(winners) == 1, [r.returncode for r in results]
        held_by = json.loads(open(f"{path}/info.json").read())["who"]
        assert held_by == f"runner-{winners[0]}"
        for i, r in enumerate(results):
            if i != winners[0]:
                assert r.returncode == LOCK_HELD
                assert json.loads(r.stdout)["who"] == held_by  # never "held, no details yet"
        assert sorted(p.name for p in (tmp_path / "sparkctl").iterdir()) == ["deploy.lock"]  # no leftovers
        released = subprocess.run(unlock_argv(f"t{winners[0]}", path))
        assert released.returncode == 0
        assert not (tmp_path / "sparkctl" / "deploy.lock").exists()


def test_unlock_with_another_token_keeps_the_lock(tmp_path):
    path = str(tmp_path / "deploy.lock")
    assert subprocess.run(lock_argv({"who": "a", "token": "mine"}, path)).returncode == 0
    assert subprocess.run(unlock_argv("theirs", path)).returncode == NOT_HOLDER
    assert json.loads(open(f"{path}/info.json").read())["who"] == "a"


# ---------------------------------------------------------------------------------------------- live or dead holder

def _holder(**changes) -> dict:
    from sparkctl.ops.lock import this_process

    return {"who": "ops@ctl", "what": "serve tp4", "token": "t", "holder": {**this_process(), **changes}}


def test_this_process_holds_a_live_lock():
    from sparkctl.ops.lock import LIVE, holder_state

    state, why = holder_state(_holder())
    assert state == LIVE and f"process {os.getpid()}" in why and "still runs" in why


def test_a_finished_process_is_a_dead_holder():
    from sparkctl.ops.lock import DEAD, holder_state, process_start

    child = subprocess.Popen(["true"])
    started = process_start(child.pid)
    child.wait()
    state, why = holder_state(_holder(pid=child.pid, started=started))
    assert state == DEAD and f"process {child.pid}" in why and "is gone" in why


def test_a_reused_pid_is_a_dead_holder():
    """The pid runs, but another process than the one that took the lock (another start time)."""
    from sparkctl.ops.lock import DEAD, holder_state, process_start

    earlier = str(int(process_start(os.getpid())) - 1)
    state, why = holder_state(_holder(started=earlier))
    assert state == DEAD and "another process" in why


def test_a_restart_since_makes_the_holder_dead():
    from sparkctl.ops.lock import DEAD, holder_state

    assert holder_state(_holder(boot="00000000-0000-0000-0000-000000000000"))[0] == DEAD


def test_another_machine_or_no_holder_is_unknown():
    from sparkctl.ops.lock import UNKNOWN, holder_state

    state, why = holder_state(_holder(host="someone-elses-laptop"))
    assert state == UNKNOWN and "another machine (someone-elses-laptop)" in why
    assert holder_state({"who": "alice@laptop", "token": "t"})[0] == UNKNOWN  # an older lock: no process recorded


def test_process_start_reads_names_with_spaces_and_parentheses(tmp_path):
    """/proc/PID/stat's second field is the command name in parentheses, which may hold both."""
    import shutil

    from sparkctl.ops.lock import process_start

    odd = tmp_path / "a (b) c"
    shutil.copy("/bin/sleep", odd)
    child = subprocess.Popen([str(odd), "30"])
    try:
        with open(f"/proc/{child.pid}/stat") as f:
            text = f.read()
        assert "(a (b) c)" in text
        assert process_start(child.pid) == text.rsplit(")", 1)[1].split()[19]
        assert process_start(child.pid).isdigit()
    finally:
        child.kill()
        child.wait()
