"""replicas: N: the host groups, the router's command and worker list, the stand-in's router-facing
routes, and `plan --compare` (pure parts and the CLI without hosts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clirun import REPO, run_cli
from sparkctl.commands import router as R
from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.ops.layouts import candidate_groups, compare_layouts
from sparkctl.ops.replica_status import router_view
from sparkctl.ops.replicas import split_replicas


def _inventory(tmp_path: Path, names: list[str], head: str | None = None) -> Path:
    hosts = [{"name": n, "address": f"10.9.0.{i + 11}", **({"role": "head"} if n == (head or names[0]) else {})}
             for i, n in enumerate(names)]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "hosts": hosts}))
    return path


def _hosts(tmp_path, names, head=None):
    return load_inventory(str(_inventory(tmp_path, names, head))).hosts


def test_hosts_are_cut_in_inventory_order_each_group_with_its_own_head_and_ports(tmp_path):
    profile = load_profile("sandbox-replicas").profile
    replicas, note = split_replicas(profile, _hosts(tmp_path, ["a", "b", "c", "d", "e"]))
    assert [r.hosts for r in replicas] == [("a", "b"), ("c", "d")]
    assert [r.head for r in replicas] == ["a", "c"] and "left out: e" in note
    port = profile.distributed.master_port
    assert replicas[0].sets == () and f"distributed.master_port={port + 1}" in replicas[1].sets


def test_a_role_head_inside_a_later_group_is_its_rank_0(tmp_path):
    profile = load_profile("sandbox-replicas").profile
    replicas, _ = split_replicas(profile, _hosts(tmp_path, ["a", "b", "c", "d"], head="d"))
    assert [r.hosts for r in replicas] == [("a", "b"), ("d", "c")]


def test_a_count_that_does_not_divide_is_named(tmp_path):
    profile = load_profile("sandbox-replicas").profile
    with pytest.raises(ConfigError, match=r"3 hosts do not cut into 2 groups of 2"):
        split_replicas(profile, _hosts(tmp_path, ["a", "b", "c"]))
    with pytest.raises(ConfigError, match=r"--hosts names 3 hosts.*3 hosts do not cut into 2 groups of 2"):
        split_replicas(profile, _hosts(tmp_path, ["a", "b", "c", "d"]), wanted=["a", "b", "c"])


@pytest.mark.parametrize("profile, sets, message", [
    ("sandbox-replicas", ["router.port=8000"], "router.port 8000 is taken"),
    ("sandbox-replicas", ["router.policy=least_load"], "round_robin"),
    ("sandbox-onebox", ["replicas=2"], "replicas run in containers"),
])
def test_router_fields_are_checked(profile, sets, message):
    with pytest.raises(ConfigError, match=message):
        load_profile(profile, sets=sets)


def test_the_router_runs_as_the_source_runs_it_and_the_key_stays_out_of_argv():
    profile = load_profile("sandbox-replicas").profile
    argv = R.docker_run_argv(profile, "/var/lib/sparkctl")
    joined = " ".join(argv)
    for flags in ("--policy round_robin", "--port 8889", "--prometheus-port 29000", "--request-timeout-secs 1800",
                  "--max-payload-size 536870912", "--restart unless-stopped", "--network host"):
        assert flags in joined
    assert argv[argv.index("--entrypoint") + 1:argv.index("--entrypoint") + 3] == ["python3", "sparkctl-router:0.3.2"]
    assert "--api-key" not in argv and "--worker-urls" not in argv
    assert "--env-file" in argv and argv[argv.index("--env-file") + 1].endswith("/sandbox-replicas/router.env")
    assert R.env_file_content("s3cret") == "SPARKCTL_ROUTER_API_KEY=s3cret\n" and R.env_file_content(None) == ""


def test_the_router_defaults_to_the_serving_image_and_round_robin():
    profile = load_profile("sandbox", sets=["replicas=2", "tensor_parallel=2"]).profile
    assert R.router_image(profile) == profile.image.tag and profile.router.policy == "round_robin"


def test_the_router_worker_list_and_its_view_of_a_replica():
    text = json.dumps({"workers": [
        {"id": "w1", "url": "http://a:8000", "model_id": "m", "is_healthy": True, "load": 2},
        {"id": "w2", "url": "http://c:8000", "model_id": "m", "is_healthy": False, "load": 0}]})
    workers = R.parse_workers(text)
    assert router_view(workers, "http://a:8000") == "in rotation (load 2)"
    assert router_view(workers, "http://c:8000").startswith("listed, unhealthy")
    assert router_view(workers, "http://e:8000") == "out of the router"
    assert router_view(None, "http://a:8000").startswith("unknown")
    with pytest.raises(ValueError):
        R.parse_workers('{"error": "Unauthorized"}')


def test_the_standin_answers_every_route_the_router_asks_as_sglang_names_it():
    from sparkctl.standin.surface import ROUTES

    paths = json.loads(Path("/work/shared/engines/sglang-0.5.23-openapi.json").read_text())["paths"] \
        if Path("/work/shared/engines/sglang-0.5.23-openapi.json").is_file() else None
    wanted = {"/health", "/server_info", "/get_server_info", "/model_info", "/get_model_info"}
    assert wanted <= set(ROUTES["sglang"])
    if paths is not None:
        assert wanted <= set(paths)  # each as SGLang 0.5.23 itself names it


def test_layouts_of_eight_hosts():
    groups = candidate_groups(8)
    assert (8,) in groups and (4, 4) in groups and (4, 3) in groups and (2, 2, 2, 2) in groups
    assert (7,) not in groups  # one group leaving a host idle is not a layout of the rack
    layouts = {lay.name: lay for lay in compare_layouts(load_profile("tp4").profile, 8)}
    assert layouts["TP8"].fits and layouts["2 x TP4"].fits and not layouts["4 x TP2"].fits
    assert layouts["2 x TP4"].servable_as == "--set tensor_parallel=4 --set replicas=2"
    assert "one user at a time" in layouts["TP8"].suits and "many concurrent users" in layouts["2 x TP4"].suits
    tp8 = [m for m in layouts["TP8"].measured if not m["predicted"]]
    assert tp8 and all(set(m["aggregate_tok_s"]) == {1, 2, 4, 8} for m in tp8)
    predicted = layouts["2 x TP4"].measured[0]
    assert predicted["predicted"] and predicted["aggregate_tok_s"][8] == pytest.approx(2 * 13.09 * 4, rel=1e-3)


def test_plan_compare_cli_prints_one_json_document():
    result = run_cli("-i", str(REPO / "inventory.example.yaml"), "--json", "plan", "--profile", "sglang-tp4-1m",
                     "--compare")
    assert result.code == 0, result
    doc = result.json()
    rows = {row["layout"]: row for row in doc["layouts"]}
    assert doc["hosts"] == 8 and "TP8" in rows and "2 x TP4" in rows
    assert rows["2 x TP4"]["measured"][0]["aggregate_tok_s"]["16"] == 478.4  # the SGLang line's 2 x TP4 at c16


def test_serve_dry_run_plans_every_replica_and_the_router(tmp_path):
    inventory = _inventory(tmp_path, ["s1", "s2", "s3", "s4"])
    result = run_cli("-i", str(inventory), "--json", "serve", "--profile", "sandbox-replicas", "--dry-run")
    assert result.code == 0, result
    doc = result.json()
    assert doc["endpoint"] == "http://10.9.0.11:8889" and doc["router"]["policy"] == "round_robin"
    assert [r["hosts"] for r in doc["replicas"]] == [["s1", "s2"], ["s3", "s4"]]
    ranks = [[h["rank"] for h in r["serve"]["hosts"]] for r in doc["replicas"]]
    assert ranks == [[0, 1], [0, 1]]
    ports = [r["serve"]["head_ports"]["rendezvous port"] for r in doc["replicas"]]
    assert ports[1] == ports[0] + 1
    bad = run_cli("-i", str(inventory), "serve", "--profile", "sandbox-replicas", "--replica", "3", "--dry-run")
    assert bad.code == 2 and "no replica 3" in bad.stderr


def test_replica_numbers_are_parsed_from_1():
    from sparkctl.cli.replicas_cmd import parse_replicas

    assert parse_replicas(None) is None and parse_replicas("2") == [1] and parse_replicas("1,3") == [0, 2]
    for bad in ("0", "x", ","):
        with pytest.raises(ConfigError):
            parse_replicas(bad)


def test_a_worker_is_registered_with_its_model_and_the_key_only_when_there_is_one():
    assert R.worker_body("http://a:8000", "m") == {"url": "http://a:8000", "model_id": "m", "worker_type": "regular"}
    assert R.worker_body("http://a:8000", "m", "k")["api_key"] == "k"


def test_render_of_a_replicated_profile_writes_each_replica_apart(tmp_path):
    inventory = _inventory(tmp_path, ["s1", "s2", "s3", "s4"])
    out = tmp_path / "out"
    result = run_cli("-i", str(inventory), "--json", "render", "--profile", "sandbox-replicas", "--out", str(out))
    assert result.code == 0, result
    doc = result.json()
    assert [r["hosts"] for r in doc["replicas"]] == [["s1", "s2"], ["s3", "s4"]] and doc["router"]["host"] == "s1"
    assert (out / "replica-1" / "s1").is_dir() and (out / "replica-2" / "s4").is_dir()
    launch = (out / "replica-2" / "s3" / "launch.sh").read_text()
    assert str(load_profile("sandbox-replicas").profile.distributed.master_port + 1) in launch
