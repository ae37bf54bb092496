"""A broken host never reads as a healthy answer: serve, status and stop on the sandbox with one
host's Docker engine stopped (sparkctl.sandbox.faults). The wide verb × fault table is
tests/test_fault_matrix_sandbox.py; these are the findings that table grew from."""

from __future__ import annotations

import json

import pytest

from sandbox_fixture import sandbox_cluster  # noqa: F401  (the session's cluster)
from sparkctl.sandbox import faults
from test_serve_sandbox import PROFILE, serve, site  # noqa: F401  (the serve test site: image, checkpoint, shards)

pytestmark = pytest.mark.sandbox


def _ok_serve(site):  # noqa: F811
    result = serve(site)
    assert result.code == 0, result
    return result


def test_stop_with_a_stopped_dockerd_fails_naming_the_host_and_a_rerun_converges(site):  # noqa: F811
    _ok_serve(site)
    victim = site.hosts[2]
    with faults.dockerd_stopped(site.cluster.info, victim.name):
        result = site.cli("stop", "--profile", "sandbox", "--timeout", "5")
        text = result.stdout + result.stderr
        assert result.code == 1, result
        assert victim.name in text and "docker" in text.lower(), text
        assert "nothing to stop" not in text, text
    # dockerd back: the rank it held is there again (or its container record is); a second stop removes it.
    again = site.cli("--json", "stop", "--profile", "sandbox", "--timeout", "5")
    assert again.code == 0, again
    for host in site.hosts:
        assert site.containers(host) == [], host.name


def test_status_with_a_stopped_dockerd_names_the_host_not_a_missing_container(site):  # noqa: F811
    _ok_serve(site)
    victim = site.hosts[1]
    try:
        with faults.dockerd_stopped(site.cluster.info, victim.name):
            result = site.cli("--json", "status", *PROFILE)
            assert result.code == 1, result
            doc = json.loads(result.stdout)
            host = next(h for h in doc["hosts"] if h["name"] == victim.name)
            assert host["error"] and "docker" in host["error"].lower(), host
            assert not any("no sandbox container" in p for p in doc["problems"]), doc["problems"]
            assert any(p.startswith(victim.name) and "docker" in p.lower() for p in doc["problems"]), doc["problems"]
    finally:
        site.stop()


def test_serve_with_a_stopped_dockerd_names_the_engine_not_a_missing_image(site):  # noqa: F811
    site.stop()
    victim = site.hosts[2]
    with faults.dockerd_stopped(site.cluster.info, victim.name):
        result = serve(site)
        text = result.stdout + result.stderr
        assert result.code == 1, result
        assert victim.name in text and "docker" in text.lower(), text
        assert "missing" not in text, text
    for host in site.hosts:  # refused before anything was started
        assert site.containers(host) == [], host.name
    _ok_serve(site)
    site.stop()
