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
        result = site.cli("stop", "-y", "--profile", "sandbox", "--grace", "5")
        text = result.stdout + result.stderr
        assert result.code == 1, result
        assert victim.name in text and "docker" in text.lower(), text
        assert "nothing to stop" not in text, text
    # dockerd back: the rank it held is there again (or its container record is); a second stop removes it.
    again = site.cli("--json", "stop", "-y", "--profile", "sandbox", "--grace", "5")
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


def test_a_rank_that_cannot_start_leaves_nothing_running_and_the_previous_record(site):  # noqa: F811
    _ok_serve(site)
    record_path = "/var/lib/sparkctl/sandbox/deployment.json"
    before = {h.name: site.read(h, record_path) for h in site.hosts}
    victim = site.hosts[2]
    site.exec(victim, "docker", "rm", "-f", "sparkctl-sandbox")  # (a running container's mounts live in that folder)
    # docker run writes the new container's folder under the engine's data root: full there, only there.
    with faults.disk_full(site.cluster.info, victim.name, f"{victim.docker_data}/containers"):
        result = serve(site, "--set", "max_num_seqs=7")
    assert result.code == 1, result
    report = result.json()
    assert report["stage"] == "start", report
    assert victim.name in report["message"] and "no space left" in json.dumps(report).lower(), report
    assert "nothing of sandbox runs" in report["message"], report
    assert next(h for h in report["hosts"] if h["name"] == victim.name)["ok"] is False
    for host in site.hosts:  # never half up
        assert [c["Name"] for c in site.containers(host) if c["State"]["Running"]] == [], host.name
        assert site.read(host, record_path) == before[host.name], host.name  # the previous record is kept
    status = site.cli("--json", "status", *PROFILE)
    assert status.code == 1 and not status.json()["ok"], status
    _ok_serve(site)  # the fault cleared, the same serve converges
    site.stop()
