"""The fault matrix: each verb that touches hosts, run while one host (spark-2, a worker) has a fault
the sandbox injects (sparkctl.sandbox.faults), on the one shared cluster; the fault is cleared after
each case (the four verbs that only look at the deployment share one injection of a fault but a crash: see LOOKS).
Every cell asserts: no traceback, exit 0 or 1; when the fault makes the host unusable, exit 1
naming it; nothing reports a success that did not happen (a serve that says ok has every rank running,
a stop that says ok left no container); and after the fault is cleared the verb converges (exit 0).

The verbs that move things to hosts (build --on, distribute, model sync, pack-engram) and up run on a
second set-up (tests/fault_chain_site.py: small image chains, a small checkpoint); the last test kills
distribute --from and model sync mid-stream (SIGKILL, SIGINT) and checks that nothing it started
outlives it, on the hosts or here, and that the same command run again converges.

Each cell's outcome is written to $SPARKCTL_FAULT_MATRIX (a JSON file) when set: docs/hardening.md
shows the table. Cells are chosen to keep the run affordable; the table there says which are not run.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from sandbox_fixture import sandbox_cluster  # noqa: F401  (the session's cluster)
from sparkctl.sandbox import faults
from test_serve_sandbox import PROFILE, site  # noqa: F401  (the serve test site: image, checkpoint, shards)

pytestmark = pytest.mark.sandbox

VICTIM = 1  # spark-2: a worker (rank 1)
UNUSABLE = ("dockerd_stopped", "sshd_hung", "unreachable")  # the host cannot be asked (for docker, or at all)

# In the order a fault's cells run: doctor and serve from nothing deployed (the stop cell before them took
# it down; the engine cells deploy first), serve's re-run deploys what the looks and stop then use, and stop
# comes last, so no cell has to serve again only because stop took the deployment down.
VERBS = {
    "doctor": ["doctor", *PROFILE],
    "serve": ["serve", "-y", *PROFILE, "--health-timeout", "90"],
    "status": ["status", *PROFILE],
    "logs": ["logs", *PROFILE, "--tail", "5"],
    "top": ["top", "--profile", "sandbox", "--once"],
    "smoke": ["smoke", "--profile", "sandbox"],
    "stop": ["stop", "-y", "--profile", "sandbox", "--grace", "5"],
}
# Every verb under every fault; smoke asks only the head's endpoint, so a worker's fault is not its to name.
FAULTS = ("dockerd_stopped", "sshd_hung", "unreachable", "disk_full", "engine_killed")
CELLS = [(verb, fault) for fault in FAULTS for verb in VERBS]
NEEDS_DEPLOYMENT = ("status", "logs", "top", "smoke", "stop")
# The verbs that only look at the deployment (no lock, nothing written): their four cells of a fault share one
# injection of it, each verb run in turn while it lasts, and each converging in turn once it is cleared. A stopped
# Docker engine then costs one serve again, not one per cell. Not a crash: each look gets its own kill, run as
# soon as Docker has seen the engine die, since a look run seconds after another would mostly find the rank
# already brought back by the restart policy (logs of a crashed rank would no longer be what is tested).
LOOKS = ("status", "logs", "top", "smoke")
SHARED_LOOK_FAULTS = ("dockerd_stopped", "sshd_hung", "unreachable", "disk_full")
# A host that never answers (its sshd hung, its link down) costs the faulted run the SSH connect timeout,
# once or more: there every verb that has the option waits 5 s instead of its default 10. The same path
# (the connection gives up, the host is named); the re-run keeps the default.
SILENT = ("sshd_hung", "unreachable")
NO_CONNECT_TIMEOUT_OPTION: tuple[str, ...] = ()  # every verb here takes it (build and distribute too, since they have it)
OUTCOMES: dict[str, dict] = {}
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"  # the same in every process of one run
_DOCTOR_BASELINE: dict[str, set[str]] = {}


def _doctor_failures(site, host) -> set[str]:  # noqa: F811
    """The checks doctor fails on ``host`` (this test site fails some on every run: each host imported
    its own copy of the image; where a deployment runs, its ports are taken)."""
    result = site.cli("--json", *VERBS["doctor"], timeout=300)
    doc = json.loads(result.stdout)
    checks = next(h["checks"] for h in doc["hosts"] if h["name"] == host.name)
    return {c["name"] if "name" in c else c.get("id", "?") for c in checks if c["status"] == "fail"}


def _converged(site, verb: str, victim) -> tuple[int, str]:  # noqa: F811
    """(exit code, what failed) of the verb run again once the fault is cleared; doctor converges when
    the host fails no check it did not fail before the fault."""
    if verb == "doctor":
        extra = _doctor_failures(site, victim) - _DOCTOR_BASELINE["doctor"]
        return (1 if extra else 0), ", ".join(sorted(extra))
    if verb in NEEDS_DEPLOYMENT and verb != "stop":
        looked = _ensure_deployed(site)
        if verb == "status" and looked is not None:  # that look was the status verb run again, and it answered 0
            return looked.code, (looked.stdout + looked.stderr)[-1500:]
    args = [*VERBS[verb], "--break-lock"] if verb in ("serve", "stop") else VERBS[verb]
    again = site.cli(*args, timeout=300)
    if verb == "serve" and again.code == 0:
        _SERVING["known"] = True
    return again.code, (again.stdout + again.stderr)[-1500:]


def _faulted(args: list[str], verb: str, fault: str) -> list[str]:
    """The verb's arguments for its run under ``fault`` (see SILENT)."""
    if fault in SILENT and verb not in NO_CONNECT_TIMEOUT_OPTION:
        return [*args, "--connect-timeout", "5"]
    return list(args)


