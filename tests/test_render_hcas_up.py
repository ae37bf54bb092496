"""`hcas: up` in render: the RDMA devices Up on each host go into its NCCL_IB_HCA, as serve and up
render them, when --ask-hosts asks (render asks no host by default, and says so in one line); a
host that could not be asked is named, with when the variable is set instead (serve and up, at
start). The hosts answer through recorded transports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from clirun import run_cli
from sandbox_fixture import sandbox_cluster  # noqa: F401  (the session's cluster)
from sparkctl.config.inventory import load_inventory
from sparkctl.ops.hcas import ask_up_hcas, render_notes
from sparkctl.ops.render import render
from sparkctl.remote.fake import Answer, FakeTransport

REPO = Path(__file__).resolve().parent.parent
# A GB10's cabled port: two Up twins; the other port is Down.
IBDEV = ("rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n"
         "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n"
         "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)\n")


class Pool:
    """Hands out a recorded transport per host, as ConnectionPool.get hands out connections."""

    def __init__(self, transports: dict[str, FakeTransport]):
        self.transports = transports

    def get(self, target):
        return self.transports[target.name]


def _inventory(tmp_path, **edits):
    data = yaml.safe_load((REPO / "inventory.example.yaml").read_text())
    data["defaults"]["hcas"] = "up"
    data["defaults"]["ssh"].update(edits.pop("ssh", {}))
    data.update(edits)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_render_puts_each_hosts_up_twins_in_nccl_ib_hca(tmp_path):
    inventory = load_inventory(_inventory(tmp_path))
    names = [h.name for h in inventory.hosts]
    transports = {name: FakeTransport(name, {("ibdev2netdev",): Answer(stdout=IBDEV)}) for name in names}
    transports[names[1]] = FakeTransport(names[1], unreachable="connection refused")
    transports[names[2]] = FakeTransport(names[2], {("ibdev2netdev",): Answer(stdout=IBDEV.replace("(Up)", "(Down)"))})
    resolved, missed = ask_up_hcas(inventory, Pool(transports))
    assert set(missed) == {names[1]} and "connection refused" in missed[names[1]]

    plan, _ = render(resolved, "tp4")
    env = {h.name: h.env for h in plan.hosts}
    assert env[names[0]]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"  # both twins, the Down port left out
    assert env[names[3]]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert "NCCL_IB_HCA" not in env[names[1]] and "NCCL_IB_HCA" not in env[names[2]]

    notes = render_notes(resolved.hosts[:4], missed, asked=True)
    assert notes[0].startswith(f"{names[0]}: hcas: up -> NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1")
    assert notes[1].startswith(f"{names[1]}: hcas: up: NCCL_IB_HCA is not rendered (the host could not be asked")
    assert "serve and up set it when they start" in notes[1]
    assert notes[2].startswith(f"{names[2]}: hcas: up: no RDMA device is Up there")


@pytest.fixture
def closed_port():
    """A port bound for the whole test but not listening: a connection is refused, and no other
    test process can take the port in the meantime."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def listening_port():
    """A port on 127.0.0.1 (box-1's address) that accepts connections and never answers: box-1 asked
    through it shows as a connection waiting here."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s


def _hosts():
    return [{"name": f"box-{i}", "address": f"127.0.0.{i}", **({"role": "head"} if i == 1 else {}),
             "fabric_addresses": [f"10.10.10.{i}"]} for i in (1, 2, 3, 4)]


def test_render_asks_no_host_unless_asked_and_says_so_in_one_line(cli, tmp_path, listening_port):
    import select

    path = _inventory(tmp_path, hosts=_hosts(), ssh={"port": listening_port.getsockname()[1], "identity_file": None})
    for flags in ((), ("--offline",)):  # the default, and the old spelling of it
        result = cli("-i", str(path), "--json", "render", "-p", "tp4", *flags)
        assert result.code == 0, result
        doc = result.json()
        assert all("NCCL_IB_HCA" not in h["env"] for h in doc["hosts"])
        assert [n for n in doc["notes"] if "hcas: up" in n] == [
            "hcas: up on box-1, box-2, box-3, box-4: NCCL_IB_HCA is not rendered (render asks no host; --ask-hosts "
            "asks each which RDMA devices are Up); serve and up set it when they start, to the RDMA devices Up on "
            "each host then"]
    assert select.select([listening_port], [], [], 0)[0] == []  # no connection was even opened
    both = cli("-i", str(path), "render", "-p", "tp4", "--offline", "--ask-hosts")
    assert both.code == 2 and "--ask-hosts" in both.stderr and "Traceback" not in both.stderr


def test_render_ask_hosts_says_per_host_why_nccl_ib_hca_is_missing(cli, tmp_path, closed_port):
    path = _inventory(tmp_path, hosts=_hosts(), ssh={"port": closed_port, "identity_file": None})
    asked = cli("-i", str(path), "render", "-p", "tp4", "--ask-hosts", "--connect-timeout", "2")
    assert asked.code == 0, asked
    lines = [line for line in asked.stderr.splitlines() if "hcas: up" in line]
    assert len(lines) == 4 and all("(the host could not be asked: " in line for line in lines), asked.stderr


@pytest.mark.sandbox
def test_render_asks_the_sandbox_hosts_and_finds_both_twins(sandbox_cluster, tmp_path):  # noqa: F811
    """On the sandbox (the stand-in `ibdev2netdev` shows each host's cabled port as two Up twins):
    `hcas: up` renders both in every host's NCCL_IB_HCA, as the inventory that names them does."""
    from sparkctl.sandbox.layout import FABRIC_TWINS

    data = yaml.safe_load(Path(sandbox_cluster.info.inventory).read_text())
    data["defaults"]["hcas"] = "up"
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run_cli("-i", str(path), "--json", "render", "-p", "sandbox", "--set", "tensor_parallel=3", "--ask-hosts")
    assert result.code == 0, result
    doc = result.json()
    twins = ",".join(hca for hca, _ in FABRIC_TWINS)
    assert [h["env"]["NCCL_IB_HCA"] for h in doc["hosts"]] == [twins] * 3
    assert [n for n in doc["notes"] if "hcas: up" in n] == [
        f"{h.name}: hcas: up -> NCCL_IB_HCA={twins} (the RDMA devices Up there now; serve and up set it when they "
        "start, to the RDMA devices Up on each host then)" for h in sandbox_cluster.info.hosts]
