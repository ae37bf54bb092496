"""What a first deploy on a real rack needs that the sandbox alone did not catch: the RDMA devices
in the container, every Up RoCE twin, the autotune switch the engine honours, variables the engine
does not read, SGLang's Engram and DSpark semantics."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from sparkctl.commands import docker, vllm
from sparkctl.commands.engine_flags import check_env, load_engine_flags
from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.ops.render import render

REPO = Path(__file__).resolve().parent.parent
VLLM = load_engine_flags("vllm", "0.33.0")
SGLANG = load_engine_flags("sglang", "0.5.23")


@pytest.fixture
def inventory():
    return load_inventory(REPO / "inventory.example.yaml")


def _inventory_with(tmp_path, **defaults):
    data = yaml.safe_load((REPO / "inventory.example.yaml").read_text())
    data["defaults"].update(defaults)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_inventory(path)


def test_the_rdma_devices_reach_the_container(inventory):
    plan, _ = render(inventory, "tp4")
    for host in plan.hosts:
        argv = host.docker_argv
        assert argv[argv.index("--device") + 1] == "/dev/infiniband"
        compose = yaml.safe_load(host.files[f"{host.name}/compose.yaml"])
        assert compose["services"]["engine"]["devices"] == ["/dev/infiniband:/dev/infiniband"]
        assert "--device /dev/infiniband" in host.files[f"{host.name}/launch.sh"]


def test_no_hca_no_device(tmp_path):
    inv = _inventory_with(tmp_path, hcas=[])
    plan, _ = render(inv, "tp4")
    assert "--device" not in plan.hosts[0].docker_argv
    assert "NCCL_IB_HCA" not in plan.hosts[0].env
    # an NCCL_IB_HCA set in the profile needs the devices as much as the inventory's hcas
    plan, _ = render(inv, "tp4", envs=["NCCL_IB_HCA=mlx5_0"])
    assert "/dev/infiniband" in plan.hosts[0].docker_argv
    # ... unless IB is switched off on purpose
    plan, _ = render(_inventory_with(tmp_path), "tp4", envs=["NCCL_IB_DISABLE=1"])
    assert "--device" not in plan.hosts[0].docker_argv


def test_both_roce_twins_are_rendered(inventory):
    """A GB10's cabled port is two ~100 Gb/s twins: the example inventory names both."""
    plan, _ = render(inventory, "tp8-1m")
    for host in plan.hosts:
        assert host.env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"


def test_every_up_hca(tmp_path):
    """`hcas: up`: NCCL_IB_HCA is left to NCCL (it then uses every active port), the devices still pass."""
    inv = _inventory_with(tmp_path, hcas="up")
    assert all(h.hcas_up and h.hcas == () for h in inv.hosts)
    plan, _ = render(inv, "tp4")
    host = plan.hosts[0]
    assert "NCCL_IB_HCA" not in host.env
    assert "/dev/infiniband" in host.docker_argv


def test_autotune_off_uses_the_switch_released_vllm_has(inventory):
    plan, _ = render(inventory, "tp8-300k")
    for host in plan.hosts:
        assert "VLLM_FLASHINFER_AUTOTUNE" not in host.env
        assert "--disable-flashinfer-autotune" in host.engine_argv
    plan, _ = render(inventory, "tp8-1m")  # autotune: true renders neither
    assert "--disable-flashinfer-autotune" not in plan.hosts[0].engine_argv


def test_autotune_off_follows_the_engine_surface():
    profile = load_profile("tp8-300k").profile
    # An image whose vLLM reads the variable (the TP4 vLLM report's branch): the variable, no switch
    branch = dataclasses.replace(VLLM, envs=VLLM.envs | {"VLLM_FLASHINFER_AUTOTUNE"})
    assert vllm.autotune_off(profile, branch) == ({"VLLM_FLASHINFER_AUTOTUNE": "0"}, [])
    # A parser with the BooleanOptionalAction spelling
    flags = {k: v for k, v in VLLM.flags.items() if k != "--disable-flashinfer-autotune"}
    flags["--no-enable-flashinfer-autotune"] = VLLM.flags["--enable-flashinfer-autotune"]
    assert vllm.autotune_off(profile, dataclasses.replace(VLLM, flags=flags)) == ({}, ["--no-enable-flashinfer-autotune"])
    # Neither: an error naming the profile field, not a setting that silently does nothing
    bare = dataclasses.replace(VLLM, flags={k: v for k, v in flags.items() if "autotune" not in k})
    with pytest.raises(ConfigError) as err:
        vllm.autotune_off(profile, bare)
    assert err.value.field == "autotune"


