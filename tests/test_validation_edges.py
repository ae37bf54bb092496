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


# ---------------------------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("setting, field", [
    ("memory.weights_total_gb=.inf", "memory.weights_total_gb"),
    ("memory.weights_total_gb=1e400", "memory.weights_total_gb"),  # overflows to inf
    ("gpu_memory_utilization=.nan", "gpu_memory_utilization"),
    ("serving.port=true", "serving.port"),
    ("serving.port=22.0", "serving.port"),
    ("distributed.master_port=false", "distributed.master_port"),
])
def test_infinities_booleans_and_floats_are_refused_naming_the_field(setting, field):
    from sparkctl.config.profile import load_profile

    with pytest.raises(ConfigError) as err:
        load_profile("sandbox", sets=[setting])
    assert field in str(err.value), str(err.value)


def test_an_ssh_port_of_true_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="port"):
        load_inventory(_inventory(tmp_path, "name: b\n    ssh: {port: true}"))
    with pytest.raises(ConfigError, match="port"):
        load_inventory(_inventory(tmp_path, "name: b\n    ssh: {port: 22.0}"))
    assert load_inventory(_inventory(tmp_path, "name: b\n    ssh: {port: 2222}")).hosts[1].ssh_port == 2222


@pytest.mark.parametrize("args", [
    ["status", "--profile", "sandbox", "--watch", "inf"],
    ["serve", "--profile", "sandbox", "--health-timeout", "inf", "--dry-run"],
    ["doctor", "--profile", "sandbox", "--connect-timeout", "inf"],
])
def test_an_infinite_option_exits_2_naming_it(cli, example_inventory, args):
    result = cli("-i", example_inventory, *args, timeout=60)
    assert result.code == 2, result
    assert args[3] in result.stderr and "Traceback" not in result.stderr and "unexpected" not in result.stderr, result.stderr


# ---------------------------------------------------------------------------------------------- YAML and messages

def test_yaml_merge_keys_are_read_and_explicit_keys_win(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("defaults:\n  ssh: &ssh\n    user: nvidia\n    port: 22\n"
                    "hosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n    ssh:\n      <<: *ssh\n      port: 2222\n")
    host = load_inventory(path).hosts[0]
    assert (host.ssh_user, host.ssh_port) == ("nvidia", 2222)


def test_a_duplicate_key_beside_a_merge_is_still_refused(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("defaults:\n  ssh: &ssh {user: nvidia}\n"
                    "hosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n    role: head\n")
    with pytest.raises(ConfigError, match="duplicate key"):
        load_inventory(path)


def test_a_huge_value_is_not_echoed_whole(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  - name: " + "a" * 200_000 + "\n    address: 10.0.0.1\n    role: head\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert len(str(err.value)) < 1000 and "characters left out" in str(err.value), len(str(err.value))


def test_ssh_latency_is_not_read_as_clock_skew():
    """A host behind a 0.7 s link: its reading lands up to the whole round trip late (the finding: +0.65 s
    read as skew); its clock is right, so within the round trip's window it passes."""
    from sparkctl.ops.doctor import verdicts as v

    offsets = {"a": 0.0, "b": 0.01, "c": 0.65}
    assert v.check_clock(offsets)["c"].status == "warn"  # without the window: what doctor said before
    judged = v.check_clock(offsets, uncertainty={"a": 0.01, "b": 0.01, "c": 0.7})
    assert judged["c"].status == "pass" and "SSH round trip" in judged["c"].detail, judged["c"]
    skewed = v.check_clock({"a": 0.0, "b": 0.01, "c": 3.0}, uncertainty={"a": 0.01, "b": 0.01, "c": 0.7})
    assert skewed["c"].status == "warn"  # 3 s minus the 0.71 s window: still skew
    assert v.check_clock({"a": 0.0, "b": 0.01, "c": 9.0}, uncertainty={"c": 0.7})["c"].status == "fail"


def test_doctor_fails_the_disk_check_when_dockers_folder_is_full():
    """The finding: a full docker data folder failed distribute after its whole stream while doctor's
    disk check (of the NVMe path) still passed."""
    from sparkctl.commands.probes import Disk, parse_docker_info
    from sparkctl.ops.doctor import verdicts as v

    nvme = v.check_disk(Disk(900 * 2**30, "/mnt/nvme"), None, "/mnt/nvme")
    assert nvme.status == "pass"
    full = v.with_docker_disk(nvme, Disk(10 * 2**20, "/var/lib/docker"), "/var/lib/docker")
    assert full.status == "fail" and "/var/lib/docker" in full.detail and "docker image prune" in full.hint
    assert v.with_docker_disk(nvme, Disk(50 * 2**30, "/"), "/var/lib/docker") is nvme
    info = parse_docker_info('{"ServerVersion": "28.0", "DockerRootDir": "/var/lib/docker"}')
    assert info.root_dir == "/var/lib/docker"
