"""`sparkctl setup` without hosts: its commands, the fabric address rule, sudo's argv and stdin, and
which setup step doctor names for each result."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from sparkctl.commands import setup as cmds
from sparkctl.ops.become import Become, NeedsPassword
from sparkctl.ops.doctor.fixes import setup_steps_for, steps_to_fix
from sparkctl.ops.doctor.verdicts import FAIL, PASS, WARN, CheckResult
from sparkctl.remote.result import CommandResult


def test_sudo_never_prompts_without_a_password_and_reads_stdin_with_one():
    assert cmds.sudo_argv(["usermod", "-aG", "docker", "nvidia"], with_password=False) == [
        "sudo", "-n", "--", "usermod", "-aG", "docker", "nvidia"]
    assert cmds.sudo_argv(["true"], with_password=True) == ["sudo", "-k", "-S", "-p", "", "--", "true"]


class FakeConn:
    def __init__(self, result: CommandResult):
        self.result, self.calls = result, []

    def run(self, argv, timeout=None, stdin=None):
        self.calls.append((list(argv), stdin))
        return self.result


def test_the_password_goes_on_stdin_never_in_argv_nor_in_repr():
    conn = FakeConn(CommandResult(0, "", "", 0.1))
    become = Become("s3cret-pw")
    become.run(conn, "spark-1", ["usermod", "-aG", "docker", "nvidia"])
    argv, stdin = conn.calls[0]
    assert "s3cret-pw" not in " ".join(argv) and stdin == b"s3cret-pw\n"
    assert "s3cret-pw" not in repr(become)


def test_a_sudo_that_wants_a_password_names_the_host_and_the_flag():
    conn = FakeConn(CommandResult(1, "", "sudo: a password is required\n", 0.1))
    with pytest.raises(NeedsPassword) as err:
        Become().check(conn, "spark-2")
    assert str(err.value) == "spark-2: sudo asks for a password; run again with --ask-become-pass"
    assert conn.calls[0][0] == ["sudo", "-n", "true"]


def test_links_and_groups_are_parsed_from_what_the_host_prints():
    links = [{"ifname": "enp1s0f1np1", "mtu": 1500, "addr_info": [{"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
             {"ifname": "enP2p1s0f1np1", "mtu": 9000, "addr_info": [{"family": "inet", "local": "10.0.0.111", "prefixlen": 24}]}]
    netplan, parsed = cmds.parse_links("no-netplan\n" + json.dumps(links))
    assert netplan is False
    assert parsed == {"enp1s0f1np1": {"mtu": 1500, "addresses": []},
                      "enP2p1s0f1np1": {"mtu": 9000, "addresses": ["10.0.0.111/24"]}}
    assert cmds.parse_groups("nvidia\nnvidia adm\nhas-docker-group\n") == ("nvidia", {"nvidia", "adm"}, True)
    assert cmds.parse_runtimes("no-access\n") is None
    assert cmds.parse_runtimes('{"runc": {}, "nvidia": {}}') == {"runc", "nvidia"}


def test_the_netplan_file_gives_each_twin_its_address_and_jumbo_frames():
    import yaml

    doc = yaml.safe_load(cmds.netplan_yaml([("enp1s0f1np1", "192.168.100.10/24"), ("enP2p1s0f1np1", "192.168.100.110/24")]))
    assert doc == {"network": {"version": 2, "ethernets": {
        "enp1s0f1np1": {"dhcp4": False, "addresses": ["192.168.100.10/24"], "mtu": 9000},
        "enP2p1s0f1np1": {"dhcp4": False, "addresses": ["192.168.100.110/24"], "mtu": 9000}}}}


def test_folders_look_tells_writable_creatable_and_foreign_folders_apart(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    out = subprocess.run(cmds.folders_look_argv([str(mine), str(mine / "a" / "b"), str(tmp_path / "f")]),
                         capture_output=True, text=True)
    assert out.stdout.split() == ["ok", "creatable", "creatable"]  # root writes everywhere: both absent ones creatable
    (tmp_path / "f").write_text("x")
    out = subprocess.run(cmds.folders_look_argv([str(tmp_path / "f")]), capture_output=True, text=True)
    assert out.stdout.split() == ["not-a-folder"]


def test_every_bind_mounted_folder_is_made_as_the_user_before_docker_run(tmp_path):
    from sparkctl.commands.docker import bind_sources, make_bind_sources_argv

    argv = ["docker", "run", "-d", "--env-file", "/s/e.env", "-v", f"{tmp_path}/model:/model:ro",
            "-v", f"{tmp_path}/cache/hub:/root/.cache/huggingface", "--label", "a=b", "img", "-v", "x"]
    sources = bind_sources(argv[:-2])
    assert sources == [f"{tmp_path}/model", f"{tmp_path}/cache/hub"]
    assert subprocess.run(make_bind_sources_argv(sources)).returncode == 0
    assert all(Path(p).is_dir() for p in sources)


def test_the_fabric_subnet_rule_derives_both_twins_addresses(tmp_path):
    from sparkctl.config.inventory import fabric_plan, load_inventory

    path = tmp_path / "inventory.yaml"
    path.write_text("defaults:\n  fabric_interfaces: [enp1s0f1np1, enP2p1s0f1np1]\n  fabric_subnet: 192.168.50.0/24\n"
                    "hosts:\n  - {name: a, address: 10.0.0.1, role: head}\n"
                    "  - {name: b, address: 10.0.0.2, fabric_addresses: [192.168.50.77, 192.168.50.78]}\n")
    a, b = load_inventory(str(path)).hosts
    assert fabric_plan(a) == [("enp1s0f1np1", "192.168.50.11/24"), ("enP2p1s0f1np1", "192.168.50.111/24")]
    assert fabric_plan(b) == [("enp1s0f1np1", "192.168.50.77/24"), ("enP2p1s0f1np1", "192.168.50.78/24")]
    assert a.fabric_address == "192.168.50.11"  # the derived address is the one the other ranks use


def test_a_bad_fabric_subnet_names_the_field(tmp_path):
    from sparkctl.config.inventory import load_inventory
    from sparkctl.errors import ConfigError

    path = tmp_path / "inventory.yaml"
    path.write_text("defaults:\n  fabric_subnet: 192.168.50.7/24\nhosts:\n  - {name: a, address: 10.0.0.1, role: head}\n")
    with pytest.raises(ConfigError, match="fabric_subnet"):
        load_inventory(str(path))


@pytest.mark.parametrize("check, steps", [
    (CheckResult("docker", FAIL, "permission denied while trying to connect to the Docker daemon socket"),
     ("docker_group", "nvidia_runtime")),
    (CheckResult("docker", WARN, "engine 28.0, storage overlay2, runtimes runc (no nvidia runtime)"), ("nvidia_runtime",)),
    (CheckResult("docker", FAIL, "docker: command not found"), ()),
    (CheckResult("state", FAIL, "/var/lib/sparkctl is not writable by this user"), ("folders",)),
    (CheckResult("rdma", WARN, "enp1s0f1np1 mtu 1500 (expected 9000)"), ("fabric",)),
    (CheckResult("rdma", FAIL, "rocep1s0f1 down; enp1s0f1np1 mtu 1500 (expected 9000)"), ()),  # a cable first
    (CheckResult("disk", FAIL, "10.0 GiB free on / (for /mnt/nvme), needs 40.0 GiB"), ()),
    (CheckResult("peers", WARN, "cannot log in to spark-2 (Permission denied)"), ("ssh_mesh",)),
    (CheckResult("checkpoint", FAIL, "config.json missing"), ()),
    (CheckResult("state", PASS, "/var/lib/sparkctl is writable"), ()),
])
def test_doctor_names_the_setup_step_that_fixes_a_result(check, steps):
    assert setup_steps_for(check) == steps


def test_doctor_fix_runs_the_steps_in_setups_order():
    checks = [CheckResult("peers", WARN, "cannot log in"), CheckResult("state", FAIL, "not writable"),
              CheckResult("docker", FAIL, "permission denied")]
    assert steps_to_fix(checks) == ("docker_group", "folders", "nvidia_runtime", "ssh_mesh")


def test_the_sandbox_etc_adds_the_user_without_copying_this_machines_passwords():
    from sparkctl.sandbox import hostetc

    shadow = hostetc._shadow_lines(["root:$6$salt$hash:19000:0:99999:7:::", "daemon:*:19000:0:99999:7:::"])
    assert shadow[0].startswith("root:*:") and shadow[-1].startswith("nvidia:*:")
    group = hostetc._group_lines(["root:x:0:", "docker:x:105:alice", "cloud:x:1000:"], in_docker=False)
    assert "docker:x:105:alice" in group and "nvidia:x:1000:" in group and not any(g.startswith("cloud:") for g in group)
    assert "docker:x:105:alice,nvidia" in hostetc._group_lines(["docker:x:105:alice"], in_docker=True)


def test_setups_summary_names_each_step_once_and_keeps_a_lone_hosts_reason():
    from sparkctl.ops.setup import HostSetup, SetupReport
    from sparkctl.ops.steps import CHANGED, OK

    hosts = [HostSetup(f"spark-{i}") for i in range(1, 9)]
    for host in hosts:
        for step in host.steps:
            step.status, step.reason = OK, "already true"
        host.step("docker_group").status, host.step("docker_group").reason = CHANGED, "nvidia is not in the docker group"
    hosts[2].step("folders").status, hosts[2].step("folders").reason = CHANGED, "to create: /mnt/nvme/engram"
    hosts[4].step("fabric").status = hosts[5].step("fabric").status = CHANGED
    status, why = SetupReport(hosts).outcome("hosts need setup")
    assert status == CHANGED
    assert why == ("prepared docker_group on every host, spark-3: folders (to create: /mnt/nvme/engram), "
                   "fabric on spark-5, spark-6")
    assert why.count("nvidia is not in the docker group") == 0 and len(why) < 200
    for host in hosts:
        for step in host.steps:
            step.status = OK
    assert SetupReport(hosts).outcome("all there") == (OK, "all there")


@pytest.mark.skipif(Path("/var/run/docker.sock").is_socket() and not __import__("os").access("/var/run/docker.sock", __import__("os").W_OK),
                    reason="this user cannot use this machine's docker socket: the script answers no-access first")
def test_the_runtimes_are_one_docker_info_and_a_down_engine_fails_with_its_reason(tmp_path):
    from test_distribute_space import ENGINE_DOWN_20_10, ENGINE_DOWN_25
    from test_fact_failures import _docker

    # docker 20.10's answer to RUNTIMES_FORMAT on a sandbox host (its runtimes as JSON)
    recorded = 'R {"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}'
    up = _docker(tmp_path, f'echo "$1" >> "{tmp_path}/calls.log"\n'
                           f'[ "$1 $2 $3" = {shlex.quote("info --format " + cmds.RUNTIMES_FORMAT)} ] || exit 1\necho \'{recorded}\'\n', "up")
    result = up.run(cmds.RUNTIMES_ARGV)
    assert result.exit_code == 0 and cmds.parse_runtimes(result.stdout) == {"io.containerd.runc.v2", "nvidia", "runc"}, result
    assert (tmp_path / "calls.log").read_text().split() == ["info"]  # one docker process
    for name, body in (("down20", ENGINE_DOWN_20_10), ("down25", ENGINE_DOWN_25)):
        failed = _docker(tmp_path, body, name).run(cmds.RUNTIMES_ARGV)
        assert failed.exit_code != 0 and failed.stdout == "", failed  # a failure, never "no runtimes"
        assert failed.stderr.strip().startswith("Cannot connect to the Docker daemon"), failed
