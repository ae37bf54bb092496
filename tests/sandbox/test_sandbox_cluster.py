"""The sandbox cluster, for real: namespaces, sshd, dockerd, private disks, repair, tear-down."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from clirun import run_cli
from sandbox_fixture import sandbox_name
from sparkctl.sandbox import cluster, procs, standins

pytestmark = pytest.mark.sandbox


def in_host(sb, host, *argv, input=None):
    proc = cluster.exec_in_host(sb.info, host, list(argv), input=input)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_up_brings_every_host_to_health(sandbox_cluster):
    report = cluster.status(sandbox_cluster.name)
    assert report.healthy, report.to_json()
    assert [h.name for h in report.hosts] == ["spark-1", "spark-2", "spark-3"]
    pids = [p for h in report.hosts for p in (h.holder_pid, h.sshd_pid, h.dockerd_pid)]
    assert len(set(pids)) == 9
    for h in report.hosts:
        assert cluster.ssh_banner(h.address).startswith("SSH-2.0-OpenSSH")


def test_inventory_and_known_hosts_describe_the_running_hosts(sandbox_cluster):
    from sparkctl.config.inventory import load_inventory

    info = sandbox_cluster.info
    inv = load_inventory(info.inventory)
    assert inv.model.cluster == f"sandbox-{info.name}"
    assert [(h.name, h.address, h.role) for h in inv.hosts] == [
        (h.name, h.address, "head" if h.index == 1 else "worker") for h in info.hosts]
    assert inv.model.known_hosts == info.known_hosts
    lines = open(info.known_hosts).read().splitlines()
    for host, line in zip(info.hosts, lines):
        kind, b64 = open(host.host_key + ".pub").read().split()[:2]
        assert line == f"{host.address} {kind} {b64}"
    # Every host has its own host key.
    assert len({line.split()[2] for line in lines}) == len(info.hosts)


def _links(sb) -> dict:
    """Every network link of the sandbox, each host's and this machine's of the sandbox's tag, by name: its
    index (a link made again gets a new one), addresses and MTU."""
    def table(listing: str) -> dict:
        return {link["ifname"]: (link["ifindex"], link.get("mtu"), sorted(a["local"] for a in link.get("addr_info", [])))
                for link in json.loads(listing)}

    here = table(subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True).stdout)
    links = {name: link for name, link in here.items() if sb.info.tag in name}
    for host in sb.info.hosts:
        links.update({f"{host.name}/{name}": link for name, link in table(in_host(sb, host.name, "ip", "-j", "addr", "show")[1]).items()})
    return links


def test_up_again_is_idempotent_and_leaves_running_hosts_alone(sandbox_cluster):
    before = {h.name: cluster.host_pids(sandbox_cluster.info, h.name) for h in sandbox_cluster.info.hosts}
    links_before = _links(sandbox_cluster)
    inventory_before = open(sandbox_cluster.info.inventory).read()
    info = cluster.up(sandbox_cluster.name)  # no host count: keeps the existing three
    assert info == sandbox_cluster.info
    # It checks the hosts and starts nothing: the same processes (the holders keep the namespaces), every
    # link still the one it was (a bridge or veth made again would have a new index).
    after = {h.name: cluster.host_pids(info, h.name) for h in info.hosts}
    assert after == before
    assert _links(sandbox_cluster) == links_before and any("/" not in name for name in links_before)
    assert open(info.inventory).read() == inventory_before


def test_each_host_has_its_own_name_links_and_fabric(sandbox_cluster):
    info = sandbox_cluster.info
    for host in info.hosts:
        assert in_host(sandbox_cluster, host.name, "hostname")[1].strip() == host.name
        code, out, _ = in_host(sandbox_cluster, host.name, "ip", "-j", "addr", "show")
        links = {link["ifname"]: link for link in json.loads(out)}
        # The cabled ConnectX-7 port as its two twin netdevs, both prepared (MTU 9000, an address each).
        assert set(links) == {"lo", "enP7s7", "enp1s0f1np1", "enP2p1s0f1np1"}
        for netdev, address in (("enp1s0f1np1", host.fabric_address), ("enP2p1s0f1np1", host.fabric_twin_address)):
            assert links[netdev]["mtu"] == 9000
            assert [a["local"] for a in links[netdev]["addr_info"] if a["family"] == "inet"] == [address]
        assert [a["local"] for a in links["enP7s7"]["addr_info"] if a["family"] == "inet"] == [host.address]
    # spark-1 reaches spark-2's sshd over the fabric link (not only over management).
    probe = (
        "import socket,sys; s=socket.create_connection((sys.argv[1],22),3); "
        "print(s.getsockname()[0], s.recv(8).decode())"
    )
    code, out, err = in_host(sandbox_cluster, "spark-1", "python3", "-c", probe, info.hosts[1].fabric_address)
    assert code == 0, err
    assert out.split() == [info.hosts[0].fabric_address, "SSH-2.0-"]


def _ssh(info, host, user, command):
    return subprocess.run(["ssh", "-i", info.identity_file, "-o", f"UserKnownHostsFile={info.known_hosts}",
                           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{user}@{host.address}", command],
                          capture_output=True, text=True, timeout=60)


def test_the_login_is_an_ordinary_user_with_sudo_and_docker(sandbox_cluster):
    """As on DGX OS: `nvidia` logs in with a key, is in the docker group of a prepared host, owns
    sparkctl's folders, and has sudo; root cannot log in over SSH."""
    info = sandbox_cluster.info
    host = info.hosts[0]
    out = _ssh(info, host, "nvidia", "id -un; id -Gn; sudo -n id -un; docker info --format '{{json .Runtimes}}'; "
                                     "stat -c %U /mnt/nvme /mnt/nvme/models /var/lib/sparkctl")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "nvidia" and "docker" in lines[1].split() and lines[2] == "root"
    assert "nvidia" in json.loads(lines[3])
    assert lines[4:] == ["nvidia"] * 3
    refused = _ssh(info, host, "root", "true")
    assert refused.returncode == 255 and "Permission denied" in refused.stderr


