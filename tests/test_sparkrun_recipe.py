"""The exported sparkrun recipe's container settings, read without sparkrun: each key is one that
sparkrun 0.4.2's ExecutorConfig.from_chain reads, and each carries what sparkctl's own docker run
says (restart policy, GPU request, every mount but the Hugging Face cache, the checkpoint
read-only at the path the command reads). bench/sparkrun_export.py checks the same against
sparkrun's real dry run."""

from __future__ import annotations

import pytest
import yaml

from test_render_helpers import render_json

# The keys sparkrun 0.4.2's ExecutorConfig.from_chain reads (orchestration/executors/_base.py); a
# key outside this set is silently ignored by sparkrun, so the export must not rely on one.
EXECUTOR_KEYS = {
    "auto_remove", "privileged", "gpus", "gpu_access_mode", "ipc", "shm_size", "network", "restart_policy", "user",
    "memory_limit", "accelerator_vendor", "working_dir", "log_dir", "log_file", "pid_dir", "pid_file", "env_file",
    "command_prefix", "entrypoint", "security_opt", "cap_add", "ulimit", "devices", "volumes", "labels", "executor",
    "executor_type",
}
HF_CACHE = ":/root/.cache/huggingface"


def _option(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def _export(tmp_path, profile: str) -> tuple[dict, list[str], dict]:
    out = tmp_path / "out"
    rendered = render_json("--profile", profile, "--out", str(out))
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    return recipe, rendered["hosts"][0]["docker_argv"], rendered


@pytest.mark.parametrize("profile", ["tp4", "sglang-tp4-1m", "sandbox"])
def test_every_executor_key_is_one_sparkrun_reads(tmp_path, profile):
    recipe, _, _ = _export(tmp_path, profile)
    assert set(recipe["executor_config"]) <= EXECUTOR_KEYS, set(recipe["executor_config"]) - EXECUTOR_KEYS


@pytest.mark.parametrize("profile", ["tp4", "sglang-tp4-1m", "sandbox"])
def test_restart_policy_and_gpus_are_sparkctls(tmp_path, profile):
    recipe, argv, _ = _export(tmp_path, profile)
    executor = recipe["executor_config"]
    assert [executor["restart_policy"]] == _option(argv, "--restart") == ["on-failure"]
    gpus = _option(argv, "--gpus")
    if gpus:
        assert [executor["gpus"]] == gpus and "accelerator_vendor" not in executor
    else:
        # sparkrun's scheduler overrides `gpus:`; only a CPU vendor makes its docker run ask for none
        assert executor["accelerator_vendor"] == "cpu" and "gpus" not in executor


@pytest.mark.parametrize("profile", ["tp4", "sglang-tp4-1m", "sandbox"])
def test_the_checkpoint_is_mounted_read_only_where_the_command_reads_it(tmp_path, profile):
    recipe, argv, rendered = _export(tmp_path, profile)
    mounts = [m for m in _option(argv, "-v") if not m.endswith(HF_CACHE)]
    assert recipe["executor_config"]["volumes"] == mounts
    model = next(m for m in mounts if m.startswith(recipe["model"] + ":"))
    target = model.split(":")[1]
    assert model.endswith(":ro")
    engine = rendered["hosts"][0]["engine_argv"]
    assert target in engine  # sparkctl's engine reads the checkpoint there ...
    assert f" {target} " in f" {recipe['command']} " and "{model}" not in recipe["command"]  # ... and so does sparkrun's
