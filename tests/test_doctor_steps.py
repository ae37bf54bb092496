"""doctor on the step protocol: each host's checks are steps run by the one runner, every verdict
told to the reporter, the --json document unchanged in shape. The hosts answer through recorded
transports (captured real output), so the whole run -- gather, judge, steps -- runs in process."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from sparkctl.commands import probes
from sparkctl.config.inventory import load_inventory
from sparkctl.ops.doctor.run import CHECK_ORDER, run_doctor
from sparkctl.remote.fake import Answer, FakeTransport
from sparkctl.remote.result import RemoteError
from sparkctl.reporter import Reporter

CAPTURED = Path(__file__).parent / "data" / "captured"
STEP_STATUS = {"pass": "ok", "warn": "ok", "skip": "skipped", "fail": "failed"}


class Host(FakeTransport):
    """A recorded host that also shows a host key (the head's peers check asks for the workers')."""

    def server_key(self):
        self.connect()
        return type("Key", (), {"get_name": lambda self: "ssh-ed25519", "get_base64": lambda self: "AAAA"})()


class Pool:
    def __init__(self, *hosts: Host):
        self.hosts = {h.name: h for h in hosts}

    def get(self, target):
        return self.hosts[target.name]


def _inventory(tmp_path):
    hosts = [{"name": "a", "address": "10.9.0.11", "role": "head", "fabric_addresses": ["10.10.0.11"]},
             {"name": "b", "address": "10.9.0.12", "fabric_addresses": ["10.10.0.12"]}]
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "hosts": hosts}))
    return load_inventory(str(path))


def _captured(name: str) -> Answer:
    return Answer(stdout=(CAPTURED / name).read_text())


def _script(name: str):
    return lambda argv: argv[:2] == ["sh", "-c"] and len(argv) > 3 and argv[3] == name


def healthy(name: str) -> Host:
    """A GB10 answering every probe as the captured machines did."""
    checkpoint = '{"dir": true, "config": true, "index": true, "files": {"m.safetensors": 16}, ' \
                 '"expected": {"m.safetensors": 16}, "manifest": true, "left_out": []}'
    return Host(name, {
        ("date",): lambda argv, stdin: Answer(stdout=f"{time.time():.6f}"),
        (lambda argv: argv == probes.IDENTITY_ARGV): Answer(stdout="nvidia\n6.8.0\naarch64\nDGX OS 7\n"),
        ("nvidia-smi",): _captured("gb10-nvidia-smi-query.txt"),
        ("docker", "info"): _captured("docker-info-20.10-debian12.json"),
        (lambda argv: argv == probes.ULIMIT_ARGV): _captured("ulimits-debian12.txt"),
        ("ibdev2netdev",): _captured("gb10-ibdev2netdev.txt"),
        ("ip", "-o", "link"): _captured("gb10-ip-link.txt"),
        (lambda argv: argv == probes.RDMA_DEVICES_ARGV): Answer(stdout="rdma_cm\nuverbs0\n"),
        _script("disk"): _captured("df-debian12.txt"),
        _script("state"): Answer(stdout="writable\n"),
        ("cat", "/proc/meminfo"): _captured("meminfo-debian12.txt"),
        ("ss", "-Htln"): _captured("ss-htln-debian12.txt"),
        ("python3", "-I", "-S", "-c"): Answer(stdout=checkpoint),
        ("timeout",): Answer(),  # the worker's fabric address answers
        _script("peer-ssh"): Answer(),  # the head logs in to the worker
    })


def broken(name: str) -> Host:
    """A host whose commands fail: docker's socket refuses this user, every other tool is missing."""
    return Host(name, {
        ("docker",): Answer(1, "", "permission denied while trying to connect to the Docker daemon socket"),
        (lambda argv: True): Answer(127, "", "sh: 1: not found"),
    })


def by_host(report) -> dict[str, dict[str, dict]]:
    return {h["name"]: {c["id"]: c for c in h["checks"]} for h in report.to_json()["hosts"]}


def test_every_check_is_a_step_whose_look_is_its_verdict(tmp_path):
    inventory = _inventory(tmp_path)
    reporter = Reporter()
    report = run_doctor(inventory, inventory.hosts, pool=Pool(healthy("a"), broken("b")), reporter=reporter)
    checks = by_host(report)
    assert list(checks["a"]) == [c for c in CHECK_ORDER if c not in ("image", "surface")]  # no profile: no image
    assert checks["a"]["gpu"]["status"] == "pass" and checks["a"]["fabric"]["status"] == "pass"
    assert checks["a"]["docker"]["status"] == "warn"  # no nvidia runtime, and no profile asking for one
    assert checks["a"]["ulimits"]["status"] == "skip"
    # Every verdict told to the reporter as its host's step, in the report's order, and nothing acted.
    assert {e.kind for e in reporter.events} == {"looked"}
    for name, by_id in checks.items():
        records = reporter.steps(list(by_id), name)
        assert [(r.name, r.status) for r in records] == [(c, STEP_STATUS[r["status"]]) for c, r in by_id.items()]
    warned = reporter.steps(["docker"], "a")[0]
    assert warned.reason == "warn: " + checks["a"]["docker"]["detail"]
    assert not report.ok