def test_each_host_has_a_private_nvme(sandbox_cluster):
    info = sandbox_cluster.info
    marker = f"written-on-spark-1-{os.getpid()}"
    code, _, err = in_host(sandbox_cluster, "spark-1", "sh", "-c", f"echo {marker} > /mnt/nvme/which-host")
    assert code == 0, err
    assert open(os.path.join(info.host("spark-1").nvme_dir, "which-host")).read().strip() == marker
    code, out, _ = in_host(sandbox_cluster, "spark-2", "cat", "/mnt/nvme/which-host")
    assert code != 0 and out == ""
    assert not os.path.exists(os.path.join(info.host("spark-2").nvme_dir, "which-host"))
    os.unlink(os.path.join(info.host("spark-1").nvme_dir, "which-host"))


def test_each_host_has_a_private_var_lib_sparkctl(sandbox_cluster):
    """Deployed files, the deploy lock and the audit log live in /var/lib/sparkctl: one per host, as on real boxes."""
    info = sandbox_cluster.info
    marker = f"deployed-on-spark-2-{os.getpid()}"
    code, _, err = in_host(sandbox_cluster, "spark-2", "sh", "-c", f"echo {marker} > /var/lib/sparkctl/which-host")
    assert code == 0, err
    assert open(os.path.join(info.host("spark-2").var_lib_dir, "which-host")).read().strip() == marker
    code, out, _ = in_host(sandbox_cluster, "spark-1", "cat", "/var/lib/sparkctl/which-host")
    assert code != 0 and out == ""
    assert not os.path.exists("/var/lib/sparkctl/which-host")
    os.unlink(os.path.join(info.host("spark-2").var_lib_dir, "which-host"))


def test_state_root_inside_the_hosts_folder_is_refused(monkeypatch):
    from sparkctl.errors import ConfigError
    from sparkctl.sandbox import layout

    monkeypatch.setenv(layout.ROOT_ENV, "/var/lib/sparkctl/sandbox")
    with pytest.raises(ConfigError, match="every sandbox host replaces"):
        layout.state_root()


