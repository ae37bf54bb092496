"""Malformed inventories and profiles: each is one clear line naming the field (and the YAML line), exit 2,
no traceback, nothing on stdout."""

from __future__ import annotations

import textwrap

import pytest

GOOD_HOSTS = """\
hosts:
  - name: a
    address: 10.0.0.1
    role: head
  - name: b
    address: 10.0.0.2
"""

# (id, inventory text, expected fragments of the one-line message)
BAD_INVENTORIES = [
    ("top-level-list", "- name: a\n  address: 10.0.0.1\n", ["YAML mapping"]),
    ("empty-file", "", ["YAML mapping"]),
    ("no-hosts", "cluster: x\n", ["hosts", "required field is missing"]),
    ("hosts-empty", "hosts: []\n", ["hosts", "at least 1"]),
    ("hosts-mapping", "hosts:\n  a: 10.0.0.1\n", ["hosts", "valid list"]),
    ("unknown-top-key", "colour: red\n" + GOOD_HOSTS, [":1:", "colour", "unknown field"]),
    ("unknown-host-key", GOOD_HOSTS + "    rack: 3\n", [":7:", "hosts[1].rack", "unknown field"]),
    ("host-without-name", "hosts:\n  - address: 10.0.0.1\n    role: head\n", ["hosts[0].name", "required"]),
    ("host-without-address", "hosts:\n  - name: a\n    role: head\n", ["hosts[0].address", "required"]),
    ("duplicate-name", GOOD_HOSTS.replace("name: b", "name: a"), [":5:", "hosts[1].name", "duplicate host name"]),
    ("duplicate-address", GOOD_HOSTS.replace("10.0.0.2", "10.0.0.1"), [":6:", "hosts[1].address", "duplicate address"]),
    ("fabric-clashes-with-address", GOOD_HOSTS + "    fabric_addresses: [10.0.0.1]\n", ["hosts[1].fabric_addresses", "duplicate address"]),
    ("two-heads", GOOD_HOSTS + "    role: head\n", [":7:", "hosts[1].role", "two heads"]),
    ("no-head", GOOD_HOSTS.replace("    role: head\n", ""), ["hosts", "role: head"]),
    ("bad-role", GOOD_HOSTS + "    role: boss\n", ["hosts[1].role", "'head' or 'worker'"]),
    ("relative-nvme", GOOD_HOSTS + "    nvme_path: mnt/nvme\n", [":7:", "hosts[1].nvme_path", "relative path"]),
    ("relative-model-dir", "paths:\n  model_dir: models/dsv41\n" + GOOD_HOSTS, [":2:", "paths.model_dir", "relative path"]),
    ("relative-identity", "defaults:\n  ssh:\n    identity_file: id_ed25519\n" + GOOD_HOSTS, [":3:", "defaults.ssh.identity_file", "relative path"]),
    ("relative-known-hosts", "known_hosts: known_hosts\n" + GOOD_HOSTS, [":1:", "known_hosts", "relative path"]),
    ("port-zero", GOOD_HOSTS + "    ssh: {port: 0}\n", ["hosts[1].ssh.port", "greater than or equal to 1"]),
    ("port-too-big", GOOD_HOSTS + "    ssh: {port: 70000}\n", ["hosts[1].ssh.port", "less than or equal to 65535"]),
    ("port-not-a-number", GOOD_HOSTS + "    ssh: {port: ssh}\n", ["hosts[1].ssh.port", "valid integer"]),
    ("name-with-space", GOOD_HOSTS.replace("name: b", "name: spark 2"), [":5:", "hosts[1].name", "not a valid name"]),
    ("name-with-semicolon", GOOD_HOSTS.replace("name: b", "name: 'b;reboot'"), ["hosts[1].name", "not a valid name"]),
    ("address-with-shell", GOOD_HOSTS.replace("10.0.0.2", "'$(reboot)'"), [":6:", "hosts[1].address", "neither an IP address nor a valid hostname"]),
    ("address-with-space", GOOD_HOSTS.replace("10.0.0.2", "'spark 2.lan'"), ["hosts[1].address", "valid hostname"]),
    ("user-with-space", GOOD_HOSTS + "    ssh: {user: 'nv idia'}\n", ["hosts[1].ssh.user", "not a valid user name"]),
    ("interface-too-long", GOOD_HOSTS + "    fabric_interfaces: [enp1s0f0np0-way-too-long]\n", ["hosts[1].fabric_interfaces[0]", "interface"]),
    ("cluster-name-with-slash", "cluster: a/b\n" + GOOD_HOSTS, [":1:", "cluster", "not a valid name"]),
    ("yaml-syntax", "hosts:\n  - name: a\n    address: [10.0.0.1\n", ["invalid YAML"]),
    ("yaml-duplicate-key", "hosts:\n  - name: a\n    name: b\n    address: 10.0.0.1\n    role: head\n", [":3:", "duplicate key 'name'"]),
]


def assert_clean_usage_error(result, fragments):
    assert result.code == 2, result
    assert result.stdout == "", result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize("case_id,text,fragments", BAD_INVENTORIES, ids=[c[0] for c in BAD_INVENTORIES])
def test_bad_inventory(tmp_path, cli, case_id, text, fragments):
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    result = cli("-i", str(path), "inventory", "check")
    assert_clean_usage_error(result, [str(path)] + fragments)