def test_a_failed_command_is_the_hosts_answer_never_a_no(tmp_path):
    inventory = _inventory(tmp_path)
    reporter = Reporter()
    report = run_doctor(inventory, inventory.hosts, pool=Pool(healthy("a"), broken("b")), reporter=reporter)
    b = by_host(report)["b"]
    assert b["docker"]["status"] == "fail" and "permission denied" in b["docker"]["detail"]
    assert "no nvidia runtime" not in b["docker"]["detail"] and b["docker"]["setup"] == "docker_group,nvidia_runtime"
    assert b["gpu"] == {"id": "gpu", "status": "fail", "detail": "nvidia-smi: command not found", "setup": "",
                        "hint": "install the NVIDIA driver; `nvidia-smi` must work for this user"}
    assert "driver" not in b and "storage" not in b  # nothing read to compare
    step = reporter.steps(["gpu"], "b")[0]
    assert step.status == "failed" and step.reason == f"nvidia-smi: command not found (fix: {b['gpu']['hint']})"
    # the head's peers and fabric checks saw b answer: b's own failures stay b's
    assert by_host(report)["a"]["peers"]["status"] == "pass"


def test_an_unreachable_host_fails_ssh_and_skips_the_rest(tmp_path):
    inventory = _inventory(tmp_path)
    reporter = Reporter()
    report = run_doctor(inventory, inventory.hosts, pool=Pool(healthy("a"), Host("b", unreachable="refused")),
                        reporter=reporter)
    b = by_host(report)["b"]
    assert list(b) == CHECK_ORDER
    assert b["ssh"]["status"] == "fail" and b["ssh"]["detail"].startswith("refused: ")
    assert b["ssh"]["hint"] == "start sshd on 10.9.0.12 or fix the port"
    assert all(c["status"] == "skip" and c["detail"] == "host not reachable" for cid, c in b.items() if cid != "ssh")
    assert [r.status for r in reporter.steps(CHECK_ORDER, "b")] == ["failed"] + ["skipped"] * (len(CHECK_ORDER) - 1)
    a = by_host(report)["a"]
    assert "peers" not in a  # a worker this machine cannot reach has its own failed ssh check
    assert a["gpu"]["status"] == "pass"


def test_up_reads_the_report_as_its_step_and_leaves_what_later_steps_repair(tmp_path):
    inventory = _inventory(tmp_path)
    report = run_doctor(inventory, inventory.hosts[:1], pool=Pool(healthy("a")))
    status, reason = report.outcome(lambda check: check.id == "docker")
    assert status == "ok" and "passed" in reason and "left to later steps" not in reason  # a warning is not a failure


def test_a_connection_that_fails_twice_is_not_the_hosts_answer(tmp_path):
    inventory = _inventory(tmp_path)
    host = healthy("a")

    def drop(argv, stdin):
        raise RemoteError("a", "closed", "connection dropped")

    host.answers[("nvidia-smi",)] = drop
    report = run_doctor(inventory, inventory.hosts[:1], pool=Pool(host))
    gpu = by_host(report)["a"]["gpu"]
    assert gpu["status"] == "fail" and "dropped" in gpu["detail"] and "not the host's answer" in gpu["hint"]
    assert len(host.ran("nvidia-smi")) == 2  # asked once more on a fresh connection, then given up


def test_the_table_shows_a_hosts_words_as_they_are(tmp_path, capsys, monkeypatch):
    """A detail such as an SSH error's "[refused]" is text, not rich markup (it used to vanish)."""
    from sparkctl.cli.doctor_cmd import _print_report

    monkeypatch.setenv("COLUMNS", "200")
    inventory = _inventory(tmp_path)
    report = run_doctor(inventory, inventory.hosts, pool=Pool(healthy("a"), Host("b", unreachable="refused")))
    _print_report(report)
    out = capsys.readouterr().out
    detail = by_host(report)["b"]["ssh"]["detail"]
    assert detail.endswith("[refused]") and f"fail b ssh: {detail}" in out
    assert "fix: start sshd on 10.9.0.12 or fix the port" in out and "all hosts ready" not in out
