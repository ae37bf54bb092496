"""`render --profile single-box`: the native launcher's files, and the README's container path with
--set launcher=docker (loopback-only port, /models, --gpus all --ipc=host --ulimit memlock=-1, no --memory)."""

from __future__ import annotations

import subprocess

import yaml

INVENTORY = "cluster: onebox\nhosts:\n  - name: spark\n    address: 127.0.0.1\n    role: head\n"


def inventory(tmp_path) -> str:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return str(path)


def test_native_render_writes_env_and_launch_script(cli, tmp_path):
    out = tmp_path / "out"
    result = cli("-i", inventory(tmp_path), "--json", "render", "--profile", "single-box", "--out", str(out))
    assert result.code == 0, result.stderr
    host = result.json()["hosts"][0]
    assert host["docker_argv"] == [] and host["engine_argv"] == [".venv/bin/python", "server/app.py", "--engine", "v41"]
    assert host["env"]["HOST"] == "127.0.0.1" and host["env"]["MAX_SEQ"] == "32768"
    launch = (out / "spark" / "launch.sh").read_text()
    assert "cd /opt/deepseek-v41-flash-spark" in launch
    assert "exec /opt/deepseek-v41-flash-spark/.venv/bin/python server/app.py --engine v41" in launch
    assert (out / "spark" / "engine.env").stat().st_mode & 0o777 == 0o600
    assert subprocess.run(["sh", "-n", str(out / "spark" / "launch.sh")]).returncode == 0


def test_container_path_renders_from_the_same_profile(cli, tmp_path):
    out = tmp_path / "out"
    result = cli("-i", inventory(tmp_path), "--json", "render", "--profile", "single-box", "--set", "launcher=docker",
                 "--out", str(out))
    assert result.code == 0, result.stderr
    argv = result.json()["hosts"][0]["docker_argv"]
    pairs = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("-")}
    assert pairs["--gpus"] == "all" and pairs["--ipc"] == "host" and pairs["--ulimit"] == "memlock=-1:-1"
    assert pairs["-p"] == "127.0.0.1:8000:8000"  # loopback-only
    assert "--memory" not in argv
    assert any(v.endswith(":/models:ro") for v in argv)
    assert argv[-1] == "ghcr.io/0xbakeer/deepseek-v41-flash-spark:0.5.0"  # the image's own entrypoint
    env = result.json()["hosts"][0]["env"]
    assert env["MODEL_DIR"] == "/models" and env["HOST"] == "0.0.0.0"
    compose = yaml.safe_load((out / "spark" / "compose.yaml").read_text())["services"]["engine"]
    assert compose["ports"] == ["127.0.0.1:8000:8000"] and "mem_limit" not in compose
    assert compose["ulimits"]["memlock"] == {"soft": -1, "hard": -1} and compose["ipc"] == "host"
    assert subprocess.run(["sh", "-n", str(out / "spark" / "launch.sh")]).returncode == 0


def test_container_path_refuses_a_memory_limit(cli, tmp_path):
    result = cli("-i", inventory(tmp_path), "render", "--profile", "single-box", "--set", "launcher=docker",
                 "--set", "container.memory=100g")
    assert result.code == 2
    assert "container.memory" in result.stderr and "unified memory" in result.stderr
    assert "Traceback" not in result.stderr


def test_native_launcher_is_for_the_single_box_engine_only(cli, tmp_path):
    result = cli("-i", inventory(tmp_path), "render", "--profile", "tp4", "--set", "launcher=native",
                 "--set", "native.workdir=/opt/x")
    assert result.code == 2 and "launcher native starts the single-box engine" in result.stderr


def test_container_serve_plan_guards_with_min_free_gib_and_loopback(cli, tmp_path):
    result = cli("-i", inventory(tmp_path), "--json", "serve", "--profile", "single-box", "--set", "launcher=docker",
                 "--dry-run")
    assert result.code == 0, result
    doc = result.json()
    assert doc["min_free_gb"] == 96.64  # MIN_FREE_GIB 90, not a GMU share
    assert doc["head_ports"] == {"serving port": 8000}
    remote = tmp_path / "remote.yaml"
    remote.write_text(INVENTORY.replace("127.0.0.1", "192.0.2.7"))
    refused = cli("-i", str(remote), "serve", "--profile", "single-box", "--set", "launcher=docker", "--dry-run")
    assert refused.code == 2 and "serving.host" in refused.stderr and "127.0.0.1" in refused.stderr


def test_up_plans_a_native_profile(cli, tmp_path):
    """up composes the native launcher's steps (no refusal of the profile); here its host does not answer."""
    result = cli("-i", inventory(tmp_path), "--json", "up", "--profile", "single-box", "--dry-run", "--connect-timeout", "2")
    assert result.code == 1 and "Traceback" not in result.stderr, result
    steps = result.json()["steps"]
    assert steps[0]["status"] == "failed" and "spark: " in steps[0]["reason"] and "refused" in steps[0]["reason"]


def test_render_summary_never_prints_a_token(cli, tmp_path):
    result = cli("-i", inventory(tmp_path), "render", "--profile", "single-box", "--env", "HF_TOKEN=hf_abcsecret")
    assert result.code == 0, result
    assert "HF_TOKEN=***" in result.stdout and "hf_abcsecret" not in result.stdout + result.stderr
