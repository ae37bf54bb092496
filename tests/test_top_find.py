"""What `top` asks before its first frame: the deployment records of the hosts the user named (one
command per host), not the full look of status (containers, image IDs, layers) on every host. The
hosts answer through recorded transports."""

from __future__ import annotations

import json

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.ops.top import find_watched
from sparkctl.remote.fake import Answer, FakeTransport

PROFILE = load_profile("sandbox").profile


class Pool:
    def __init__(self, transports):
        self.transports = {t.name: t for t in transports}

    def get(self, target):
        return self.transports[target.name]


def _record(host: str, rank: int) -> str:
    return json.dumps({"profile": "sandbox", "endpoint": "http://10.9.0.11:8000", "hosts": ["a", "b", "c"],
                       "host": host, "rank": rank})


def _inventory(tmp_path):
    hosts = [{"name": n, "address": f"10.9.0.{i + 11}", **({"role": "head"} if i == 0 else {})}
             for i, n in enumerate("abc")]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "hosts": hosts}))
    return load_inventory(str(path))


def _host(name: str, record: str) -> FakeTransport:
    return FakeTransport(name, {
        (lambda argv: "sparkctl-record" in argv): Answer(stdout=record),
        (lambda argv: "sparkctl-containers" in argv): Answer(stdout="[]"),
    })


def test_a_named_hosts_record_is_all_the_first_frame_waits_for(tmp_path):
    inventory = _inventory(tmp_path)
    pool = Pool([_host("a", _record("a", 0)), _host("b", _record("b", 1)), _host("c", _record("c", 2))])
    endpoint, about = find_watched(inventory, PROFILE, pool=pool, hosts=[inventory.hosts[2]])
    assert endpoint == "http://10.9.0.11:8000" and about["hosts"] == ["a", "b", "c"]
    calls = {name: [c.argv for c in t.calls] for name, t in pool.transports.items()}
    assert calls["a"] == [] and calls["b"] == []  # only the named host is asked
    assert len(calls["c"]) == 1 and "sparkctl-record" in calls["c"][0]  # and only its record


def test_without_a_record_the_containers_decide_and_no_image_is_inspected(tmp_path):
    inventory = _inventory(tmp_path)
    pool = Pool([_host(n, "") for n in "abc"])
    endpoint, about = find_watched(inventory, PROFILE, pool=pool)
    assert endpoint == "http://10.9.0.11:8000" and about is None  # the profile's port on the inventory's head
    for transport in pool.transports.values():  # the record, then the containers: nothing else
        argvs = [" ".join(c.argv) for c in transport.calls]
        assert len(argvs) == 2 and "sparkctl-record" in argvs[0] and "sparkctl-containers" in argvs[1]


def test_rank_0s_record_wins_over_a_stale_one_found_first(tmp_path):
    """a holds a rank-1 record left from an older deployment on a and c; b and c hold today's."""
    inventory = _inventory(tmp_path)
    stale = json.dumps({"profile": "sandbox", "endpoint": "http://10.9.0.13:8000", "hosts": ["c", "a"], "host": "a",
                        "rank": 1})
    today = {"profile": "sandbox", "endpoint": "http://10.9.0.12:8000", "hosts": ["b", "c"]}
    pool = Pool([_host("a", stale), _host("b", json.dumps({**today, "host": "b", "rank": 0})),
                 _host("c", json.dumps({**today, "host": "c", "rank": 1}))])
    endpoint, about = find_watched(inventory, PROFILE, pool=pool)
    assert endpoint == "http://10.9.0.12:8000" and about["hosts"] == ["b", "c"] and "note" not in about


def test_a_host_that_cannot_be_asked_is_never_read_as_no_deployment(tmp_path):
    from sparkctl.errors import OperationFailed

    inventory = _inventory(tmp_path)
    pool = Pool([FakeTransport("a", unreachable="connection refused"), _host("b", ""), _host("c", "")])
    with pytest.raises(OperationFailed) as caught:
        find_watched(inventory, PROFILE, pool=pool)
    message = str(caught.value)
    assert message.startswith("cannot tell where sandbox is deployed: a") and "refused" in message
    assert "--endpoint" in message and "\n" not in message
    assert caught.value.exit_code == 1


def test_without_rank_0s_host_a_workers_record_serves_and_says_so(tmp_path):
    inventory = _inventory(tmp_path)
    pool = Pool([FakeTransport("a", unreachable="connection refused"), _host("b", _record("b", 1)),
                 _host("c", _record("c", 2))])
    endpoint, about = find_watched(inventory, PROFILE, pool=pool)
    assert endpoint == "http://10.9.0.11:8000" and about["hosts"] == ["a", "b", "c"]
    assert about["note"].startswith("rank 0's deployment record was not read (a: ") and "using b's (rank 1)" in about["note"]
