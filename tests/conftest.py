"""Shared fixtures: the real CLI (see clirun.py) and the example inventory."""

from __future__ import annotations

import pytest

from clirun import REPO, run_cli


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def example_inventory() -> str:
    return str(REPO / "inventory.example.yaml")
