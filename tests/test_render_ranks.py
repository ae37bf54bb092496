"""Rank arguments: who is rank 0, what every rank is told about the head, and how --hosts picks."""

from __future__ import annotations

import shlex

import pytest

from test_render_helpers import engine_flags, parse_options, render, render_json, split_engine_argv

# inventory.example.yaml, in file order: (name, fabric address); spark-153 is the head.
INVENTORY_HOSTS = [
    ("spark-153", "10.10.10.153"), ("spark-147", "10.10.10.147"), ("spark-157", "10.10.10.157"),
    ("spark-158", "10.10.10.158"), ("spark-161", "10.10.10.161"), ("spark-162", "10.10.10.162"),
    ("spark-166", "10.10.10.166"), ("spark-148", "10.10.10.148"),
]
FABRIC = dict(INVENTORY_HOSTS)


def vllm_options(host):
    return parse_options(split_engine_argv(host["engine_argv"])[1], engine_flags("vllm", "0.33.0"))


def labels(host):
    argv = host["docker_argv"]
    return dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "--label")


def test_tp8_ranks_follow_the_inventory_with_the_head_first():
    data = render_json("--profile", "tp8-1m")
    assert [(h["name"], h["rank"]) for h in data["hosts"]] == [(name, r) for r, (name, _) in enumerate(INVENTORY_HOSTS)]
    for host in data["hosts"]:
        options = vllm_options(host)
        assert options["--node-rank"] == str(host["rank"])
        assert options["--nnodes"] == "8"
        assert options["--tensor-parallel-size"] == "8"
        assert options["--master-addr"] == "10.10.10.153"
        assert options["--master-port"] == "29500"
        assert ("--headless" in options) == (host["rank"] > 0)  # the head serves HTTP, workers do not
        assert labels(host) == {"sparkctl.profile": "tp8-1m", "sparkctl.rank": str(host["rank"])}
        assert host["env"]["VLLM_HOST_IP"] == FABRIC[host["name"]]


def test_sglang_ranks_meet_at_the_heads_fabric_address():
    data = render_json("--profile", "sglang-tp4-1m")
    assert [h["name"] for h in data["hosts"]] == ["spark-153", "spark-147", "spark-157", "spark-158"]
    for host in data["hosts"]:
        options = parse_options(split_engine_argv(host["engine_argv"])[1], engine_flags("sglang", "0.5.23"))
        assert options["--node-rank"] == str(host["rank"])
        assert options["--nnodes"] == "4"
        assert options["--dist-init-addr"] == "10.10.10.153:20000"  # the SGLang source's DIST_PORT (docs/sglang.md)
        assert "VLLM_HOST_IP" not in host["env"]  # vLLM only


def test_a_subset_is_announced_on_stderr_and_in_the_json_notes():
    result = render("--profile", "tp4", "--json")
    assert result.code == 0, result
    assert "uses 4 of 8 hosts: spark-153, spark-147, spark-157, spark-158" in result.stderr
    assert result.json()["notes"] == [
        "profile 'tp4' uses 4 of 8 hosts: spark-153, spark-147, spark-157, spark-158 (pick others with --hosts)"
    ]
    assert "uses 8 of 8" not in render("--profile", "tp8-1m").stderr


def test_hosts_option_picks_and_orders_with_the_head_first():
    data = render_json("--profile", "tp4", "--hosts", "spark-166,spark-148,spark-153,spark-161")
    assert [(h["name"], h["rank"]) for h in data["hosts"]] == [("spark-153", 0), ("spark-166", 1), ("spark-148", 2), ("spark-161", 3)]
    assert data["notes"] == []
    for host in data["hosts"]:
        assert vllm_options(host)["--master-addr"] == "10.10.10.153"


def test_hosts_without_the_inventory_head_make_the_first_named_host_rank_0():
    data = render_json("--profile", "tp4", "--hosts", "spark-166,spark-148,spark-161,spark-162")
    assert [h["name"] for h in data["hosts"]] == ["spark-166", "spark-148", "spark-161", "spark-162"]
    for host in data["hosts"]:
        options = vllm_options(host)
        assert options["--master-addr"] == "10.10.10.166"
        assert ("--headless" in options) == (host["name"] != "spark-166")


@pytest.mark.parametrize("hosts", ["spark-153,spark-147", "spark-153,spark-147,spark-157,spark-158,spark-161"])
def test_hosts_option_with_the_wrong_count_is_refused(hosts):
    result = render("--profile", "tp4", "--hosts", hosts)
    assert result.code == 2, result
    assert "--hosts" in result.stderr and "needs 4 hosts" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


def test_unknown_host_is_refused():
    result = render("--profile", "tp4", "--hosts", "spark-153,spark-147,spark-157,nope")
    assert result.code == 2 and "unknown host 'nope'" in result.stderr, result


def test_an_inventory_smaller_than_tp_is_refused(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n"
        "  - {name: a, address: 192.168.9.1, role: head}\n"
        "  - {name: b, address: 192.168.9.2}\n"
    )
    result = render("--profile", "tp4", inventory=str(inventory))
    assert result.code == 2, result
    assert "needs 4 hosts" in result.stderr and "inventory has 2" in result.stderr


def test_hosts_without_fabric_settings_get_no_interface_variables(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n"
        "  - {name: a, address: 192.168.9.1, role: head}\n"
        "  - {name: b, address: 192.168.9.2, fabric_interfaces: [enp1s0f0np0, enp1s0f1np1], hcas: [rocep1s0f0, roceP2p1s0f1]}\n"
        "  - {name: c, address: 192.168.9.3}\n"
        "  - {name: d, address: 192.168.9.4}\n"
    )
    data = render_json("--profile", "tp4", inventory=str(inventory))
    by_name = {h["name"]: h for h in data["hosts"]}
    for name in ("a", "c", "d"):
        env = by_name[name]["env"]
        assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_IB_HCA"} & set(env)
        assert env["VLLM_HOST_IP"] == {"a": "192.168.9.1", "c": "192.168.9.3", "d": "192.168.9.4"}[name]
    env_b = by_name["b"]["env"]
    assert env_b["NCCL_SOCKET_IFNAME"] == env_b["GLOO_SOCKET_IFNAME"] == env_b["TP_SOCKET_IFNAME"] == "enp1s0f0np0,enp1s0f1np1"
    assert env_b["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f1"
    # no fabric address: the management address is what the ranks use
    assert vllm_options(by_name["c"])["--master-addr"] == "192.168.9.1"


def test_ray_launcher_starts_ray_on_workers_and_serves_from_the_head():
    data = render_json("--profile", "tp4", "--set", "distributed.launcher=ray", "--set", "engine_args.distributed-executor-backend=null")
    head, *workers = data["hosts"]
    for worker in workers:
        assert worker["engine_argv"] == ["ray", "start", "--address=10.10.10.153:6379", "--block"]
    assert head["engine_argv"][:2] == ["bash", "-c"]
    start, serve = head["engine_argv"][2].split(" && exec ")
    assert "; ray start --head --port=6379 & ray=$!; wait " in start  # stoppable while it runs (test_ray_head_stop)
    options = parse_options(shlex.split(serve)[3:], engine_flags("vllm", "0.33.0"))
    assert options["--distributed-executor-backend"] == "ray"
    assert options["--tensor-parallel-size"] == "4"
    assert not {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"} & set(options)


def test_ray_launcher_refuses_a_contradicting_backend():
    result = render("--profile", "tp4", "--set", "distributed.launcher=ray")
    assert result.code == 2, result
    assert "engine_args.distributed-executor-backend" in result.stderr and "_dsv41-vllm.yaml" in result.stderr
