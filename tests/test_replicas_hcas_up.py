"""A replicated profile's serve and status resolve `hcas: up` as a single deployment's do: each
host's RDMA devices Up go into its NCCL_IB_HCA (serve), and status's drift check renders with the
same (else the variable serve set would read as drift). The real CLI runs in this process; the hosts
answer through recorded transports."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import yaml

from clirun import run_cli_in_process
from sparkctl.remote.fake import Answer, FakeTransport

IBDEV = "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\nroceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n"
NAMES = ("a", "b", "c", "d")


class Site:
    def __init__(self):
        self.transports = {}
        for name in NAMES:
            transport = FakeTransport(name, {("ibdev2netdev",): Answer(stdout=IBDEV)})
            transport.target = SimpleNamespace(name=name)
            self.transports[name] = transport

    @contextmanager
    def pool(self, *args, **kwargs):
        yield self

    def get(self, target):
        return self.transports[target.name]


@pytest.fixture
def inventory(tmp_path):
    hosts = [{"name": n, "address": f"10.9.0.{i + 11}", "fabric_addresses": [f"10.10.0.{i + 11}"],
              **({"role": "head"} if i == 0 else {})} for i, n in enumerate(NAMES)]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "defaults": {"hcas": "up"}, "hosts": hosts}))
    return str(path)


def test_replicated_serve_renders_the_up_devices_of_every_replicas_hosts(monkeypatch, inventory):
    from sparkctl.cli import serve_cmd

    site = Site()
    monkeypatch.setattr(serve_cmd, "_pool", site.pool)
    result = run_cli_in_process("-i", inventory, "--json", "serve", "--profile", "sandbox-replicas", "--dry-run")
    assert result.returncode == 0, result.stderr
    hosts = [h for replica in result.json()["replicas"] for h in replica["serve"]["hosts"]]
    assert {h["name"]: h["env"].get("NCCL_IB_HCA") for h in hosts} == {n: "rocep1s0f1,roceP2p1s0f1" for n in NAMES}
    assert all(any(c.argv[0] == "ibdev2netdev" for c in t.calls) for t in site.transports.values())


def test_replicated_status_asks_the_up_devices_before_its_drift_check(monkeypatch, inventory):
    """status renders what serve would now, for its drift check: with `hcas: up`, only after asking."""
    from sparkctl.ops import replica_status

    seen = []

    def gather(inventory, loaded, **kwargs):  # the report itself needs a running set: what it was given is the point
        seen.append({h.name: h.hcas for h in inventory.hosts})
        raise SystemExit(0)

    from sparkctl.cli import serve_cmd

    site = Site()
    monkeypatch.setattr(serve_cmd, "_pool", site.pool)
    monkeypatch.setattr(replica_status, "gather_replica_status", gather)
    from sparkctl.cli import replicas_cmd

    monkeypatch.setattr(replicas_cmd, "gather_replica_status", gather, raising=False)  # (imported at its top one day)
    run_cli_in_process("-i", inventory, "status", "--profile", "sandbox-replicas")
    assert seen == [{n: ("rocep1s0f1", "roceP2p1s0f1") for n in NAMES}]
