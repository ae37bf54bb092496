"""`stop` of a replicated profile changes the router under the same deploy lock as the replicas'
containers, and the audit line names what it did to the router. The real CLI runs in this process;
the hosts answer through recorded transports, each command noted in one shared log so the order
across hosts is visible."""

from __future__ import annotations

import json
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import yaml

from clirun import run_cli_in_process
from sparkctl.remote.fake import Answer, FakeTransport

PROFILE = "sandbox-replicas"  # 2 replicas x TP2 on four hosts
DOCKER_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."


def _container(name: str, rank: int, labels: dict) -> dict:
    return {"Id": f"{rank}" * 64, "Name": f"/{name}", "Image": "sha256:" + "a" * 64, "State": {"Status": "running"},
            "Config": {"Image": "sparkctl-sandbox:latest", "Labels": labels}}


def _kind(argv: list[str]) -> str:
    """What a command is, by the name its script runs under or its docker verb."""
    if argv[:2] == ["sh", "-c"] and len(argv) > 3:
        return argv[3]  # sparkctl-lock, sparkctl-audit, sparkctl-unlock, sparkctl-router, ...
    if argv[:2] in (["docker", "stop"], ["docker", "rm"]):
        return "docker " + argv[1]
    return "other"


class Site:
    """Four hosts, each running one rank of a replica; the router on the first. ``router_down``
    hosts cannot list their containers (a stopped Docker engine)."""

    def __init__(self, router_down: tuple[str, ...] = ()):
        self.log: list[tuple[str, str, list[str]]] = []
        self.transports = {name: self._host(name, rank, name in router_down)
                           for name, rank in (("a", 0), ("b", 1), ("c", 0), ("d", 1))}

    def _host(self, name: str, rank: int, router_down: bool) -> FakeTransport:
        engine = json.dumps([_container("sparkctl-sandbox", rank, {"sparkctl.profile": PROFILE,
                                                                   "sparkctl.rank": str(rank)})])
        router = json.dumps([_container(f"sparkctl-router-{PROFILE}", 0, {"sparkctl.router": PROFILE})]
                            if name == "a" else [])

        def answer(argv, stdin):
            kind = _kind(argv)
            self.log.append((name, kind, argv))
            if kind == "sparkctl-router":
                return Answer(1, "", DOCKER_DOWN) if router_down else Answer(stdout=router)
            if "sparkctl-containers" in argv:
                return Answer(stdout=engine)
            return Answer(stdout="")  # lock taken, audit written, no record, no image facts

        transport = FakeTransport(name, {(lambda argv: True): answer})
        transport.target = SimpleNamespace(name=name)  # as a pooled connection names its host
        return transport

    @contextmanager
    def pool(self, *args, **kwargs):
        yield self

    def get(self, target):
        return self.transports[target.name]

    def first(self, kind: str, host: str | None = None) -> int:
        return next(i for i, (name, k, _) in enumerate(self.log) if k == kind and host in (None, name))

    def audit_line(self) -> str:
        return next(argv[-1] for _, kind, argv in self.log if kind == "sparkctl-audit")


@pytest.fixture
def inventory(tmp_path):
    hosts = [{"name": n, "address": f"10.9.0.{i + 11}", **({"role": "head"} if i == 0 else {})}
             for i, n in enumerate("abcd")]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "hosts": hosts}))
    return str(path)


def _stop(monkeypatch, site: Site, inventory: str, *extra: str):
    from sparkctl.cli import serve_cmd

    monkeypatch.setattr(serve_cmd, "_pool", site.pool)
    return run_cli_in_process("-i", inventory, "stop", "--profile", PROFILE, "-y", "--json", *extra)


def test_the_router_goes_inside_the_lock_and_the_audit_line_says_so(monkeypatch, inventory):
    site = Site()
    result = _stop(monkeypatch, site, inventory)
    assert result.returncode == 0, result.stdout
    lock, router, engines = site.first("sparkctl-lock", "a"), site.first("sparkctl-router"), site.first("docker stop")
    assert lock < router < engines < site.first("sparkctl-unlock", "a"), [(n, k) for n, k, _ in site.log]
    doc = result.json()
    assert doc["router"]["stop"] is True and doc["router"]["summary"] == "removed"
    line = site.audit_line()
    assert " router=removed " in line and "result=ok" in line and doc["audit"] == line