def test_missing_inventory_file(cli, tmp_path):
    result = cli("-i", str(tmp_path / "nope.yaml"), "inventory", "show")
    assert_clean_usage_error(result, ["nope.yaml", "file not found"])


def test_inventory_from_environment_variable(cli, tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(GOOD_HOSTS.replace("10.0.0.2", "'bad host'"))
    result = cli("inventory", "check", env={"SPARKCTL_INVENTORY": str(path)})
    assert_clean_usage_error(result, [str(path), "hosts[1].address"])


BASE = "extends: tp8-1m\n"

# (id, profile text, extra CLI args, expected fragments)
BAD_PROFILES = [
    ("unknown-field", BASE + "max_model_length: 5\n", [], [":2:", "max_model_length", "unknown field"]),
    ("gmu-above-one", BASE + "gpu_memory_utilization: 1.5\n", [], [":2:", "gpu_memory_utilization", "less than or equal to 1"]),
    ("tp-zero", BASE + "tensor_parallel: 0\n", [], [":2:", "tensor_parallel", "greater than or equal to 1"]),
    ("bad-engine", BASE + "engine: tgi\n", [], [":2:", "engine", "'vllm', 'sglang' or 'single-box'"]),
    ("bad-engram-mode", BASE + "engram:\n  mode: floppy\n", [], [":3:", "engram.mode"]),
    ("bad-ulimit-name", BASE + "container:\n  ulimits:\n    nofiles: 10\n", [], ["container.ulimits", "unknown ulimit 'nofiles'"]),
    ("ulimit-soft-above-hard", BASE + "container:\n  ulimits:\n    nofile: 2048:1024\n", [], ["container.ulimits.nofile", "exceeds hard limit"]),
    ("bad-env-name", BASE + "env:\n  'NCCL DEBUG': INFO\n", [], [":2:", "env", "not a valid environment variable name"]),
    ("env-value-mapping", BASE + "env:\n  NCCL_DEBUG: {level: INFO}\n", [], ["env", "must be a string or a number"]),
    ("bad-capability", BASE + "container:\n  cap_add: [ipc-lock]\n", [], ["container.cap_add", "not a capability name"]),
    ("extends-unknown", "extends: tp9\n", [], ["extends", "unknown profile 'tp9'"]),
    ("extends-loop", "extends: loop-b\n", [], ["extends", "inheritance loops"]),
    ("set-bad-value", BASE, ["--set", "max_model_len=lots"], ["max_model_len", "--set max_model_len=lots"]),
    ("set-without-equals", BASE, ["--set", "max_model_len"], ["--set expects KEY=VALUE"]),
    ("set-through-scalar", BASE, ["--set", "max_model_len.x=1"], ["max_model_len is not a mapping"]),
    ("env-bad-name", BASE, ["--env", "1BAD=x"], ["--env", "not a valid environment variable name"]),
    ("bad-image-tag", BASE + "image:\n  tag: 'vllm dsv41'\n", [], ["image.tag"]),
]


@pytest.mark.parametrize("case_id,text,extra,fragments", BAD_PROFILES, ids=[c[0] for c in BAD_PROFILES])
def test_bad_profile(tmp_path, cli, case_id, text, extra, fragments):
    (tmp_path / "loop-b.yaml").write_text("extends: loop-a\n")
    (tmp_path / "loop-a.yaml").write_text("extends: loop-b\n")
    path = tmp_path / "candidate.yaml"
    path.write_text(text)
    result = cli("plan", "--profile", str(path), *extra)
    assert_clean_usage_error(result, fragments)


@pytest.mark.parametrize("where, expected", [("folder", "not a regular file"), ("device", "not a regular file"),
                                             ("missing", "profile file not found"), ("dangling", "symbolic link")])
def test_a_profile_path_that_is_no_file_is_named_as_such(cli, tmp_path, where, expected):
    """A folder or a device given as the profile is there but is no file; a missing one is not found."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "dangling.yaml").symlink_to(tmp_path / "gone.yaml")
    path = {"folder": str(tmp_path / "recipes") + "/", "device": "/dev/null", "missing": str(tmp_path / "nope.yaml"),
            "dangling": str(tmp_path / "dangling.yaml")}[where]
    result = cli("plan", "--profile", path)
    assert_clean_usage_error(result, [path, expected])


def test_unknown_profile_name_lists_the_known_ones(cli):
    result = cli("plan", "--profile", "tp16")
    assert_clean_usage_error(result, ["unknown profile 'tp16'", "tp8-1m", "tp4"])


def test_abstract_profile_cannot_be_used(cli):
    result = cli("plan", "--profile", "_dsv41-vllm")
    assert_clean_usage_error(result, ["abstract base"])


def test_user_recipes_folder_adds_profiles(cli, tmp_path):
    (tmp_path / "tp8-half.yaml").write_text(textwrap.dedent("""\
        extends: tp8-1m
        max_model_len: 524288
    """))
    result = cli("profiles", "--json", env={"SPARKCTL_RECIPES": str(tmp_path)})
    assert result.code == 0, result
    rows = {r["name"]: r for r in result.json()["profiles"]}
    assert rows["tp8-half"]["max_model_len"] == 524288
    assert rows["tp8-half"]["extends"] == ["tp8-1m", "_dsv41-vllm", "_dsv41"]
