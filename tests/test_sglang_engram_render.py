"""Engram on NVMe for the SGLang line: what render gives the container (the source's switches and
mount), and that it is refused on an image whose surface lacks the overlay's switches."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sparkctl.commands.engine_flags import load_engine_flags
from sparkctl.commands.templates import TemplateSet
from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile, select_hosts
from sparkctl.errors import ConfigError
from sparkctl.ops.render import plan_render

REPO = Path(__file__).resolve().parent.parent
STOCK = load_engine_flags("sglang", "0.5.23")
# What the SGLang line's overlay adds to the engine's variables (its source's .env.example and start.sh).
OVERLAY = dataclasses.replace(STOCK, envs=frozenset(STOCK.envs | {"OFFLOAD_MODE", "DSV41_PACKED_DIR", "DSV41_SOURCE",
                                                                   "DSV41_CACHE_GIB", "DSV41_IO_THREADS"}))


def _render(flags, *sets):
    loaded = load_profile("sglang-tp4-1m", sets=["engram.mode=disk", *sets])
    inventory = load_inventory(REPO / "inventory.example.yaml")
    hosts, _ = select_hosts(loaded.profile, inventory.hosts, None)
    return plan_render(loaded, inventory.model.paths, hosts, flags, TemplateSet.default()), inventory


def test_every_rank_gets_the_offload_mode_the_packed_dir_and_the_mount():
    plan, inventory = _render(OVERLAY)
    engram_dir = inventory.model.paths.engram_dir
    for host in plan.hosts:
        assert host.env["OFFLOAD_MODE"] == "nvme"
        assert host.env["DSV41_PACKED_DIR"] == "/engram"  # where the source mounts its shards
        assert host.env["DSV41_SOURCE"] == "/models/DeepSeek-V4.1-Flash"  # the source's mount (container.model_mount)
        assert host.env["SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"] == "0"  # never the tables in memory
        argv = host.docker_argv
        mounts = [argv[i + 1] for i, a in enumerate(argv) if a in ("-v", "--volume", "--mount")]
        assert any(m.startswith(f"{engram_dir}:/engram") or f"source={engram_dir},target=/engram" in m for m in mounts), mounts
        env_file = host.files[f"{host.name}/engine.env"]
        assert "OFFLOAD_MODE=nvme\n" in env_file and "DSV41_PACKED_DIR=/engram\n" in env_file


def test_the_packed_dir_follows_the_containers_engram_mount():
    plan, _ = _render(OVERLAY, "container.engram_mount=/nvme/engram")
    assert {h.env["DSV41_PACKED_DIR"] for h in plan.hosts} == {"/nvme/engram"}


def test_an_image_without_the_overlay_switches_is_refused_naming_them():
    with pytest.raises(ConfigError) as err:
        _render(STOCK)
    assert err.value.field == "engram.mode"
    assert "OFFLOAD_MODE" in err.value.detail and "DSV41_PACKED_DIR" in err.value.detail
    half = dataclasses.replace(STOCK, envs=frozenset(STOCK.envs | {"OFFLOAD_MODE"}))
    with pytest.raises(ConfigError):
        _render(half)


def test_memory_mode_keeps_the_stock_host_table_and_no_offload_switches():
    loaded = load_profile("sglang-tp4-1m", sets=["engram.mode=memory"])
    inventory = load_inventory(REPO / "inventory.example.yaml")
    hosts, _ = select_hosts(loaded.profile, inventory.hosts, None)
    plan = plan_render(loaded, inventory.model.paths, hosts, OVERLAY, TemplateSet.default())
    env = plan.hosts[0].env
    assert env["SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"] == "1"
    assert "OFFLOAD_MODE" not in env and "DSV41_PACKED_DIR" not in env
