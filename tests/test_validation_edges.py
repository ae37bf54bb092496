"""Values that used to slip through validation: a trailing newline (Python's ``$`` matches before
one), ports given as ``true`` or ``22.0``, infinities and overflows, long values echoed whole."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def _inventory(tmp_path, host_b: str = "name: b", extra: str = "") -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(extra + "hosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n"
                    f"  - {host_b}\n    address: 10.0.0.2\n")
    return path


@pytest.mark.parametrize("host_b", [
    'name: "spark-3\\n"',
    'name: b\n    fabric_interfaces: ["enp1s0f0np0\\n"]',
    'name: b\n    ssh: {user: "nvidia\\n"}',
])
def test_a_trailing_newline_is_refused_naming_the_field(tmp_path, host_b):
    with pytest.raises(ConfigError) as err:
        load_inventory(_inventory(tmp_path, host_b))
    assert "hosts[1]" in str(err.value) or "hosts.1" in str(err.value), str(err.value)


def test_an_address_with_a_trailing_newline_is_refused(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text('hosts:\n  - name: a\n    address: "spark-a.lan\\n"\n    role: head\n')
    with pytest.raises(ConfigError):
        load_inventory(path)


def test_no_validation_pattern_in_the_code_ends_in_a_bare_dollar():
    """Python's ``$`` also matches before a final newline: anchors are ``\\Z`` (or fullmatch).
    Pydantic's ``pattern=`` (a Rust regex, where ``$`` is the end of the text) is not concerned."""
    offenders = []
    for path in (REPO / "sparkctl").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "pattern=" in line:
                continue
            for literal in re.findall(r"re\.(?:compile|match|search|fullmatch)\(r?\"([^\"]*)\"", line):
                if literal.endswith("$") and not literal.endswith("\\$"):
                    offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert not offenders, offenders


@pytest.mark.parametrize("validator, value", [
    ("_name", "spark-3\n"), ("_user", "nvidia\n"), ("_ifname", "enp1s0\n"), ("_address", "spark.lan\n"),
])
def test_field_validators_refuse_a_trailing_newline(validator, value):
    from sparkctl.config import fields

    with pytest.raises(ValueError):
        getattr(fields, validator)(value)
    getattr(fields, validator)(value.rstrip("\n"))