def test_a_variable_the_engine_does_not_read_is_refused(inventory):
    with pytest.raises(ConfigError) as err:
        render(inventory, "tp4", envs=["VLLM_ENGRAM_DISK=1"])
    assert err.value.field == "env.VLLM_ENGRAM_DISK"
    assert "does not read the environment variable VLLM_ENGRAM_DISK" in err.value.detail
    assert "vllm-0.33.0-envs.txt" in err.value.detail
    # one with a known equivalent is a warning naming it
    plan, _ = render(inventory, "tp4", envs=["VLLM_FLASHINFER_AUTOTUNE=0"])
    assert any("VLLM_FLASHINFER_AUTOTUNE" in n and "autotune" in n for n in plan.notes)
    # variables outside the engine's namespace (NCCL, the patches' own) are not the engine's to judge
    assert check_env(VLLM, {"NCCL_IB_HCA": "x", "DSV41_ENGRAM_DISK": "1", "VLLM_HOST_IP": "1.2.3.4"}) == []
    with pytest.raises(ConfigError, match="SGLANG_ENGRAM_DISK"):
        check_env(SGLANG, {"SGLANG_ENGRAM_DISK": "1"})


def test_stock_sglang_has_no_engram_disk_mode():
    """Stock SGLang keeps Engram in host memory; only an image whose overlay reads the NVMe switches takes disk."""
    from sparkctl.commands.sglang import check_engram

    profile = load_profile("sglang-tp4-1m").profile
    with pytest.raises(ConfigError) as err:
        check_engram(profile, SGLANG)  # the shipped lists alone: no overlay
    assert err.value.field == "engram.mode"
    assert "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE" in err.value.detail and "OFFLOAD_MODE" in err.value.detail
    check_engram(profile, dataclasses.replace(SGLANG, switches=frozenset({"OFFLOAD_MODE", "DSV41_PACKED_DIR"})))
    assert "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE" in SGLANG.envs


def test_sglang_engram_on_nvme_renders_the_overlay_switches(inventory):
    """The SGLang line's source: OFFLOAD_MODE=nvme, the packed shards at the engram mount, the host table off."""
    plan, _ = render(inventory, "sglang-tp4-1m")
    env = plan.hosts[0].env
    assert (env["OFFLOAD_MODE"], env["DSV41_PACKED_DIR"], env["DSV41_IO_THREADS"]) == ("nvme", "/engram", "96")
    assert env["DSV41_SOURCE"] == "/models/DeepSeek-V4.1-Flash" and env["SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"] == "0"
    mounts = [a for a in plan.hosts[0].docker_argv if a.endswith(":/engram") or ":/engram:" in a]
    assert mounts, plan.hosts[0].docker_argv
    plan, _ = render(inventory, "sglang-tp4-1m", sets=["engram.mode=memory"])
    assert plan.hosts[0].env["SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"] == "1" and "OFFLOAD_MODE" not in plan.hosts[0].env


@pytest.mark.parametrize("profile, gamma", [("sglang-tp4-1m", "3"), ("sglang-tp3", "5"), ("sglang-tp8", "5")])
def test_sglang_dspark_block_size_is_the_sources(inventory, profile, gamma):
    """DSPARK_BLOCK_SIZE of the source's .env files; --speculative-num-draft-tokens, if set, is gamma + 1."""
    plan, _ = render(inventory, profile)
    argv = plan.hosts[0].engine_argv
    assert argv[argv.index("--speculative-dspark-block-size") + 1] == gamma
    if "--speculative-num-draft-tokens" in argv:
        assert argv[argv.index("--speculative-num-draft-tokens") + 1] == str(int(gamma) + 1)


def test_container_spec_devices_are_data():
    profile = load_profile("tp4").profile
    paths = load_inventory(REPO / "inventory.example.yaml").model.paths
    spec = docker.container_spec(profile, paths, 0, ["vllm"], ("/dev/infiniband",))
    argv = docker.docker_run_argv(spec)
    assert argv[argv.index("--device"):argv.index("--device") + 2] == ["--device", "/dev/infiniband"]


def test_hcas_is_a_list_or_up(tmp_path):
    data = yaml.safe_load((REPO / "inventory.example.yaml").read_text())
    data["defaults"]["hcas"] = "all"
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert err.value.field == "defaults.hcas" or "defaults.hcas" in str(err.value)
    assert "'up' for every Up one" in str(err.value)


def test_sglang_dspark_window_is_gamma_plus_one(inventory):
    with pytest.raises(ConfigError) as err:
        render(inventory, "sglang-tp8", sets=["engine_args.speculative-num-draft-tokens=5"])
    assert err.value.field == "engine_args.speculative-num-draft-tokens"
    assert "(= 6 for gamma=5)" in err.value.detail
    plan, _ = render(inventory, "sglang-tp8", sets=["engine_args.speculative-num-draft-tokens=6"])
    argv = plan.hosts[0].engine_argv
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "6"


def test_the_standin_sglang_refuses_a_window_that_is_not_gamma_plus_one():
    from sparkctl.standin.settings import StartupError, check_dspark_window

    check_dspark_window("5", "6")
    check_dspark_window("5", None)
    with pytest.raises(StartupError, match=r"must equal gamma \+ 1 \(= 6 for gamma=5\), but got speculative_num_draft_tokens=5"):
        check_dspark_window("5", "5")
