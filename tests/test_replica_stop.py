"""`stop --hosts` of a replicated profile: the router stays while a replica it routes to still runs
(the stopped ones leave its list), and goes first when the whole set is stopped. The hosts answer
through recorded transports (their containers as `docker inspect` prints them)."""

from __future__ import annotations

import json

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.ops.replica_stop import router_verdict
from sparkctl.remote.fake import Answer, FakeTransport

PROFILE = load_profile("sandbox-replicas").profile  # 2 replicas x TP2


def _container(rank: int, status: str) -> dict:
    return {"Id": f"{rank}" * 64, "Name": "/sparkctl-sandbox", "Image": "sha256:" + "a" * 64,
            "State": {"Status": status}, "Config": {"Image": "sparkctl-sandbox:latest", "Labels": {
                "sparkctl.profile": PROFILE.name, "sparkctl.rank": str(rank)}}}


def _host(name: str, status: str | None, rank: int = 0) -> FakeTransport:
    listing = json.dumps([_container(rank, status)] if status else [])
    return FakeTransport(name, {
        (lambda argv: "sparkctl-containers" in argv): Answer(stdout=listing),
        (lambda argv: True): Answer(stdout=""),  # no deployment record, no image facts
    })


class Pool:
    def __init__(self, transports):
        self.transports = {t.name: t for t in transports}

    def get(self, target):
        return self.transports[target.name]


@pytest.fixture
def inventory(tmp_path):
    hosts = [{"name": n, "address": f"10.9.0.{i + 11}", **({"role": "head"} if i == 0 else {})}
             for i, n in enumerate("abcd")]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "hosts": hosts}))
    return load_inventory(str(path))


def test_the_router_stays_while_the_other_replica_runs(inventory):
    pool = Pool([_host("a", "running"), _host("b", "running", 1), _host("c", "running"), _host("d", "running", 1)])
    verdict = router_verdict(inventory, PROFILE, ["c", "d"], pool=pool)
    assert not verdict.stop and verdict.reason == "the router stays: replica 1 (a, b) still runs behind it"
    assert [r.name for r in verdict.leaving] == ["replica 2"]
    assert pool.transports["c"].calls == []  # the hosts being stopped are not even looked at
    half = router_verdict(inventory, PROFILE, ["d"], pool=pool)  # one rank of replica 2: it leaves too
    assert not half.stop and [r.name for r in half.leaving] == ["replica 2"]


def test_the_router_goes_first_when_the_whole_set_is_stopped(inventory):
    pool = Pool([_host(n, "running") for n in "abcd"])
    every = router_verdict(inventory, PROFILE, ["a", "b", "c", "d"], pool=pool)
    assert every.stop and every.reason == "every replica is being stopped: the router goes first"
    # replica 1 was stopped earlier (its containers gone or exited): stopping replica 2 ends the set
    pool = Pool([_host("a", None), _host("b", "exited", 1), _host("c", "running"), _host("d", "running", 1)])
    last = router_verdict(inventory, PROFILE, ["c", "d"], pool=pool)
    assert last.stop and last.reason == "no other replica runs (replica 1 (a, b) stopped already): the router goes first"
    assert last.to_json() == {"stop": True, "reason": last.reason, "leaving": ["replica 2"]}


def test_a_replica_that_cannot_be_looked_at_keeps_the_router(inventory):
    pool = Pool([FakeTransport("a", unreachable="connection refused"), _host("b", None), _host("c", "running"),
                 _host("d", "running", 1)])
    verdict = router_verdict(inventory, PROFILE, ["c", "d"], pool=pool)
    assert not verdict.stop
    assert verdict.reason.startswith("the router stays: replica 1 cannot be looked at (a: ") and "refused" in verdict.reason


def test_a_router_answer_that_is_not_its_json_is_said_not_raised(tmp_path):
    """A page in the router's place (a proxy's, say): take_out says the router did not answer and
    leaves the dropping to the router's health checks, as for a router that is down."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from sparkctl.ops.replica_stop import take_out
    from sparkctl.ops.replicas import split_replicas

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>not the router</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        profile = load_profile("sandbox-replicas", sets=[f"router.port={server.server_port}"]).profile
        hosts = [{"name": n, "address": "127.0.0.1" if i == 0 else f"10.9.0.{i + 11}", **({"role": "head"} if i == 0 else {})}
                 for i, n in enumerate("abcd")]
        path = tmp_path / "inventory.yaml"
        path.write_text(yaml.safe_dump({"cluster": "t", "hosts": hosts}))
        inventory = load_inventory(str(path))
        replicas, _ = split_replicas(profile, inventory.hosts)
        said = take_out(inventory, profile, [replicas[1]], timeout_s=1)
    finally:
        server.shutdown()
    assert len(said) == 1 and said[0].startswith("the router did not answer"), said