def test_each_host_has_its_own_docker_engine(sandbox_cluster, busybox_tar):
    import docker

    info = sandbox_cluster.info
    engines = {h.name: docker.DockerClient(base_url=f"unix://{h.docker_socket}", version="auto") for h in info.hosts}
    try:
        assert len({e.info()["ID"] for e in engines.values()}) == 3
        for engine in engines.values():
            runtimes = engine.info()["Runtimes"]
            assert runtimes["nvidia"]["path"] == "nvidia-container-runtime"  # as nvidia-ctk registers it (found on PATH)
        tag = f"sandbox-test-busybox:{os.getpid()}"
        engines["spark-1"].api.import_image_from_data(busybox_tar, repository=tag.split(":")[0], tag=tag.split(":")[1])
        assert engines["spark-1"].images.get(tag)
        with pytest.raises(docker.errors.ImageNotFound):
            engines["spark-2"].images.get(tag)
        # A container with --network host sits in its host's network namespace, on its address,
        # and runs through the stand-in nvidia runtime.
        out = engines["spark-1"].containers.run(
            tag, ["/bin/busybox", "ip", "-o", "-4", "addr", "show", "enP7s7"], network_mode="host",
            runtime="nvidia", remove=True)
        assert f" {info.hosts[0].address}/" in out.decode()
        box = engines["spark-1"].containers.run(tag, ["/bin/busybox", "sleep", "300"], detach=True, name=f"sleeper{os.getpid()}")
        try:
            assert [c.id for c in engines["spark-1"].containers.list()] == [box.id]
            assert engines["spark-2"].containers.list() == []
        finally:
            box.remove(force=True)
        engines["spark-1"].images.remove(tag)
    finally:
        for engine in engines.values():
            engine.close()


def test_standins_print_what_a_gb10_prints(sandbox_cluster):
    code, out, _ = in_host(sandbox_cluster, "spark-2", "nvidia-smi",
                           "--query-gpu=name,driver_version,compute_cap,memory.total,uuid", "--format=csv,noheader")
    name, driver, cc, mem, uuid = out.strip().split(", ")
    assert (code, name, driver, cc, mem) == (0, "NVIDIA GB10", "580.95.05", "12.1", "[N/A]")
    assert uuid == standins.gpu_uuid(f"{sandbox_cluster.name}/spark-2")
    code, out, _ = in_host(sandbox_cluster, "spark-2", "ibdev2netdev")
    assert out.splitlines() == ["rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)", "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)",
                                "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)", "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)"]
    # A test can make one host look broken, and put it back.
    cluster.set_standin(sandbox_cluster.info, "spark-3", SPARK_DRIVER_VERSION="550.54.14", SPARK_IBDEV_STATE="Down")
    try:
        out = in_host(sandbox_cluster, "spark-3", "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")[1]
        assert out == "550.54.14\n"
        assert [line.endswith("(Down)") for line in in_host(sandbox_cluster, "spark-3", "ibdev2netdev")[1].splitlines()] == [True] * 4
        assert in_host(sandbox_cluster, "spark-2", "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")[1] == "580.95.05\n"
    finally:
        cluster.set_standin(sandbox_cluster.info, "spark-3", SPARK_DRIVER_VERSION="580.95.05", SPARK_IBDEV_STATE="")
    with pytest.raises(ValueError, match="unknown stand-in"):
        cluster.set_standin(sandbox_cluster.info, "spark-3", NOT_A_SETTING="1")


def test_up_repairs_a_half_dead_host(sandbox_cluster):
    info = sandbox_cluster.info
    before = cluster.host_pids(info, "spark-3")
    stopped = cluster.stop_service(info, "spark-3", "dockerd")
    assert stopped == before["dockerd"] and not procs.is_alive(stopped)
    os.kill(cluster.host_pids(info, "spark-2")["sshd"], 9)
    time.sleep(0.2)
    report = {h.name: h for h in cluster.status(sandbox_cluster.name).hosts}
    assert not report["spark-3"].healthy and report["spark-3"].dockerd_pid is None
    assert not report["spark-2"].healthy and report["spark-2"].sshd_pid is None
    assert report["spark-1"].healthy

    cluster.up(sandbox_cluster.name)
    assert cluster.status(sandbox_cluster.name).healthy
    after = cluster.host_pids(info, "spark-3")
    assert after["holder"] == before["holder"] and after["sshd"] == before["sshd"]
    assert after["dockerd"] not in (None, before["dockerd"])