def test_a_router_that_cannot_be_stopped_stops_nothing_and_is_audited(monkeypatch, inventory):
    site = Site(router_down=("c",))
    result = _stop(monkeypatch, site, inventory)
    assert result.returncode == 1
    assert not any(kind == "docker stop" for _, kind, _ in site.log)  # the replicas stay behind their router
    assert site.first("sparkctl-lock", "a") < site.first("sparkctl-router") < site.first("sparkctl-unlock", "a")
    doc = result.json()
    assert doc["ok"] is False and doc["stage"] == "router" and "c: cannot list the router container" in doc["message"]
    assert " router=failed " in site.audit_line() and "result=failed" in site.audit_line()
    human = _stop(monkeypatch, Site(router_down=("c",)), inventory).stderr
    assert "Traceback" not in human


def test_stopping_one_replica_keeps_the_router_and_names_that_in_the_audit_line(monkeypatch, inventory):
    site = Site()
    result = _stop(monkeypatch, site, inventory, "--hosts", "c,d")
    assert result.returncode == 0, result.stderr
    doc = result.json()
    assert doc["router"]["stop"] is False and doc["router"]["leaving"] == ["replica 2"]
    # nothing answers on the router's port here: the router drops replica 2 itself, and the line says kept
    assert " router=kept " in site.audit_line()
    assert site.first("sparkctl-lock", "a") < site.first("docker stop")
    assert not any(kind == "sparkctl-router" for _, kind, _ in site.log)  # the router is not removed


def test_a_router_step_refused_as_bad_input_is_audited_as_failed(monkeypatch, inventory):
    # Any error out of the router step (here the API key's variable unset) leaves the replicas as they
    # are and an audit line that says failed, never ok.
    from sparkctl.cli import replicas_cmd
    from sparkctl.errors import ConfigError

    def no_key(profile):
        raise ConfigError("environment variable KEY is not set on this machine", field="serving.api_key_env")

    monkeypatch.setattr(replicas_cmd, "api_key_for", no_key)
    site = Site()
    result = _stop(monkeypatch, site, inventory, "--hosts", "c,d")
    assert result.returncode == 2, result.stdout
    assert not any(kind == "docker stop" for _, kind, _ in site.log)
    assert " router=failed " in site.audit_line() and "result=failed" in site.audit_line()


def test_each_hosts_stop_is_a_step_told_as_events_heads_first(monkeypatch, inventory):
    """Each host's stop runs as a step of the one protocol: the heads' (rank 0) before the others',
    each told to the reporter (JSON lines here), the --json document's hosts as before; a host whose
    container cannot be removed fails its own step, named, and the others still stop."""
    monkeypatch.setenv("SPARKCTL_EVENTS", "json")
    site = Site()
    rm = site.transports["d"].answers
    rm_rule = {(lambda argv: argv[:2] == ["docker", "rm"]): Answer(1, "", "Error: container is paused")}
    site.transports["d"].answers = {**rm_rule, **rm}
    result = _stop(monkeypatch, site, inventory)
    assert result.returncode == 1, result.stdout
    doc = result.json()
    by_host = {h["name"]: h for h in doc["hosts"]}
    assert by_host["a"] == {"name": "a", "ok": True, "removed": ["sparkctl-sandbox (running)"], "error": None}
    assert by_host["d"]["ok"] is False and by_host["d"]["removed"] == []
    assert by_host["d"]["error"] == "d: cannot remove sparkctl-sandbox: Error: container is paused"
    assert doc["message"] == "could not stop on d"
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    done = {e["host"]: (e["status"], e["reason"]) for e in events if e["event"] == "done" and e["step"] == "stop"}
    assert done["a"] == ("changed", "removed sparkctl-sandbox (running)") and done["d"][0] == "failed"
    started = [e["host"] for e in events if e["event"] == "started" and e["step"] == "stop"]
    assert sorted(started[:2]) == ["a", "c"] and sorted(started[2:]) == ["b", "d"]  # the heads first


def test_a_host_lost_while_stopping_fails_its_step_and_the_document_names_it(monkeypatch, inventory):
    from sparkctl.remote.result import RemoteError

    site = Site()

    def dropped(argv, stdin):
        raise RemoteError("b", "closed", "the connection dropped")

    site.transports["b"].answers = {(lambda argv: argv[:2] == ["docker", "stop"]): dropped,
                                    **site.transports["b"].answers}
    result = _stop(monkeypatch, site, inventory)
    assert result.returncode == 1, result.stdout
    doc = result.json()
    lost = next(h for h in doc["hosts"] if h["name"] == "b")
    assert lost["ok"] is False and lost["error"] == "b: the connection dropped [closed]" and lost["removed"] == []
    assert doc["message"] == "could not stop on b" and all(h["ok"] for h in doc["hosts"] if h["name"] != "b")
    assert "result=failed" in site.audit_line()
