"""doctor with a native profile (the single-box engine runs as a process): Docker and the image are
not asked for, where a container profile fails a host without Docker."""

from __future__ import annotations

from pathlib import Path

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.ops.doctor.expectations import expectations_for
from sparkctl.ops.doctor.gather import DoctorFindings
from sparkctl.ops.doctor.judge import judge_host
from sparkctl.ops.doctor.verdicts import FAIL, SKIP

REPO = Path(__file__).resolve().parent.parent


PROBES = ("system", "gpu", "docker", "ulimits", "rdma", "links", "rdma_devices", "disk", "memory", "state", "ports",
          "checkpoint", "image")


def _no_docker(host) -> DoctorFindings:
    """A host where no probe answered (each command missing): only the verdicts' choice of checks differs."""
    facts = DoctorFindings(host.name)
    facts.errors.update({probe: f"{probe}: command not found" for probe in PROBES})
    return facts


def test_native_profile_does_not_ask_for_docker_or_an_image():
    inventory = load_inventory(REPO / "inventory.example.yaml")
    host = inventory.hosts[0]
    native = expectations_for(inventory, load_profile("single-box").profile)
    assert native.image_tag is None and not native.uses_docker
    checks = judge_host(host, _no_docker(host), native, is_head=True)
    assert checks["docker"].status == SKIP and "native" in checks["docker"].detail


def test_container_profile_fails_a_host_without_docker():
    inventory = load_inventory(REPO / "inventory.example.yaml")
    host = inventory.hosts[0]
    container = expectations_for(inventory, load_profile("tp4").profile)
    assert container.image_tag and container.uses_docker
    checks = judge_host(host, _no_docker(host), container, is_head=True)
    assert checks["docker"].status == FAIL and "command not found" in checks["docker"].detail
