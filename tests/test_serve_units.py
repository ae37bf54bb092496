"""serve's pure half (the plan, argv lists, parsers) and the health wait against a real local engine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.commands import facts
from sparkctl.commands import lock as lock_commands
from sparkctl.commands import serve as serve_commands
from sparkctl.ops import lock as deploy_lock
from sparkctl.ops import serve as serve_op
from sparkctl.ops import status as status_op
from sparkctl.ops.health import backoff_intervals, probe_endpoint, wait_healthy
from test_standin_support import Proc, free_port, sparkctl, vllm_argv

REPO = Path(__file__).resolve().parent.parent
WHEN = "2026-11-30T12:00:00Z"


@pytest.fixture(scope="module")
def inventory():
    return load_inventory(REPO / "inventory.example.yaml")


@pytest.fixture(scope="module")
def tp4_plan(inventory):
    return serve_op.build_plan(inventory, "tp4", who="ops@ctl", when=WHEN)


def test_plan_follows_the_render(inventory, tp4_plan):
    from sparkctl.ops.render import render

    rendered, _ = render(inventory, "tp4")
    plan = tp4_plan
    assert [h.name for h in plan.hosts] == [h.name for h in rendered.hosts]
    assert [h.rank for h in plan.hosts] == [0, 1, 2, 3]
    for host, r in zip(plan.hosts, rendered.hosts):
        assert host.docker_argv == r.docker_argv and host.engine_argv == r.engine_argv
        files = {f.name: f for f in host.files}
        assert set(files) == {"engine.env", "compose.yaml", "launch.sh", "deployment.json"}
        assert files["engine.env"].content == r.files[f"{r.name}/engine.env"]
        assert (files["engine.env"].mode, files["launch.sh"].mode, files["compose.yaml"].mode) == (0o600, 0o755, 0o644)
        record = json.loads(files["deployment.json"].content)
        assert record["rank"] == host.rank and record["host"] == host.name
        assert record["hosts"] == [h.name for h in plan.hosts] and record["who"] == "ops@ctl" and record["when"] == WHEN
    head = next(h for h in inventory.hosts if h.is_head)
    assert plan.endpoint == f"http://{head.address}:8000" and plan.lock_host == head.name
    assert plan.head_ports == {"serving port": 8000, "rendezvous port": 29500}
    assert plan.min_free_gb == pytest.approx(121 * 0.80)
    assert plan.health_timeout_s == 1200 and plan.served_model_name == "deepseek-v4.1-flash"
    assert plan.remote_dir == "/var/lib/sparkctl/tp4" and plan.container == "sparkctl-tp4"


def test_env_values_reach_only_the_private_env_file(inventory):
    """--env often carries tokens: engine.env (0600) has the value; the world-readable record and
    the audit fields name the variable only."""
    plan = serve_op.build_plan(inventory, "tp4", sets=["max_num_seqs=4"], envs=["HF_TOKEN=hf_s3cr3t"], who="w", when=WHEN)
    for host in plan.hosts:
        files = {f.name: f for f in host.files}
        assert "HF_TOKEN=hf_s3cr3t" in files["engine.env"].content and files["engine.env"].mode == 0o600
        for name, file in files.items():
            if name != "engine.env":
                assert "hf_s3cr3t" not in file.content, name
        assert json.loads(files["deployment.json"].content)["overrides"] == ["max_num_seqs=4", "env HF_TOKEN=(not recorded)"]
    assert plan.overrides == ["max_num_seqs=4", "env HF_TOKEN=(not recorded)"]  # what the audit line carries


EXAMPLE = str(REPO / "inventory.example.yaml")


def test_plan_json_is_what_dry_run_prints(tp4_plan):
    result = sparkctl("-i", EXAMPLE, "--json", "serve", "--profile", "tp4", "--dry-run")
    assert result.code == 0, result
    doc = result.json()
    expected = tp4_plan.to_json()
    doc["lock"].pop("when"), expected["lock"].pop("when")
    doc["lock"].pop("who"), expected["lock"].pop("who")
    assert doc == expected
    assert doc["hosts"][1]["replace"] == [["docker", "stop", "--time", "30", "sparkctl-tp4"],
                                          ["docker", "rm", "-f", "sparkctl-tp4"]]
    assert doc["hosts"][0]["files"][0] == {"path": "/var/lib/sparkctl/tp4/engine.env", "mode": "0600",
                                           "bytes": len(tp4_plan.hosts[0].files[0].content)}


def test_dry_run_touches_no_host_and_errors_are_usage_errors():
    human = sparkctl("-i", EXAMPLE, "serve", "--profile", "tp4", "--dry-run")
    assert human.code == 0 and "rank 3 (worker)" in human.stdout and "docker run -d --restart on-failure --name sparkctl-tp4" in human.stdout
    unknown = sparkctl("-i", EXAMPLE, "serve", "--profile", "nope", "--dry-run")
    assert unknown.code == 2 and "unknown profile 'nope'" in unknown.stderr and "Traceback" not in unknown.stderr
    bad_set = sparkctl("-i", EXAMPLE, "serve", "--profile", "tp4", "--set", "engine_args.bogus-flag=1", "--dry-run")
    assert bad_set.code == 2 and "--bogus-flag" in bad_set.stderr
    watch_json = sparkctl("-i", EXAMPLE, "--json", "status", "--profile", "tp4", "--watch", "5")
    assert watch_json.code == 2 and "--watch" in watch_json.stderr and "Traceback" not in watch_json.stderr


def test_ray_and_single_host_ports(inventory):
    ray = serve_op.build_plan(inventory, "tp4", sets=["distributed.launcher=ray", "engine_args.distributed-executor-backend=null"],
                       who="w", when=WHEN)
    assert ray.head_ports == {"serving port": 8000, "ray port": 6379}
    one = serve_op.build_plan(inventory, "tp4", sets=["tensor_parallel=1"], who="w", when=WHEN)
    assert one.head_ports == {"serving port": 8000} and len(one.hosts) == 1


# ---------------------------------------------------------------------------------------------- remote scripts, run here


def test_write_file_script_is_atomic_and_sets_the_mode(tmp_path):
    target = tmp_path / "dir"
    argv = serve_commands.write_file_argv(str(target), "engine.env", 0o600)
    subprocess.run(argv, input=b"A=1\n", check=True)
    assert (target / "engine.env").read_bytes() == b"A=1\n"
    assert (target / "engine.env").stat().st_mode & 0o777 == 0o600
    subprocess.run(argv, input=b"A=2\n", check=True)
    assert (target / "engine.env").read_bytes() == b"A=2\n" and os.listdir(target) == ["engine.env"]  # no temp left


def test_lock_script_is_exclusive_and_released_only_by_its_owner(tmp_path):
    path = str(tmp_path / "locks" / "deploy.lock")
    first = subprocess.run(lock_commands.lock_argv({"who": "a@x", "what": "serve tp4", "token": "t1"}, path), capture_output=True, text=True)
    assert first.returncode == 0
    second = subprocess.run(lock_commands.lock_argv({"who": "b@y", "token": "t2"}, path), capture_output=True, text=True)
    assert second.returncode == lock_commands.LOCK_HELD and lock_commands.parse_lock_info(second.stdout)["who"] == "a@x"
    assert subprocess.run(lock_commands.unlock_argv("t2", path)).returncode != 0 and os.path.isdir(path)  # not b's to release
    assert subprocess.run(lock_commands.unlock_argv("t1", path)).returncode == 0 and not os.path.exists(path)
    subprocess.run(lock_commands.lock_argv({"token": "t3"}, path), check=True)
    # a lock its owner cannot remove (another user's files there) is not reported released
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "rm").write_text("#!/bin/sh\necho \"rm: cannot remove: Permission denied\" >&2\nexit 1\n")
    (fake_bin / "rm").chmod(0o755)
    stuck = subprocess.run(lock_commands.unlock_argv("t3", path), capture_output=True, text=True,
                           env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"})
    assert stuck.returncode == 1 and "Permission denied" in stuck.stderr and os.path.isdir(path)
    subprocess.run(lock_commands.break_lock_argv(path), check=True)
    assert not os.path.exists(path)


def test_describe_lock():
    text = deploy_lock.describe_lock({"who": "alice@laptop", "when": "2000-01-01T00:00:00Z", "what": "serve tp4 on a"}, "spark-1",
                                     lock_commands.lock_dir("/var/lib/sparkctl"))
    assert text.startswith("the deploy lock spark-1:/var/lib/sparkctl/deploy.lock is held by alice@laptop since 2000-01-01T00:00:00Z")
    assert "h" in text.split(",")[1] and text.endswith("(serve tp4 on a)")
    assert "no details yet" in deploy_lock.describe_lock({}, "spark-1", "/x/deploy.lock")


def test_audit_line():
    line = lock_commands.audit_line(WHEN, "ops@ctl", "serve", {"profile": "tp4", "hosts": ["a", "b"], "result": "failed:health",
                                                   "overrides": ["env NCCL_DEBUG=INFO"], "skip": None})
    assert line == f"{WHEN} ops@ctl serve profile=tp4 hosts=a,b result=failed:health overrides=env_NCCL_DEBUG=INFO"


def test_logs_argv_merges_stderr():
    argv = serve_commands.logs_argv("c", 40, follow=True)
    assert argv[:3] == ["sh", "-c", 'exec docker logs "$@" 2>&1'] and argv[4:] == ["--tail", "40", "--follow", "c"]
    assert serve_commands.logs_argv("c", None)[4:] == ["--tail", "all", "c"]


# ---------------------------------------------------------------------------------------------- parsers

INSPECT = json.dumps([
    {"Id": "71bcb2d69a78" + "0" * 52, "Name": "/sparkctl-sandbox",
     "State": {"Status": "exited", "ExitCode": 137, "StartedAt": "2026-11-30T12:10:09.1Z",
               "FinishedAt": "2026-11-30T12:10:21.4Z", "Error": "", "OOMKilled": False},
     "Config": {"Image": "sparkctl-sandbox:latest", "Labels": {"sparkctl.profile": "sandbox", "sparkctl.rank": "2"}}},
    {"Id": "abc", "Name": "/other", "State": {"Status": "running", "ExitCode": 0, "StartedAt": "2026-11-30T11:00:00Z"},
     "Config": {"Image": "x", "Labels": None}},
])


def test_parse_containers():
    exited, other = serve_commands.parse_containers(INSPECT)
    assert (exited.name, exited.status, exited.exit_code, exited.rank, exited.profile) == ("sparkctl-sandbox", "exited", 137, 2, "sandbox")
    assert exited.describe() == "exited with code 137 at 2026-11-30T12:10:21" and not exited.running
    assert other.running and other.profile is None and other.rank is None
    assert exited.to_json()["id"] == "71bcb2d69a78"
    assert serve_commands.parse_containers("[]") == []


def test_parse_port_users():
    ss = ('LISTEN 0 128 0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=426,fd=4))\n'
          'LISTEN 0 5 0.0.0.0:8000 0.0.0.0:* users:(("python3",pid=18420,fd=3))\n'
          'LISTEN 0 5 [::]:29500 [::]:*\n')
    assert serve_commands.parse_port_users(ss) == {22: "sshd (pid 426)", 8000: "python3 (pid 18420)", 29500: ""}


def test_port_conflicts(tp4_plan):
    ss = 'LISTEN 0 5 0.0.0.0:8000 0.0.0.0:* users:(("python3",pid=7,fd=3))\n'
    other = serve_commands.parse_containers(json.dumps([{"Id": "x", "Name": "/sparkctl-tp8", "State": {"Status": "running"},
                                            "Config": {"Labels": {"sparkctl.profile": "tp8-300k", "sparkctl.rank": "0"}}}]))
    message = serve_op.port_conflicts(tp4_plan, facts.parse_port_users(ss), other, ignore=False)
    assert message.startswith("port 8000 (serving port) is in use by python3 (pid 7)")
    assert "`sparkctl stop -p tp8-300k` first" in message
    assert serve_op.port_conflicts(tp4_plan, facts.parse_port_users(ss), [], ignore=True) is None  # held by the container being replaced
    assert serve_op.port_conflicts(tp4_plan, facts.parse_port_users("LISTEN 0 5 0.0.0.0:22 0.0.0.0:*\n"), [], ignore=False) is None


def test_find_deployment_prefers_the_head_record():
    record = {"profile": "p", "rank": 0, "hosts": ["a", "b"], "endpoint": "http://10.0.0.1:9000", "served_model_name": "m"}
    states = [status_op.HostState("a", "10.0.0.1", record=record), status_op.HostState("b", "10.0.0.2"),
              status_op.HostState("c", "10.0.0.3", containers=serve_commands.parse_containers(INSPECT)[:1])]
    d = status_op.find_deployment(states, 8000, "fallback")
    assert (d.hosts, d.head, d.endpoint, d.served_model_name) == (["a", "b"], "a", "http://10.0.0.1:9000", "m")
    # no record: the labels tell the ranks, the profile the port
    labelled = serve_commands.parse_containers(json.dumps([{"Id": "h", "Name": "/c", "State": {"Status": "running"},
                                               "Config": {"Labels": {"sparkctl.profile": "p", "sparkctl.rank": "0"}}}]))
    d2 = status_op.find_deployment([status_op.HostState("x", "10.0.0.9", containers=labelled)], 8000, "m")
    assert (d2.hosts, d2.head, d2.endpoint) == (["x"], "x", "http://10.0.0.9:8000")
    assert status_op.find_deployment([status_op.HostState("x", "1.2.3.4")], 8000, "m") is None


# ---------------------------------------------------------------------------------------------- health, against a real engine


def test_backoff_intervals():
    gen = backoff_intervals(0.5, 2, 3)
    assert [next(gen) for _ in range(5)] == [0.5, 1.0, 2.0, 3, 3]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from sparkctl.engram.checkpoint_maker import make_checkpoint

    path = tmp_path_factory.mktemp("health") / "model"
    make_checkpoint(str(path), vocab_size=64)
    return str(path)


@pytest.mark.integration
def test_wait_healthy_through_a_slow_start(model, tmp_path):
    port = free_port()
    proc = Proc(vllm_argv(model, port=port), tmp_path / "e.log", env={"SPARKCTL_STANDIN_LOAD_S": "1.5"})
    try:
        seen = []
        result = wait_healthy(f"http://127.0.0.1:{port}", "dsv41", timeout_s=20, initial_s=0.1,
                              on_attempt=lambda t, p: seen.append(p.stage))
        assert result.ok and result.probe.models == ["dsv41"] and result.probe.max_model_len == 4096
        assert result.seconds >= 1.4 and result.attempts >= 3 and seen[0] == "health" and seen[-1] == "ready"
        assert result.probe.health is None  # /health's body is empty, as vLLM's: the context came from /v1/models
        wrong = probe_endpoint(f"http://127.0.0.1:{port}", "other-model")
        assert not wrong.ok and wrong.stage == "models" and "not 'other-model'" in wrong.detail
        unnamed = probe_endpoint(f"http://127.0.0.1:{port}", None)  # no name: the first model listed, and its context
        assert unnamed.ok and (unnamed.models, unnamed.max_model_len, unnamed.health) == (["dsv41"], 4096, None)
    finally:
        proc.stop()


def test_wait_healthy_gives_up_and_check_alive_stops_early():
    port = free_port()
    result = wait_healthy(f"http://127.0.0.1:{port}", "m", timeout_s=1.0, initial_s=0.1)
    assert not result.ok and result.probe.detail == "connection refused"
    assert 1.0 <= result.seconds < 3 * 1.0  # gives up at its timeout, not long after
    calls = []
    stopped = wait_healthy(f"http://127.0.0.1:{port}", "m", timeout_s=30, initial_s=0.1, first_alive_s=0.3,
                           check_alive=lambda: calls.append(1) or "spark-2: container exited with code 1")
    assert not stopped.ok and stopped.stopped_by == "spark-2: container exited with code 1"
    assert stopped.seconds < 30 / 10 and len(calls) == 1  # stops at the first liveness check, not at its timeout


def test_what_happened_to_a_rank_and_the_command_that_fixes_it():
    def container(status, code, policy="on-failure", restarts=0):
        return serve_commands.parse_containers(json.dumps([{
            "Id": "c", "Name": "/sparkctl-sandbox", "RestartCount": restarts,
            "State": {"Status": status, "ExitCode": code, "FinishedAt": "2026-11-30T12:00:00Z"},
            "HostConfig": {"RestartPolicy": {"Name": policy}},
            "Config": {"Labels": {"sparkctl.profile": "sandbox", "sparkctl.rank": "0"}}}]))[0]

    killed = container("exited", 137, restarts=2)
    assert killed.restart_count == 2 and killed.to_json()["restart_count"] == 2
    assert killed.describe() == "exited with code 137 at 2026-11-30T12:00:00 (restarted 2 times)"
    assert "docker does not restart a rank stopped on purpose" in status_op.what_happened(killed)
    assert "restarting it" in status_op.what_happened(container("restarting", 1))
    assert "ended cleanly" in status_op.what_happened(container("exited", 0))
    assert "older sparkctl" in status_op.what_happened(container("exited", 1, policy="no"))
    assert status_op.fix_command("sandbox", ["tensor_parallel=3", "env HF_TOKEN=(not recorded)", "engine_args.x=a b",
                                             "env.NCCL_DEBUG=(not recorded)"]) == (
        "sparkctl serve --profile sandbox --set tensor_parallel=3 --env HF_TOKEN=... --set 'engine_args.x=a b' "
        "--set env.NCCL_DEBUG=...")
