"""Fixtures of the remote-layer tests (the sandbox cluster of tests/sandbox_fixture.py, shared with tests/sandbox)."""

import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from sandbox_fixture import busybox_tar, isolated_home, sandbox_cluster  # noqa: E402,F401