def test_up_rebuilds_a_host_whose_link_is_gone(sandbox_cluster):
    info = sandbox_cluster.info
    host = info.host("spark-3")
    keep = os.path.join(host.nvme_dir, "survives-reboot")
    open(keep, "w").write("still here\n")
    before = cluster.host_pids(info, "spark-3")
    subprocess.run(["ip", "link", "del", host.veth_fabric], check=True)
    assert not cluster.status(sandbox_cluster.name).healthy
    cluster.up(sandbox_cluster.name)
    assert cluster.status(sandbox_cluster.name).healthy
    after = cluster.host_pids(info, "spark-3")
    assert all(before[s] != after[s] for s in ("holder", "sshd", "dockerd"))
    assert not any(procs.is_alive(pid) for pid in before.values())
    # Like a reboot: processes are new, the disk is kept.
    assert in_host(sandbox_cluster, "spark-3", "cat", "/mnt/nvme/survives-reboot")[1] == "still here\n"
    os.unlink(keep)


def _cli(*args, env_root):
    """``sparkctl sandbox ARGS`` in this process (tests/clirun.py; the hosts' daemons are started with
    ``setsid -f``, as from a shell): a fresh interpreter per call cost ~1 s of CPU."""
    return run_cli("sandbox", *args, env={"SPARKCTL_SANDBOX_ROOT": env_root}, timeout=180)


def test_cli_lifecycle_and_down_leaves_nothing_behind(sandbox_cluster, tmp_path, busybox_tar):
    """A second, separate sandbox through the CLI: up --json, status, a container and an ssh
    session running, down; then not one of its processes, links or files is left."""
    name = sandbox_name("l", "CLI lifecycle")
    root = sandbox_cluster.root
    mgmt, fabric = sandbox_cluster.subnets
    # Its subnets must not clash with the session cluster's: this is refused in one line.
    clash = _cli("up", "--hosts", "1", "--name", name, "--mgmt-subnet", mgmt, "--fabric-subnet", "10.99.0.0/24",
                 env_root=root)
    assert clash.returncode == 2 and "clashes" in clash.stderr and len(clash.stderr.strip().splitlines()) == 1
    try:  # from the first up that may create it: a failure anywhere after still takes it down
        other = [(f"10.{a}.0.0/24", f"10.{a + 1}.0.0/24") for a in range(199, 150, -2)]
        for m, f in other:
            created = _cli("up", "--hosts", "2", "--name", name, "--mgmt-subnet", m, "--fabric-subnet", f, "--json", env_root=root)
            if created.returncode != 2:
                break
        assert created.returncode == 0, created.stderr
        doc = json.loads(created.stdout)
        assert list(doc) == ["inventory", "known_hosts", "user", "bare", "password_sudo", "hosts"]
        assert (doc["user"], doc["bare"], doc["password_sudo"]) == ("nvidia", False, False)
        assert doc["inventory"] == os.path.join(root, name, "inventory.yaml")
        assert [list(h) for h in doc["hosts"]] == [["name", "address", "netns"]] * 2
        assert [h["netns"] for h in doc["hosts"]] == [f"sparkctl-{name}-spark-1", f"sparkctl-{name}-spark-2"]
        status = _cli("status", "--name", name, "--json", env_root=root)
        assert status.returncode == 0 and json.loads(status.stdout)["healthy"] is True
        # Shrinking stops the dropped host for good; the inventory follows.
        two = cluster.load(name)
        dropped = cluster.host_pids(two, "spark-2")
        shrunk = _cli("up", "--hosts", "1", "--name", name, env_root=root)
        assert shrunk.returncode == 0, shrunk.stderr
        assert not any(procs.is_alive(pid) for pid in dropped.values())
        assert not os.path.exists(two.host("spark-2").netns_path) and not os.path.exists(two.host("spark-2").dir)
        assert "spark-2" not in open(two.inventory).read()
        assert _cli("up", "--hosts", "2", "--name", name, env_root=root).returncode == 0
        info = cluster.load(name)
        h1 = info.host("spark-1")
        subprocess.run(["ssh", "-i", info.identity_file, "-o", f"UserKnownHostsFile={info.known_hosts}",
                        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"nvidia@{h1.address}",
                        "docker import - leftover:1 >/dev/null && (docker run -d leftover:1 /bin/busybox sleep 600 >/dev/null;"
                        " nohup sleep 600 >/dev/null 2>&1 &)"], input=busybox_tar, check=True, timeout=60)
        pids = set()
        for host in info.hosts:
            pids |= procs.processes_in([("net", procs.ns_inode(host.netns_path))], marker=host.dir)
        assert len(pids) >= 2 * 3 + 3  # holders, sshds, dockerds + containerd, shim, container, session sleep
    finally:
        gone = _cli("down", "--yes", "--name", name, "--json", env_root=root)
    assert gone.returncode == 0, gone.stderr
    assert json.loads(gone.stdout)["ok"] is True
    assert [pid for pid in pids if procs.is_alive(pid)] == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"sparkctl-{name}-" not in netns
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert info.bridge_mgmt not in links and info.bridge_fabric not in links and h1.veth_mgmt not in links
    assert not os.path.exists(os.path.join(root, name))
    after = _cli("status", "--name", name, "--json", env_root=root)
    assert after.returncode == 1 and json.loads(after.stdout)["exists"] is False
    again = _cli("down", "--yes", "--name", name, env_root=root)
    assert again.returncode == 0 and "nothing to do" in again.stderr


