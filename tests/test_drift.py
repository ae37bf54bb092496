"""ops/drift.py: what changed between the running deployment and the profile (pure)."""

from __future__ import annotations

import shlex

import pytest

from sparkctl.ops import drift

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


L1, L2 = ("sha256:l1",), ("sha256:l1", "sha256:l2")


def test_same_image_everywhere_and_tag_unmoved_is_quiet():
    found = drift.image_drift({"s1": A, "s2": A}, {"s1": A, "s2": A}, {"s1": L1, "s2": L1}, "img:latest")
    assert found.problems == [] and found.notices == []


def test_ranks_on_images_of_different_content_is_a_problem_naming_each_host():
    found = drift.image_drift({"s1": A, "s2": B}, {"s1": A, "s2": B}, {"s1": L1, "s2": L2}, "img:latest")
    assert len(found.problems) == 1
    assert "s1 aaaaaaaaaaaa" in found.problems[0] and "s2 bbbbbbbbbbbb" in found.problems[0]
    assert found.notices == []


def test_the_same_files_under_two_ids_are_the_same_image():
    # `docker import` (or a build) of the same files on each host: other IDs, same layers.
    found = drift.image_drift({"s1": A, "s2": B}, {"s1": A, "s2": B}, {"s1": L1, "s2": L1, "s3": None}, "img:latest")
    assert found.problems == [] and found.notices == []


def test_a_tag_moved_or_gone_since_the_serve_is_a_notice():
    found = drift.image_drift({"s1": A, "s2": A}, {"s1": B, "s2": None}, {"s1": L1, "s2": L1}, "img:latest")
    assert found.problems == []
    assert found.notices == [
        "s1: runs aaaaaaaaaaaa but img:latest is bbbbbbbbbbbb now (distributed since the serve): `sparkctl serve` again to run it",
        "s2: runs aaaaaaaaaaaa; img:latest is no longer on the host",
    ]


def test_argv_changes_name_the_options():
    running = ["vllm", "serve", "/model", "--max-num-seqs", "8", "--enforce-eager", "--block-size=128"]
    expected = ["vllm", "serve", "/model", "--max-num-seqs", "4", "--block-size=64", "--trust-remote-code"]
    assert drift.argv_changes(running, expected) == [
        "--block-size 128 → 64", "--enforce-eager (set) → absent", "--max-num-seqs 8 → 4", "--trust-remote-code absent → (set)"]
    assert drift.argv_changes(running, running) == []
    assert drift.argv_changes(["sglang", "x"], ["vllm", "x"]) == ["command sglang x → vllm x"]
    many = drift.argv_changes([], [f"--f{i}" for i in range(7)], limit=3)
    assert len(many) == 4 and many[-1] == "and 4 more"


def test_env_changes_name_variables_never_values():
    running = {"NCCL_DEBUG": "WARN", "HF_TOKEN": "hf_old", "PATH": "/usr/bin"}
    expected = {"NCCL_DEBUG": "INFO", "HF_TOKEN": "hf_new", "NCCL_MAX_NCHANNELS": "8"}
    assert drift.env_changes(running, expected) == ["HF_TOKEN", "NCCL_DEBUG", "NCCL_MAX_NCHANNELS"]
    assert drift.env_changes(running, expected, skip={"HF_TOKEN"}) == ["NCCL_DEBUG", "NCCL_MAX_NCHANNELS"]
    notices = drift.config_drift("s1", ["x"], running, ["x"], expected, set())
    assert notices == ["s1: environment differs from the profile for HF_TOKEN, NCCL_DEBUG, NCCL_MAX_NCHANNELS"]
    assert "hf_" not in notices[0]


def test_image_layers_parser():
    from sparkctl.commands import probes
    from sparkctl.commands.serve import image_layers_argv, parse_image_layers

    assert image_layers_argv(A)[-1] == A
    assert parse_image_layers('["sha256:l1","sha256:l2"]\n') == L2
    for garbage in ("", "not json", '{"a": 1}', "[1, 2]"):
        with pytest.raises(probes.ProbeError):
            parse_image_layers(garbage)