# Whether the deployment is known to serve with nothing since that could have changed it, so a cell need not
# look again: known after a serve that said ok, or a look that said so once a fault that leaves the engine
# alone was cleared; unknown again at every fault's injection. After a stopped Docker engine or a crash every
# cell looks for itself: the restart policy may bring a rank back, or the job down, at any time after.
_SERVING = {"known": False, "after": ""}
ENGINE_FAULTS = ("dockerd_stopped", "engine_killed")
_LOOKED: dict[str, dict[str, object]] = {}  # fault: {verb of LOOKS: its cell's runs, or what it raised}, once per fault


@pytest.fixture(autouse=True, scope="module")
def _nothing_known_yet():
    """What an earlier module (or part of this one) in this process left is looked at again."""
    _SERVING.update(known=False, after="")
    _LOOKED.clear()
    yield


def _ensure_deployed(site):  # noqa: F811
    """The deployment serves, served again when status says it does not. Returns status's answer when it
    said so (the status verb's own run: the status cells take it as their re-run), None after a serve or
    when no look was needed (see _SERVING)."""
    if _SERVING["known"]:
        return None
    looked = site.cli(*VERBS["status"])
    if looked.code == 0:
        _SERVING["known"] = _SERVING["after"] not in ENGINE_FAULTS
        return looked
    result = site.cli("serve", "-y", *PROFILE, "--health-timeout", "120", "--break-lock", timeout=300)
    assert result.code == 0, result
    _SERVING["known"] = True
    return None


def _fault(site, fault: str, host):  # noqa: F811
    _SERVING.update(known=False, after=fault)
    if fault == "engine_killed":
        return _engine_killed(site, host)
    where = {"disk_full": {"path": "/var/lib/sparkctl"}}
    return faults.inject(site.cluster.info, fault, host.name, **where.get(fault, {}))


def _engine(site, host) -> tuple[str, str]:  # noqa: F811
    """(the engine container's main PID, its restart count) as the host's Docker engine sees them."""
    from sparkctl.sandbox import cluster

    seen = cluster.exec_in_host(site.cluster.info, host.name, ["docker", "inspect", "--format",
                                "{{.State.Pid}} {{.RestartCount}}", "sparkctl-sandbox"], timeout=120)
    pid, _, restarts = seen.stdout.decode().strip().partition(" ")
    return pid, restarts


