"""doctor's state-dir probe (the real script, run by a real sh) and its copy-paste fix hints."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from sparkctl.commands.probes import parse_state_dir, state_dir_argv
from sparkctl.ops.doctor import verdicts


def probe(path) -> str:
    return parse_state_dir(subprocess.run(state_dir_argv(str(path)), capture_output=True, text=True, check=True).stdout)


def test_nested_missing_state_dir_is_creatable(tmp_path):
    # serve creates the whole path (mkdir -p): doctor must not say "cannot be created".
    assert probe(tmp_path / "var" / "lib" / "sparkctl") == "creatable"
    assert probe(tmp_path) == "writable"


def test_state_dir_under_a_file_or_a_read_only_folder_is_denied(tmp_path):
    (tmp_path / "file").write_text("x")
    assert probe(tmp_path / "file" / "below" / "deeper") == "denied"
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert probe(locked / "a" / "b") == "denied"


@pytest.mark.parametrize("user", ["nvidia", None])
def test_state_dir_hint_is_shell_quoted(user, tmp_path):
    path = "/srv/state dir;touch " + str(tmp_path / "pwned")
    hint = verdicts.check_state_dir("denied", path, user).hint
    command = hint.split(": ", 1)[1]
    words = shlex.split(command.replace('"$USER"', "someone"))
    assert words[:3] == ["install", "-d", "-o"] and words[-1] == path
    assert len(words) == 5
