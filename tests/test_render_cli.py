"""`sparkctl render` as a user runs it: --set/--env, --json, --out, and the files being equivalent.

The compose file and launch.sh must start the same container as the docker argv; launch.sh is
run for real against a stand-in `docker` that records its arguments.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys

import pytest
import yaml

from test_render_helpers import INVENTORY, docker_options, engine_flags, parse_options, render, render_json, split_engine_argv

HOST_KEYS = {"name", "rank", "env", "docker_argv", "engine_argv", "files"}


@pytest.fixture(scope="module")
def tp4_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("render") / "tp4"
    result = render("--profile", "tp4", "--out", str(out), "--json")
    assert result.code == 0, result
    return out, result.json()


# --- --json -----------------------------------------------------------------------------------


def test_json_has_exactly_the_documented_keys():
    result = render("--profile", "sglang-tp4-1m", "--json")
    assert result.code == 0, result
    data = json.loads(result.stdout)  # the whole of stdout is one document
    assert set(data) == {"profile", "hosts", "notes", "checked_against"}
    assert data["profile"] == "sglang-tp4-1m"
    for host in data["hosts"]:
        assert set(host) == HOST_KEYS
        assert isinstance(host["rank"], int)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in host["env"].items())
        assert all(isinstance(word, str) for word in host["docker_argv"] + host["engine_argv"])
        assert host["files"] == []  # nothing written without --out
    assert "note:" in result.stderr  # humans get the note on stderr, not in stdout


def test_global_json_option_works_too():
    from test_render_helpers import run_cli

    result = run_cli("-i", INVENTORY, "--json", "render", "--profile", "tp4")
    assert result.code == 0, result
    assert set(json.loads(result.stdout)) == {"profile", "hosts", "notes", "checked_against"}


def test_json_lists_the_files_written(tp4_out):
    out, data = tp4_out
    for host in data["hosts"]:
        expected = [str(out / host["name"] / name) for name in ("engine.env", "compose.yaml", "launch.sh")]
        if host["rank"] == 0:
            expected.append(str(out / "recipe.yaml"))  # written once, listed with the head
        assert host["files"] == expected
        assert all(os.path.isfile(path) for path in host["files"])


# --- human output -------------------------------------------------------------------------------


def test_summary_without_out_shows_every_host_and_writes_nothing(tmp_path):
    result = render("--profile", "tp4", cwd=tmp_path)
    assert result.code == 0, result
    assert list(tmp_path.iterdir()) == []
    for rank, name in enumerate(["spark-153", "spark-147", "spark-157", "spark-158"]):
        assert f"{name}  rank {rank}" in result.stdout
    assert "NCCL_MAX_NCHANNELS=8" in result.stdout
    assert "VLLM_HOST_IP=10.10.10.158" in result.stdout
    assert "docker run -d --restart on-failure --name sparkctl-tp4" in result.stdout
    assert "vllm serve /model --served-model-name deepseek-v4.1-flash" in result.stdout


# --- --set / --env ------------------------------------------------------------------------------


def test_set_and_env_reach_env_file_docker_argv_and_engine_argv(tmp_path):
    out = tmp_path / "out"
    result = render(
        "--profile", "tp8-300k", "--hosts", "spark-153,spark-147,spark-157,spark-158,spark-161,spark-162,spark-166,spark-148",
        "--out", str(out), "--json",
        "--set", "max_num_seqs=4",
        "--set", "container.memory=100g",
        "--set", "container.shm_size=16g",
        "--set", "engine_args.enforce-eager=true",
        "--set", "env.NCCL_IB_HCA=mlx5_9",  # the profile wins over the inventory's hcas
        "--env", "NCCL_DEBUG=INFO",
        "--env", "VLLM_FLASHINFER_AUTOTUNE=1",  # ... and over a value derived from autotune: false
        "--env", "EXTRA_SETTING=on",
    )
    assert result.code == 0, result
    host = result.json()["hosts"][3]
    expected_env = {"NCCL_IB_HCA": "mlx5_9", "NCCL_DEBUG": "INFO", "VLLM_FLASHINFER_AUTOTUNE": "1", "EXTRA_SETTING": "on"}
    for name, value in expected_env.items():
        assert host["env"][name] == value
        assert f"{name}={value}\n" in (out / host["name"] / "engine.env").read_text()
    pairs = docker_options(host["docker_argv"], host["engine_argv"])
    assert ("--memory", "100g") in pairs and ("--shm-size", "16g") in pairs
    options = parse_options(split_engine_argv(host["engine_argv"])[1], engine_flags("vllm", "0.33.0"))
    assert options["--max-num-seqs"] == "4" and options["--enforce-eager"] is True
    compose = yaml.safe_load((out / host["name"] / "compose.yaml").read_text())["services"]["engine"]
    assert compose["mem_limit"] == "100g" and compose["shm_size"] == "16g"
    assert compose["command"] == host["engine_argv"]


def test_engine_derived_values_yield_to_the_profile():
    data = render_json("--profile", "tp4", "--env", "DSV41_ENGRAM_DISK_THREADS=8", "--set", "engram.disk_chunk=4",
                       "--env", "VLLM_HOST_IP=10.0.0.9")
    for host in data["hosts"]:
        assert host["env"]["DSV41_ENGRAM_DISK_THREADS"] == "8"  # --env over the derived 32
        assert host["env"]["DSV41_ENGRAM_DISK_CHUNK"] == "4"  # derived from the changed profile field
        assert host["env"]["VLLM_HOST_IP"] == "10.0.0.9"


@pytest.mark.parametrize("value", ["a b", "a$b", "x#y", "'q'", 'say "hi"', "back\\slash"])
def test_env_values_the_env_file_cannot_carry_are_refused(value):
    result = render("--profile", "tp4", "--env", f"MY_VAR={value}")
    assert result.code == 2, result
    assert "env.MY_VAR" in result.stderr and "from --env MY_VAR=" in result.stderr


def test_no_gpus_drops_the_gpu_request(tmp_path):
    out = tmp_path / "out"
    result = render("--profile", "tp4", "--set", "container.gpus=", "--out", str(out), "--json")
    assert result.code == 0, result
    host = result.json()["hosts"][0]
    assert "--gpus" not in host["docker_argv"]
    assert "deploy" not in yaml.safe_load((out / "spark-153" / "compose.yaml").read_text())["services"]["engine"]


def test_engram_in_memory_mounts_no_engram_directory():
    data = render_json("--profile", "tp8-300k")
    for host in data["hosts"]:
        volumes = [v for o, v in docker_options(host["docker_argv"], host["engine_argv"]) if o == "-v"]
        assert volumes == ["/mnt/nvme/models/DeepSeek-V4.1-Flash:/model:ro", "/mnt/nvme/hf-cache:/root/.cache/huggingface"]


# --- the files ----------------------------------------------------------------------------------


def test_env_file_is_a_header_then_the_sorted_environment(tp4_out):
    out, data = tp4_out
    for host in data["hosts"]:
        lines = (out / host["name"] / "engine.env").read_text().splitlines()
        header = [line for line in lines if line.startswith("#")]
        body = [line for line in lines if not line.startswith("#")]
        assert lines[: len(header)] == header
        assert f"profile tp4 on {host['name']} (rank {host['rank']} of 4" in header[0]
        assert body == sorted(body) == [f"{k}={v}" for k, v in host["env"].items()]


def test_env_file_path_in_docker_argv_is_the_remote_profile_directory(tp4_out):
    _, data = tp4_out
    for host in data["hosts"]:
        assert ("--env-file", "/var/lib/sparkctl/tp4/engine.env") in docker_options(host["docker_argv"], host["engine_argv"])
        assert "-e" not in host["docker_argv"]


def test_compose_file_is_the_same_container_as_docker_run(tp4_out):
    out, data = tp4_out
    for host in data["hosts"]:
        compose = yaml.safe_load((out / host["name"] / "compose.yaml").read_text())
        service = compose["services"]["engine"]
        pairs = docker_options(host["docker_argv"], host["engine_argv"])
        single = {o: v for o, v in pairs if o not in ("--ulimit", "-v", "--label", "--cap-add")}
        assert service["image"] == host["docker_argv"][len(host["docker_argv"]) - len(host["engine_argv"]) - 1]
        assert service["container_name"] == single["--name"]
        assert service["network_mode"] == single["--network"]
        assert service["ipc"] == single["--ipc"]
        assert service["mem_limit"] == single["--memory"]
        assert service["env_file"] == ["engine.env"]  # next to compose.yaml in /var/lib/sparkctl/tp4/
        assert single["--env-file"] == "/var/lib/sparkctl/tp4/engine.env"
        ulimits = dict(v.split("=", 1) for o, v in pairs if o == "--ulimit")
        assert {k: f"{v['soft']}:{v['hard']}" for k, v in service["ulimits"].items()} == ulimits
        assert service["cap_add"] == [v for o, v in pairs if o == "--cap-add"]
        assert service["volumes"] == [v for o, v in pairs if o == "-v"]
        assert service["labels"] == dict(v.split("=", 1) for o, v in pairs if o == "--label")
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}] and single["--gpus"] == "all"
        assert service["command"] == host["engine_argv"]


def test_launch_script_runs_exactly_the_docker_argv(tp4_out, tmp_path):
    out, data = tp4_out
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    for host in data["hosts"]:
        script = out / host["name"] / "launch.sh"
        assert os.access(script, os.X_OK)
        proc = subprocess.run([str(script)], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                              capture_output=True, text=True, check=True)
        assert ["docker", *json.loads(proc.stdout)] == host["docker_argv"]


def test_recipe_is_a_sparkrun_recipe_of_the_same_deployment(tp4_out):
    out, data = tp4_out
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    head = data["hosts"][0]
    assert recipe["model"] == "/mnt/nvme/models/DeepSeek-V4.1-Flash"
    assert recipe["runtime"] == "vllm" and recipe["container"] == "vllm-dsv41:latest"
    assert recipe["min_nodes"] == recipe["max_nodes"] == recipe["defaults"]["tensor_parallel"] == 4
    assert recipe["runtime_config"]["hosts"] == ["192.168.1.153", "192.168.1.147", "192.168.1.157", "192.168.1.158"]
    # sparkrun 0.4.2 reads the container's settings from executor_config (runtime_config is not read for them)
    executor = recipe["executor_config"]
    assert "memlock=-1:-1" in executor["ulimit"] and executor["cap_add"] == ["IPC_LOCK"]
    assert executor["memory_limit"] == "112g" and executor["devices"] == ["/dev/infiniband"]
    # the checkpoint read-only where the command reads it (sparkrun's own mount of model: is read-write)
    assert executor["volumes"] == ["/mnt/nvme/models/DeepSeek-V4.1-Flash:/model:ro", "/mnt/nvme/engram:/engram"]
    assert executor["privileged"] is False
    assert "container" not in recipe["runtime_config"]
    # sparkrun's master port is its --init-port (default 25000): the run line passes sparkctl's
    assert "--init-port 29500" in (out / "recipe.yaml").read_text().splitlines()[2]
    # the env every host shares; the per-host VLLM_HOST_IP is left to sparkrun
    assert recipe["env"] == {k: v for k, v in head["env"].items() if k != "VLLM_HOST_IP"}
    # sparkrun fills {placeholders} from defaults: the result is the head's command minus the rank options
    values = {**{k: str(v) for k, v in recipe["defaults"].items()}, "model": "/model"}
    command = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], recipe["command"])
    expected = list(head["engine_argv"])
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port"):
        index = expected.index(flag)
        del expected[index : index + 2]
    assert shlex.split(command.replace("\\\n", " ")) == expected  # a shell drops backslash-newline


def test_files_are_written_atomically_with_their_modes(tp4_out):
    out, _ = tp4_out
    leftovers = [p for p in out.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert leftovers == []
    assert stat.S_IMODE((out / "spark-153" / "engine.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "spark-153" / "launch.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "spark-153" / "compose.yaml").stat().st_mode) == 0o644


def test_rendering_again_replaces_the_files(tmp_path):
    out = tmp_path / "out"
    assert render("--profile", "tp4", "--out", str(out)).code == 0
    first = (out / "spark-147" / "launch.sh").read_text()
    assert render("--profile", "tp4", "--out", str(out), "--set", "max_num_seqs=2").code == 0
    second = (out / "spark-147" / "launch.sh").read_text()
    assert "--max-num-seqs 8" in first and "--max-num-seqs 2" in second


def test_an_unwritable_out_directory_is_reported_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = render("--profile", "tp4", "--out", str(blocker / "out"))
    assert result.code == 2, result  # the user's --out, checked before any file is written
    assert "--out" in result.stderr and "is a file" in result.stderr and "Traceback" not in result.stderr
    assert blocker.read_text() == "not a directory"