@contextlib.contextmanager
def _engine_killed(site, host):  # noqa: F811
    """The engine killed, and the verb run only once Docker has seen it die (the process gone from its
    record: a new PID after a restart, or none). What comes next races on purpose: the restart policy
    may bring the rank (and the job) back before the verb looks, or not; every assert holds both ways."""
    before = _engine(site, host)
    with faults.inject(site.cluster.info, "engine_killed", host.name, container="sparkctl-sandbox"):
        deadline = time.monotonic() + 60
        while _engine(site, host) == before:
            assert time.monotonic() < deadline, f"{host.name}: docker still shows the killed engine {before} after 60 s"
            time.sleep(0.1)
        yield


def _no_false_success(site, verb: str, code: int, victim) -> None:  # noqa: F811
    """What an exit 0 claims, checked on the hosts themselves."""
    if code != 0:
        return
    if verb == "serve":
        for host in site.hosts:
            assert [c for c in site.containers(host) if c["State"]["Running"]], f"serve said ok; {host.name} runs nothing"
    if verb == "stop":
        for host in site.hosts:
            assert site.containers(host) == [], f"stop said ok; {host.name} still has a container"


# The sandbox tier runs this module in four parts, each in one test process (tests/conftest.py,
# sandbox_part): these cells in two (dockerd/hung, the other faults: each part builds the serve site),
# the chain cells with the killed commands, and up.
@pytest.mark.parametrize("verb, fault", CELLS, ids=[f"{v}-{f}" for v, f in CELLS])
def test_fault_matrix(site, verb, fault):  # noqa: F811
    victim = site.hosts[VICTIM]
    if verb == "doctor" and "doctor" not in _DOCTOR_BASELINE:
        _DOCTOR_BASELINE["doctor"] = _doctor_failures(site, victim)
    result, seconds, (again_code, again_text) = _cell_runs(site, verb, fault, victim)
    text = result.stdout + result.stderr
    cell = {"verb": verb, "fault": fault, "code": result.code, "named": victim.name in text,
            "seconds": round(seconds, 1), "line": next((line for line in result.stderr.splitlines() if victim.name in line),
                                                       (result.stderr.strip().splitlines() or [""])[-1])[:200]}
    cell["rerun_code"] = again_code
    OUTCOMES[f"{verb}/{fault}"] = cell
    _write_outcomes()

    assert "Traceback" not in text, text[-3000:]
    assert result.code in (0, 1), result
    if fault in UNUSABLE and verb != "smoke":
        assert result.code == 1, result
        assert victim.name in text, text[-3000:]
    if verb == "serve" and fault == "disk_full":  # its files cannot be written there
        assert result.code == 1 and victim.name in text, result
    if verb == "status" and fault == "engine_killed":
        # A rank down is not a healthy deployment. The restart policy may bring the whole job back
        # before status asks (on a quick machine it does): then status may say ok, but only as a
        # deployment whose victim rank it shows restarted.
        if result.code == 0:
            victim_lines = [line for line in result.stdout.splitlines() if victim.name in line]
            assert any("restarted" in line for line in victim_lines), result
        else:  # the table names every host: what failed must be said as a problem (or an error naming the host)
            assert result.code == 1 and ("problem: " in result.stdout or victim.name in result.stderr), result
    assert again_code == 0, again_text
    _no_false_success(site, verb, again_code, victim)


def _cell_runs(site, verb: str, fault: str, victim):  # noqa: F811
    """(the verb's run under the fault, its seconds, (exit code, what failed) of its run once the fault is
    cleared: the same verb converges, after a serve where the fault took the deployment down)."""
    if verb in LOOKS and fault in SHARED_LOOK_FAULTS:
        if fault not in _LOOKED:  # the first of the four cells to run takes every verb's runs, once
            _looks_under(site, fault, victim)
        outcome = _LOOKED[fault].get(verb)
        if outcome is None:
            pytest.fail(f"{verb} under {fault}: not run (the shared injection stopped before it)")
        if isinstance(outcome, BaseException):  # what went wrong for this verb fails this verb's cell alone
            raise outcome
        return outcome
    if verb in NEEDS_DEPLOYMENT or fault == "engine_killed":
        _ensure_deployed(site)
    with _fault(site, fault, victim):
        result, seconds = _faulted_run(site, verb, fault, victim)
    return result, seconds, _converged(site, verb, victim)


_FAILURES = (Exception, pytest.fail.Exception)  # an assert, a timeout, pytest.fail: a cell's failure