def test_same_name_under_another_root_is_refused_not_taken_over(sandbox_cluster, monkeypatch):
    # A short root: a host's Docker socket path under an xdist worker's tmp_path can pass the 108-byte
    # Unix limit, and up would refuse the root for that instead of for the name.
    elsewhere = tempfile.mkdtemp(prefix="sbx-")
    monkeypatch.setenv("SPARKCTL_SANDBOX_ROOT", elsewhere)
    try:
        with pytest.raises(cluster.SandboxError) as err:
            cluster.up(sandbox_cluster.name, 1, mgmt_subnet="10.97.0.0/24", fabric_subnet="10.98.0.0/24")
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
    assert err.value.exit_code == 2 and "refusing to take them over" in str(err.value)
    monkeypatch.setenv("SPARKCTL_SANDBOX_ROOT", sandbox_cluster.root)
    assert cluster.status(sandbox_cluster.name).healthy


def test_up_on_free_subnets_skips_a_pair_in_use(sandbox_cluster):
    """This process's cluster holds its subnets: a second sandbox given them first moves to the next free pair.
    (Which pair is free depends on the other sandboxes alive on the machine, so the candidates are many.)"""
    taken = sandbox_cluster.subnets
    rest = [p for p in cluster.subnet_pairs(161, 200) if p != taken]
    moved, refused = sandbox_name("k", "free-subnet pick"), sandbox_name("v", "no free subnet")
    try:
        info = cluster.up_on_free_subnets(moved, 1, [taken] + rest)
        assert (info.mgmt_subnet, info.fabric_subnet) in rest
        assert cluster.status(moved).healthy
    finally:
        cluster.down(moved)
    with pytest.raises(cluster.SandboxError, match="no free subnet pair"):
        cluster.up_on_free_subnets(refused, 1, [taken])
    assert not cluster.status(refused).exists


def test_two_sandboxes_brought_up_at_once_never_share_a_subnet_pair(sandbox_cluster):
    """Two `up`s at the same moment offered the same candidates (as two test processes on one machine
    are): each takes a pair the other does not hold, whichever of them looks first."""
    # This process's cluster's own pair first: both must see it is taken and move on.
    candidates = [tuple(sandbox_cluster.subnets)] + cluster.subnet_pairs(149, 120)
    names = [sandbox_name("x", "first of two at once"), sandbox_name("y", "second of two at once")]
    try:
        with ThreadPoolExecutor(2) as pool:
            infos = list(pool.map(lambda name: cluster.up_on_free_subnets(name, 1, candidates), names))
        first, second = ({info.mgmt_subnet, info.fabric_subnet} for info in infos)
        assert not first & second and not (first | second) & set(sandbox_cluster.subnets)
        assert all(cluster.status(name).healthy for name in names)
    finally:
        for name in names:
            cluster.down(name)
