"""The deploy lock's shell script, run for real here: one winner, and a loser always learns who holds it."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

from sparkctl.commands.serve import LOCK_HELD, lock_argv, unlock_argv


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
    assert subprocess.run(unlock_argv("theirs", path)).returncode != 0
    assert json.loads(open(f"{path}/info.json").read())["who"] == "a"
