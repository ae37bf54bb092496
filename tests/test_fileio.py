"""atomic_write: the old content or the new one under the final name, never a torn file."""

from __future__ import annotations

import os

import pytest

from sparkctl.fileio import atomic_write


def test_writes_content_and_mode_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "engine.env"
    atomic_write(target, "A=1\n", mode=0o600)
    assert target.read_text() == "A=1\n"
    assert (target.stat().st_mode & 0o777) == 0o600
    atomic_write(target, b"A=2\n")
    assert target.read_bytes() == b"A=2\n"
    assert os.listdir(target.parent) == ["engine.env"]


def test_a_failed_rename_leaves_no_temp_file(tmp_path):
    """The rename fails (the target is a non-empty folder): the error surfaces, the folder is
    untouched and no temp file is left beside it."""
    target = tmp_path / "engine.env"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        atomic_write(target, "A=1\n")
    assert sorted(os.listdir(tmp_path)) == ["engine.env"]
    assert (target / "keep").read_text() == "x"