def test_docker_options_compare_our_run_argv_with_host_config():
    argv = ["docker", "run", "-d", "--name", "e", "--network", "host", "--ipc", "host", "--gpus", "all",
            "--ulimit", "memlock=-1:-1", "--ulimit", "nofile=1048576:1048576", "--cap-add", "IPC_LOCK",
            "--memory", "112g", "--env-file", "/x/engine.env", "-v", "/m:/model:ro", "-v", "/e:/engram",
            "--label", "a=b", "img:1", "vllm", "serve", "--memory", "not-an-option-of-docker"]
    config = {"NetworkMode": "host", "IpcMode": "host", "DeviceRequests": [{"Count": -1}],
              "Ulimits": [{"Name": "nofile", "Soft": 1048576, "Hard": 1048576}, {"Name": "memlock", "Soft": -1, "Hard": -1}],
              "CapAdd": ["IPC_LOCK"], "Memory": 112 * 1024 ** 3, "ShmSize": 64 * 1024 ** 2,
              "Binds": ["/e:/engram", "/m:/model:ro"]}
    expected = drift.settings_from_run_argv(argv)
    assert expected["--memory"] == "112g"  # the engine's own --memory after the image is not docker's
    assert drift.settings_changes(drift.settings_from_host_config(config), expected) == []
    config.update(Memory=100 * 1024 ** 3, Ulimits=[{"Name": "nofile", "Soft": 1024, "Hard": 1048576}], Binds=["/m:/model:ro"])
    assert drift.settings_changes(drift.settings_from_host_config(config), expected) == [
        "--memory 100g → 112g", "--ulimit memlock absent → -1:-1", "--ulimit nofile 1024:1048576 → 1048576:1048576",
        "-v /m:/model:ro → /e:/engram,/m:/model:ro"]
    # A container started without a restart policy (an older sparkctl) drifts from the rendered one.
    with_policy = drift.settings_from_run_argv(argv[:3] + ["--restart", "on-failure"] + argv[3:])
    config.update(Memory=112 * 1024 ** 3, Ulimits=[{"Name": "nofile", "Soft": 1048576, "Hard": 1048576},
                                                   {"Name": "memlock", "Soft": -1, "Hard": -1}], Binds=["/e:/engram", "/m:/model:ro"])
    assert drift.settings_changes(drift.settings_from_host_config(config), with_policy) == ["--restart no → on-failure"]
    config["RestartPolicy"] = {"Name": "on-failure", "MaximumRetryCount": 0}
    assert drift.settings_changes(drift.settings_from_host_config(config), with_policy) == []
    assert drift.docker_bytes("1g") == 1024 ** 3 and drift.human_bytes(3 * 1024 ** 2) == "3m" and drift.human_bytes(5) == "5"


@pytest.mark.parametrize("profile", ["tp4", "tp8-300k", "tp8-1m", "sglang-tp4-1m", "sandbox"])
def test_every_docker_run_option_we_render_is_known_to_drift(profile):
    from pathlib import Path

    from sparkctl.config.inventory import load_inventory
    from sparkctl.ops.render import render

    inventory = load_inventory(Path(__file__).resolve().parent.parent / "inventory.example.yaml")
    plan, _ = render(inventory, profile, sets=["container.shm_size=2g", "container.memory=100g"])
    for host in plan.hosts:
        argv = host.docker_argv
        options = {arg for arg in argv[2:argv.index(host.engine_argv[0]) - 1] if arg.startswith("-")}
        assert options <= drift.COMPARED_OPTIONS | drift.NOT_COMPARED_OPTIONS, options
        assert options & drift.COMPARED_OPTIONS >= {"--restart", "--network", "--ipc", "--memory", "--shm-size", "-v"}


def test_the_ray_heads_shell_line_compares_by_the_commands_it_runs():
    """The line before the head's stop trap and the line with it run the same ray start and vllm
    serve: no drift (a running engine is not restarted for it); a changed option of either shows."""
    from sparkctl.commands.vllm import ray_head_line

    start = ["ray", "start", "--head", "--port", "6379", "--node-ip-address", "10.0.0.1"]
    serve = ["vllm", "serve", "/models/m", "--tensor-parallel-size", "4", "--port", "8000"]
    before = ["bash", "-c", f"{shlex.join(start)} && exec {shlex.join(serve)}"]
    now = ["bash", "-c", ray_head_line(start, serve)]
    assert drift.argv_changes(before, now) == []
    assert drift.argv_changes(now, now) == []
    wider = ["bash", "-c", ray_head_line(start, [*serve[:4], "8", *serve[5:]])]
    assert drift.argv_changes(before, wider) == ["--tensor-parallel-size 4 → 8"]
    other_port = ["bash", "-c", ray_head_line([*start[:4], "6380", *start[5:]], serve)]
    assert drift.argv_changes(now, other_port) == ["--port 6379 → 6380"]
    assert drift.argv_changes(now, ["vllm", *serve[1:]]) == ["commands ray start && vllm serve → vllm serve"]