def _attempt(run):
    """run()'s value, or what it raised (kept for the cell it belongs to)."""
    try:
        return run()
    except _FAILURES as error:
        return error


def _looks_under(site, fault: str, victim) -> None:  # noqa: F811
    """Each verb of LOOKS run under one injection of ``fault``, then each converging once it is cleared (each
    looks at the deployment first, serving again when the fault took it down, as a cell of its own does).
    Each verb's outcome (its runs, or what it raised) goes into _LOOKED[fault] on its own, whatever happens:
    one verb's failure is its own cell's, and no other cell injects the fault again to repeat the lot. A
    failure before any verb ran (the deployment, the injection) is every verb's."""
    looked: dict[str, object] = {}  # verb: its cell's three runs, or what it raised
    try:
        _ensure_deployed(site)
        with _fault(site, fault, victim):
            ran = {verb: _attempt(lambda verb=verb: _faulted_run(site, verb, fault, victim)) for verb in LOOKS}
        for verb, run in ran.items():
            failed = isinstance(run, BaseException)
            looked[verb] = run if failed else _attempt(lambda verb=verb, run=run: (*run, _converged(site, verb, victim)))
    except _FAILURES as error:  # before any verb's outcome was whole: the deployment, the injection, clearing it
        for verb in LOOKS:
            looked.setdefault(verb, error)
    finally:
        _LOOKED[fault] = looked


def _faulted_run(site, verb: str, fault: str, victim):  # noqa: F811
    """The verb run while the fault lasts, what its exit 0 claims checked on the hosts meanwhile."""
    started = time.monotonic()
    result = site.cli(*_faulted(VERBS[verb], verb, fault), timeout=300)
    seconds = time.monotonic() - started
    _no_false_success(site, verb, result.code, victim)
    return result, seconds


