"""Inventory merging, profile inheritance and overrides, host selection."""

from __future__ import annotations

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile, select_hosts
from sparkctl.errors import ConfigError


def test_example_inventory_describes_the_tp8_report_cluster(example_inventory):
    inv = load_inventory(example_inventory)
    hosts = inv.hosts
    # The TP8 vLLM report §5.4: the eight --hosts addresses, head first.
    assert [h.address for h in hosts] == [
        "192.168.1.153", "192.168.1.147", "192.168.1.157", "192.168.1.158",
        "192.168.1.161", "192.168.1.162", "192.168.1.166", "192.168.1.148",
    ]
    assert inv.head.name == "spark-153"
    # defaults are merged into every host
    assert all(h.ssh_user == "nvidia" and h.hcas == ("rocep1s0f0", "roceP2p1s0f0") for h in hosts)
    assert hosts[1].fabric_address == "10.10.10.147"


def test_host_settings_override_defaults(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(
        "defaults:\n  ssh: {user: nvidia, port: 22}\n  nvme_path: /mnt/nvme\n"
        "hosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n"
        "  - name: b\n    address: b.lan\n    ssh: {port: 2222}\n    nvme_path: /data\n"
    )
    a, b = load_inventory(path).hosts
    assert (a.ssh_user, a.ssh_port, a.nvme_path) == ("nvidia", 22, "/mnt/nvme")
    assert (b.ssh_user, b.ssh_port, b.nvme_path) == ("nvidia", 2222, "/data")
    assert b.fabric_address == "b.lan"  # no fabric address: the management one
    assert a.fabric_interfaces == ()


def test_ssh_target_leaves_unset_fields_to_ssh_config(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n")
    inv = load_inventory(path)
    target = inv.ssh_target(inv.head)
    assert (target.user, target.port, target.identity_file) == (None, None, None)


def test_profile_inheritance_and_null_removes():
    p = load_profile("tp8-300k").profile
    assert p.engine_args["speculative-config"]["num_speculative_tokens"] == 5  # from _dsv41-vllm
    assert p.env["NCCL_MAX_NCHANNELS"] == "8"  # from _dsv41, numbers become strings
    q = load_profile("tp8-300k", sets=["engine_args.limit-mm-per-prompt=null", "engine_args.max-num-partial-prefills=2"]).profile
    assert "limit-mm-per-prompt" not in q.engine_args
    assert q.engine_args["max-num-partial-prefills"] == 2


def test_set_and_env_overrides_keep_types():
    p = load_profile("tp4", sets=["max_model_len=131072", "autotune=false", "serving.port=9000"], envs=["NCCL_DEBUG=INFO"]).profile
    assert p.max_model_len == 131072 and p.autotune is False and p.serving.port == 9000
    assert p.env["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize("value", ["1", "[a, b]", "text"])
def test_env_added_to_a_set_env_that_is_no_mapping_names_the_field(value):
    """`--set env=1 --env K=V`: --env has no mapping to add to; a clear error naming env, not a crash
    (found by the fuzz property at its full count)."""
    with pytest.raises(ConfigError, match="must be a mapping") as err:
        load_profile("tp4", sets=[f"env={value}"], envs=["K=v"])
    assert err.value.field == "env"
    assert load_profile("tp4", sets=["env={A: b}"], envs=["K=v"]).profile.env == {"A": "b", "K": "v"}


def _hosts(example_inventory):
    return load_inventory(example_inventory).hosts


def test_select_hosts_takes_head_and_first_workers(example_inventory):
    hosts = _hosts(example_inventory)
    picked, note = select_hosts(load_profile("tp4").profile, hosts, None)
    assert [h.name for h in picked] == ["spark-153", "spark-147", "spark-157", "spark-158"]
    assert "uses 4 of 8 hosts" in note


def test_select_hosts_with_explicit_list_puts_head_first(example_inventory):
    hosts = _hosts(example_inventory)
    picked, note = select_hosts(load_profile("tp4").profile, hosts, ["spark-166", "spark-153", "spark-148", "spark-147"])
    assert [h.name for h in picked] == ["spark-153", "spark-166", "spark-148", "spark-147"]
    assert note is None


@pytest.mark.parametrize(
    "wanted,message",
    [
        (["spark-153", "spark-147"], "needs 4 hosts"),
        (["spark-153", "spark-147", "spark-157", "nope"], "unknown host 'nope'"),
        (["spark-153", "spark-153", "spark-157", "spark-158"], "named twice"),
    ],
)
def test_select_hosts_errors(example_inventory, wanted, message):
    with pytest.raises(ConfigError, match=message):
        select_hosts(load_profile("tp4").profile, _hosts(example_inventory), wanted)


def test_too_few_hosts_in_inventory(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n  - name: b\n    address: 10.0.0.2\n")
    with pytest.raises(ConfigError, match="needs 8 hosts .* inventory has 2"):
        select_hosts(load_profile("tp8-1m").profile, load_inventory(path).hosts, None)


def test_inventory_show_json(cli, example_inventory):
    result = cli("-i", example_inventory, "--json", "inventory", "show")
    assert result.code == 0, result
    data = result.json()
    assert data["cluster"] == "spark8"
    assert [h["role"] for h in data["hosts"]].count("head") == 1
    assert data["hosts"][0]["fabric_interfaces"] == ["enp1s0f0np0"]