def _write_outcomes() -> None:
    """This process's cells into the file, kept with what other test processes wrote there (the tier runs
    the matrix in parts, in several processes at once)."""
    import fcntl

    target = os.environ.get("SPARKCTL_FAULT_MATRIX")
    if not target:
        return
    with open(f"{target}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(target) as handle:
                cells = json.load(handle)
        except (OSError, ValueError):
            cells = {}
        # Cells of an earlier run go (a cell this run did not reach must not show an old result).
        cells = {key: cell for key, cell in cells.items() if cell.get("run") == RUN_ID}
        cells.update({key: {**cell, "run": RUN_ID} for key, cell in OUTCOMES.items()})
        with open(f"{target}.part", "w") as handle:
            json.dump(cells, handle, indent=1)
        os.replace(f"{target}.part", target)


# ---------------------------------------------------------------------------------------------------------
# The verbs that move things to hosts: build --on, distribute, model sync, pack-engram (tests/fault_chain_site.py).
# Each cell first takes from spark-2 what the verb puts there, so the verb has work to do there under the
# fault and in the re-run; the engine_killed fault does not apply (none of them needs a running engine).

from sandbox_fixture import give_to_user  # noqa: E402
from fault_chain_site import BUILD_CHAIN, DIST_CHAIN, UP_CHAIN, ChainSite, parse, rows  # noqa: E402
from test_build_support import local_dockerd_fixture  # noqa: E402

CHAIN_VERBS = {
    "build": ["--json", "build", "--image", BUILD_CHAIN, "--on", "spark-2"],
    "distribute": ["--json", "distribute", "--image", DIST_CHAIN],
    "model-sync": ["--json", "model", "sync", "--source", "{checkpoint}"],
    "pack-engram": ["--json", "pack-engram", "-p", "sandbox", "--set", "tensor_parallel=3", "-c", "{checkpoint}"],
}
CHAIN_FAULTS = ("dockerd_stopped", "sshd_hung", "unreachable", "disk_full")
CHAIN_CELLS = [(verb, fault) for fault in CHAIN_FAULTS for verb in CHAIN_VERBS]
# What needs spark-2's Docker engine: without it, the verb cannot do its work there.
NEEDS_DOCKER = ("build", "distribute")


@pytest.fixture(scope="session")
def local_dockerd(request):
    return local_dockerd_fixture(request)


@pytest.fixture(scope="module")
def chain_base(sandbox_cluster, tmp_path_factory):  # noqa: F811
    """The chains' images folder, the inventory and the hosts' folders; nothing built yet (up needs no more)."""
    return ChainSite(sandbox_cluster, tmp_path_factory.mktemp("faultchain"))


@pytest.fixture(scope="module")
def chain_site(chain_base, local_dockerd):
    from sparkctl.engram.checkpoint_maker import make_checkpoint

    s = chain_base
    s.env.update(local_dockerd.env())
    make_checkpoint(str(s.checkpoint), vocab_size=1000, head_dim=64, files=2, seed=5)
    built = s.cli("--json", "build", "--image", DIST_CHAIN, timeout=600)  # here: what distribute sends
    assert built.code == 0, built
    s.local_id = built.json()["image_id"]
    for verb in CHAIN_VERBS:  # every verb once, fault-free: the cells start from a converged cluster
        result = s.cli(*_chain_args(s, verb), timeout=600)
        assert result.code == 0, result
    yield s
    for host in s.hosts:  # the chains whole (base and layers too), so later modules find the hosts as they were
        for chain in (BUILD_CHAIN, DIST_CHAIN):
            s.drop_chain(host, chain)


def _chain_args(site, verb: str) -> list[str]:
    return [a.replace("{checkpoint}", str(site.checkpoint)) for a in CHAIN_VERBS[verb]]


def _take_from_victim(site, verb: str, fault: str, victim) -> None:
    """What the verb puts on spark-2 is gone before the cell: the verb has work there. A build on a host
    it cannot reach keeps its image (the re-run then reuses every layer: seconds, not a rebuild)."""
    if verb == "build":
        if fault == "disk_full":
            site.drop_image(victim, BUILD_CHAIN)
    elif verb == "distribute":
        site.drop_image(victim, DIST_CHAIN)
    elif verb == "model-sync":
        site.clear_folder(site.model_copy(victim))
    else:
        site.clear_folder(site.local(victim, "/mnt/nvme/fault-tests/engram"))


def _chain_fault(site, verb: str, fault: str, victim):
    """disk_full: where the verb writes on spark-2 (the engine's temporary folder, where docker load
    and docker build unpack what they are sent; the model folder; the Engram folder)."""
    if fault != "disk_full":
        return faults.inject(site.cluster.info, fault, victim.name)
    path = {"build": f"{victim.docker_data}/tmp", "distribute": f"{victim.docker_data}/tmp",
            "model-sync": "/mnt/nvme/fault-tests/model", "pack-engram": "/mnt/nvme/fault-tests/engram"}[verb]
    return faults.inject(site.cluster.info, "disk_full", victim.name, path=path)


def _claims_hold(site, verb: str, result, victim) -> None:
    """Every success the report claims is true on the hosts."""
    doc = parse(result)
    if verb == "build" and result.code == 0:
        assert site.image_id(victim, BUILD_CHAIN) == doc["image_id"], "build said ok; spark-2 has no such image"
    if verb == "distribute":
        for host in site.hosts:
            row = rows(doc).get(host.name, {})
            if row.get("status") in ("loaded", "skipped"):
                assert site.image_id(host, DIST_CHAIN) == site.local_id, f"distribute said {row['status']} for {host.name}"
    if verb == "model-sync":
        for host in site.hosts:
            if rows(doc).get(host.name, {}).get("status") in ("synced", "unchanged"):
                assert site.same_model(host), f"model sync said ok for {host.name}; its copy differs"
    if verb == "pack-engram" and result.code == 0:
        assert all(site.shards(h) for h in site.hosts), "pack-engram said ok; a host has no shards"


def _run_chain_cell(site, verb: str, fault: str, victim):
    started = time.monotonic()
    with _chain_fault(site, verb, fault, victim):
        result = site.cli(*_faulted(_chain_args(site, verb), verb, fault), timeout=300)
        seconds = time.monotonic() - started
        _claims_hold(site, verb, result, victim)
    return result, seconds


@pytest.mark.parametrize("verb, fault", CHAIN_CELLS, ids=[f"{v}-{f}" for v, f in CHAIN_CELLS])
def test_fault_matrix_chain(chain_site, verb, fault):
    site, victim = chain_site, chain_site.hosts[VICTIM]
    _take_from_victim(site, verb, fault, victim)
    result, seconds = _run_chain_cell(site, verb, fault, victim)
    text = result.stdout + result.stderr
    again = site.cli(*_chain_args(site, verb), timeout=300)
    cell = {"verb": verb, "fault": fault, "code": result.code, "named": victim.name in text,
            "seconds": round(seconds, 1), "rerun_code": again.code, "line": _named_line(text, victim)}
    OUTCOMES[f"{verb}/{fault}"] = cell
    _write_outcomes()

    assert "Traceback" not in text, text[-3000:]
    assert result.code in (0, 1), result
    if fault in UNUSABLE and (fault != "dockerd_stopped" or verb in NEEDS_DOCKER):
        assert result.code == 1 and victim.name in text, result
    if result.code == 1:
        assert victim.name in text, result
    if fault == "dockerd_stopped" and verb in NEEDS_DOCKER:  # the cause, not what a later command made of it
        assert "Cannot connect to the Docker daemon" in text, result
    assert again.code == 0, again
    _converged_on_hosts(site, verb, again)


def _converged_on_hosts(site, verb: str, again) -> None:
    """After the re-run, every host holds what the verb puts there (so every success the re-run claims is
    true: _claims_hold asks no more of it, and is not asked again)."""
    if verb == "build":
        assert site.image_id(site.hosts[VICTIM], BUILD_CHAIN) == again.json()["image_id"]
    elif verb == "distribute":
        assert [site.image_id(h, DIST_CHAIN) for h in site.hosts] == [site.local_id] * len(site.hosts)
    elif verb == "model-sync":
        assert all(site.same_model(h) for h in site.hosts)
    else:
        assert all(site.shards(h) for h in site.hosts)


# ---------------------------------------------------------------------------------------------------------
# up: a converged deployment of the faultup chain (built on the head, sent from it, shards, serve, smoke),
# then each fault on spark-2 and up again. Every step of up looks before it acts, so the cells cost what the
# fault breaks: a hung or lost host only its looks, a stopped engine or a crash a serve.

UP_PROFILE = ["--profile", "sandbox", "--set", "tensor_parallel=3", "--set", f"image.name={UP_CHAIN}",
              "--set", f"image.tag=sparkctl-{UP_CHAIN}:latest",
              "--set", "env.SPARKCTL_STANDIN_TTFT_BASE_MS=null", "--set", "env.SPARKCTL_STANDIN_ITL_MS=null"]
UP_FAULTS = ("dockerd_stopped", "sshd_hung", "unreachable", "disk_full", "engine_killed")


@pytest.fixture(scope="module")
def up_site(chain_base, local_dockerd):  # (the local engine as in the chain cells, though up builds on the head)
    """Needs no chain cell before it: each host gets the checkpoint model sync puts there in the chain set-up."""
    from sparkctl.engram.checkpoint_maker import make_checkpoint

    s = chain_base
    s.env.update(local_dockerd.env())
    for host in s.hosts:  # whatever the chain cells left there, if they ran first in this process
        s.clear_folder(s.model_copy(host))
        make_checkpoint(str(s.model_copy(host)), vocab_size=1000, head_dim=64, files=2, seed=5)
    give_to_user(*(h.nvme_dir for h in s.hosts))
    first = s.cli("--json", "up", *UP_PROFILE, "--break-lock", timeout=900)
    assert first.code == 0, first
    yield s
    stopped = s.cli("stop", "-y", "--profile", "sandbox", "--force-break-lock", "--grace", "5")
    for host in s.hosts:
        s.drop_chain(host, UP_CHAIN)
    assert stopped.code == 0, stopped  # a rank left running would hold the port of later modules


def _up_claims_hold(site, result) -> None:
    """An up that says ok serves: every host runs its rank."""
    if result.code == 0:
        for host in site.hosts:
            assert site.running(host) == ["sparkctl-sandbox"], f"up said ok; {host.name} runs {site.running(host)}"


@pytest.mark.parametrize("fault", UP_FAULTS)
def test_fault_matrix_up(up_site, fault):
    site, victim = up_site, up_site.hosts[VICTIM]
    started = time.monotonic()
    with _fault(site, fault, victim):
        result = site.cli(*_faulted(["--json", "up", *UP_PROFILE], "up", fault), timeout=600)
        seconds = time.monotonic() - started
        _up_claims_hold(site, result)
    text = result.stdout + result.stderr
    again = site.cli("--json", "up", *UP_PROFILE, "--break-lock", timeout=600)
    OUTCOMES[f"up/{fault}"] = {"verb": "up", "fault": fault, "code": result.code, "named": victim.name in text,
                               "seconds": round(seconds, 1), "rerun_code": again.code, "line": _named_line(text, victim)}
    _write_outcomes()

    assert "Traceback" not in text, text[-3000:]
    assert result.code in (0, 1), result
    if fault in UNUSABLE:
        assert result.code == 1 and victim.name in text, result
    if result.code == 1:  # the reason, in the one document: a failed step naming the host (or the run's error)
        doc = parse(result)
        reasons = [s.get("reason") or "" for s in doc.get("steps", []) if s.get("status") == "failed"] + [doc.get("error") or ""]
        assert any(victim.name in r for r in reasons), result
    if fault == "dockerd_stopped":  # the cause, not what a later command made of it
        assert "Cannot connect to the Docker daemon" in text, result
    assert again.code == 0, again
    _up_claims_hold(site, again)


def _named_line(text: str, victim) -> str:
    """The first line that names the host and says what went wrong (else the first naming it)."""
    lines = [line.strip() for line in text.splitlines() if victim.name in line]
    wrong = [line for line in lines if any(w in line.lower() for w in ("error", "fail", "cannot", "refused", "timed", "within"))]
    return ((wrong or lines or [""])[0])[:200]


# ---------------------------------------------------------------------------------------------------------
# The command itself killed mid-stream and run again: distribute --from spark-1 (a relay on spark-1 streams
# to spark-2 and spark-3 over the fabric) and model sync (a receiver agent on every host), each killed with
# SIGKILL (sparkctl alone: its SSH channels close with it) and with SIGINT to its process group (Ctrl-C in a
# terminal). Nothing it started may outlive it, on the hosts or here, after a short wait for the agents to
# see their channel closed; the same command run again converges.

# verb: (its arguments, words of the processes it starts on hosts, the prefix of its temporary folders there)
KILLED = {
    "distribute": (["--json", "distribute", "--image", DIST_CHAIN, "--from", "spark-1"],
                   ("relay.pyz", "docker save", "docker load"), "sparkctl-relay"),
    "model-sync": (["--json", "model", "sync", "--source", "{checkpoint}"], ("agent.pyz",), "sparkctl-model"),
}
SLOWLY = ["--bwlimit", "1"]  # MB/s: the transfer lasts seconds, long enough to be killed in the middle
CLEANUP_WAIT_S = 60  # generous: the agents notice at their next write (every half second), the load may be 8


def _host_processes(site, host, words) -> list[str]:
    """Command lines of the processes in the host's network namespace that match one of ``words``."""
    netns = os.stat(host.netns_path).st_ino
    found = []
    for entry in os.listdir("/proc"):
        try:
            if not entry.isdigit() or os.stat(f"/proc/{entry}/ns/net").st_ino != netns:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(word in cmdline for word in words):
            found.append(f"{entry}: {cmdline[:160]}")
    return found


def _session_processes(sid: int) -> list[int]:
    """Processes of the killed command's session still alive here (its ssh children, ...)."""
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    alive.append(int(entry))
            except OSError:
                continue
    return alive


def _run_folders(site, words, prefix: str) -> dict[str, set[str]]:
    """The temporary folders of this run on each host, read from its processes' command lines there
    (the shipped agent's path; the relay's known_hosts in its ssh commands): other runs' folders (this
    machine's /tmp may be shared with other test processes) are not this run's to answer for."""
    import re

    pattern = re.compile(rf"/tmp/{re.escape(prefix)}[.-][A-Za-z0-9_]+")
    return {host.name: {m for line in _host_processes(site, host, words) for m in pattern.findall(line)}
            for host in site.hosts}


def _left_behind(site, sid: int, words, folders: dict[str, set[str]], local_tmp: Path) -> dict:
    left = {}
    for host in site.hosts:
        present = [f for f in sorted(folders[host.name]) if site.exec(host, "test", "-e", f, check=False).returncode == 0]
        stray = _host_processes(site, host, words) + present
        if stray:
            left[host.name] = stray
    here = _session_processes(sid) + sorted(os.listdir(local_tmp))
    if here:
        left["here"] = here
    return left


def _mid_stream(site, verb: str) -> bool:
    """The transfer has started on spark-2 and is not finished."""
    victim = site.hosts[VICTIM]
    if verb == "distribute":
        return bool(_host_processes(site, victim, ("docker load",)))
    from sparkctl.model.agent import PART_SUFFIX

    copy = site.model_copy(victim)
    return any(p.name.endswith(PART_SUFFIX) and p.stat().st_size > 0 for p in copy.iterdir()) if copy.exists() else False


def _start_and_kill(site, verb: str, how: str, local_tmp: Path):
    import signal
    import subprocess

    args = _killed_args(site, verb) + SLOWLY
    env = {**os.environ, **site.env, "TMPDIR": str(local_tmp), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    log = local_tmp.parent / f"{verb}.stderr"  # a file, not a pipe nobody reads while it streams; not in its TMPDIR, which must end empty
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(site.argv(*args), env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _mid_stream(site, verb):
            assert proc.poll() is None, f"{verb} ended before it could be killed: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"{verb} never started its transfer"
            time.sleep(0.1)
        _, words, prefix = KILLED[verb]
        folders = _run_folders(site, words, prefix)
        if how == "SIGKILL":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    except BaseException:  # a failed wait must not leave the command streaming into later tests
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    return proc, folders


@pytest.mark.parametrize("verb", list(KILLED))
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_command_leaves_nothing_running_and_a_rerun_converges(chain_site, verb, how, tmp_path):
    site = chain_site
    words = KILLED[verb][1]
    _prepare_killed(site, verb)
    local_tmp = tmp_path / "tmp"
    local_tmp.mkdir()
    proc, folders = _start_and_kill(site, verb, how, local_tmp)
    assert any(folders.values()), "no folder of the run was seen on the hosts"
    started = time.monotonic()  # from the kill: how long what it started outlives it
    deadline = time.monotonic() + CLEANUP_WAIT_S
    left = _left_behind(site, proc.pid, words, folders, local_tmp)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _left_behind(site, proc.pid, words, folders, local_tmp)
    cleaned_s = time.monotonic() - started
    assert left == {}, f"left behind {CLEANUP_WAIT_S} s after {how}: {left}"
    again = site.cli(*_killed_args(site, verb), timeout=300)
    OUTCOMES[f"{verb}/killed-{how}"] = {"verb": verb, "fault": f"killed-{how}", "code": proc.returncode,
                                        "named": None, "seconds": round(cleaned_s, 1), "rerun_code": again.code, "line": ""}
    _write_outcomes()
    assert again.code == 0, again
    _killed_converged(site, verb)


def _killed_args(site, verb: str) -> list[str]:
    return [a.replace("{checkpoint}", str(site.big_checkpoint)) for a in KILLED[verb][0]]


def _prepare_killed(site, verb: str) -> None:
    """spark-2 and spark-3 lack what the command sends (spark-1, the source of distribute --from, has it)."""
    from sparkctl.engram.checkpoint_maker import make_checkpoint

    if not hasattr(site, "big_checkpoint"):  # a few MB: seconds at 1 MB/s
        site.big_checkpoint = site.tmp / "ckpt-big"
        make_checkpoint(str(site.big_checkpoint), vocab_size=12000, files=2, seed=9)
    for host in site.hosts[1:]:
        if verb == "distribute":
            site.drop_chain(host, DIST_CHAIN)
        else:
            site.clear_folder(site.model_copy(host))
    if verb == "distribute":
        assert site.image_id(site.hosts[0], DIST_CHAIN) == site.local_id


def _killed_converged(site, verb: str) -> None:
    if verb == "distribute":
        assert [site.image_id(h, DIST_CHAIN) for h in site.hosts] == [site.local_id] * len(site.hosts)
    else:
        assert all(site.same_model(h, site.big_checkpoint) for h in site.hosts)
