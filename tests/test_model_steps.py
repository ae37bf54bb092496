"""model sync's receivers as steps of the one runner: each host's ``copy`` step looks (its copy checked
against the source's manifest) and acts (what differs sent), told to the run's reporter under the
host's name. The hosts that need files share one send (the source read once for all of them); a host
whose stream failed is checked again and sent to in the next round; a refused host fails alone; a
host whose agent could not be copied fails without being asked again. The hosts answer through
recorded transports; the send itself is recorded (the real one is the sandbox tier's)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from sparkctl.model.plan import Source
from sparkctl.ops import model_sync
from sparkctl.ops.model_sync import COPY, HostReport, SyncOptions, _copy_steps, _Run
from sparkctl.output import Output
from sparkctl.remote.fake import FakeTransport
from sparkctl.reporter import DONE, LOOKED, STARTED, Reporter

MANIFEST = {"algo": "sha256", "files": {"a": {"size": 1000, "sha256": "x"}, "b": {"size": 500, "sha256": "y"}}}
COMPLETE = {"free": 10**6, "kept": {"files": MANIFEST["files"]},
            "files": {"a": {"state": "ok"}, "b": {"state": "ok"}}}
LACKS_A = {"free": 10**6, "files": {"a": {"state": "missing", "part": 0}, "b": {"state": "ok"}}}
HALF_A = {"free": 10**6, "files": {"a": {"state": "missing", "part": 400}, "b": {"state": "ok"}}}
NO_ROOM = {"free": 10, "files": {"a": {"state": "missing", "part": 0}, "b": {"state": "missing", "part": 0}}}


class Agents:
    """Each host's agent: its check answers in turn (the last one repeats), every install counted."""

    def __init__(self, checks: dict[str, list[dict]]):
        self.checks, self.installed, self.asked = checks, [], []

    def json(self, connection, args, stdin=None, timeout=None):
        assert args[0] == "check"
        self.asked.append(connection.name)
        answers = self.checks[connection.name]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def install(self, connection):
        self.installed.append(connection.name)


class Pool:
    def __init__(self, transports):
        self.transports, self.asked = {t.name: t for t in transports}, []

    def get(self, target):
        self.asked.append(target.name)
        return self.transports[target.name]


def _run(names, checks, *, dry_run=False, unreachable=()):
    out = Output()
    out._reporter = Reporter()  # recorded only: the test reads the events
    hosts = [SimpleNamespace(name=n) for n in names]
    pool = Pool([FakeTransport(n, unreachable="refused" if n in unreachable else None) for n in names])
    run = _Run(None, SyncOptions(source="/src", dry_run=dry_run, retries=1), Source("dir", path="/src"), None, "/src",
               None, "/models/m", hosts, {n: SimpleNamespace(name=n) for n in names},
               {n: HostReport(n) for n in names}, out, time.monotonic(), pool=pool, agents=Agents(checks))
    for name in unreachable:  # as _install_agents leaves a host it could not reach
        run.reports[name].error = f"{name}: connection refused"
    return run, [h for h in hosts if h.name not in unreachable]


@pytest.fixture
def sends(monkeypatch):
    """The send rounds: which hosts each one went to; ``fail`` names hosts whose first stream breaks."""
    rounds, fail = [], set()

    def send_round(run, plans, manifest, algo):
        rounds.append(sorted(p.name for p in plans))
        done = {}
        for plan in plans:
            if plan.name in fail and len(rounds) == 1:
                done[plan.name] = {"ok": False, "error": "the stream ended after 400 bytes", "files": [], "bytes_sent": 400}
            else:
                done[plan.name] = {"ok": True, "files": [{"file": s["file"], "ok": True, "resumed_from": s["offset"]}
                                                         for s in plan.send],
                                   "bytes_sent": plan.bytes_to_send, "seconds": 0.1}
        return done

    monkeypatch.setattr(model_sync, "_send_round", send_round)
    return SimpleNamespace(rounds=rounds, fail=fail)


def _told(run, host):
    return [(e.kind, e.status) for e in run.out.reporter.events if e.host == host and e.step == COPY]


def _end(run, host):
    return next(e for e in run.out.reporter.events if e.host == host and e.step == COPY and e.kind == DONE)


def test_each_receiver_is_a_step_and_the_ones_that_need_files_share_one_send(sends):
    sends.fail.add("h5")
    run, live = _run(["h1", "h2", "h3", "h4", "h5"],
                     {"h1": [COMPLETE], "h2": [LACKS_A], "h3": [NO_ROOM], "h4": [COMPLETE], "h5": [LACKS_A, HALF_A]},
                     unreachable=("h4",))
    _copy_steps(run, live, MANIFEST, "sha256")

    assert sends.rounds == [["h2", "h5"], ["h5"]]  # one send for both, then the retry of the one that broke
    assert run.agents.installed == ["h5"]  # shipped again before it is checked again
    rows = {n: r.to_json() for n, r in run.reports.items()}
    assert {n: r["status"] for n, r in rows.items()} == {
        "h1": "unchanged", "h2": "synced", "h3": "failed", "h4": "failed", "h5": "synced"}
    assert rows["h5"]["bytes_sent"] == 400 + 600  # the broken stream's bytes, then the rest from the part kept
    assert "not enough room" in rows["h3"]["error"] and rows["h4"]["error"] == "h4: connection refused"

    assert _told(run, "h1") == [(LOOKED, "ok"), (DONE, "ok")]
    assert _told(run, "h2") == [(LOOKED, "planned"), (STARTED, None), (DONE, "changed")]
    assert _end(run, "h2").reason == "sent 1 file(s), 1000 B; verified"
    assert _told(run, "h3") == [(LOOKED, "failed"), (DONE, "failed")]  # a log draws its end
    assert _end(run, "h3").reason.startswith("not enough room")
    assert _end(run, "h4").reason == "connection refused" and "h4" not in run.pool.asked  # not reached again
    assert _end(run, "h5").status == "changed" and "resumed after" in _end(run, "h5").reason
    notes = [e.reason for e in run.out.reporter.events if e.kind == "note"]
    assert "checking again and retrying h5" in notes


def test_a_dry_run_only_looks(sends):
    run, live = _run(["h1", "h2", "h3"], {"h1": [COMPLETE], "h2": [HALF_A], "h3": [NO_ROOM]}, dry_run=True)
    _copy_steps(run, live, MANIFEST, "sha256")
    assert sends.rounds == []
    assert {n: r.status for n, r in run.reports.items()} == {"h1": "unchanged", "h2": "planned", "h3": "failed"}
    assert run.reports["h2"].to_send == 600  # the part kept is not sent again
    assert not [e for e in run.out.reporter.events if e.kind in (STARTED, DONE)]
    assert _told(run, "h2") == [(LOOKED, "planned")]


def test_hosts_a_failed_relay_never_reached_end_their_step_failed_with_why():
    out = Output()
    out._reporter = Reporter()
    model_sync._tell_not_sent(out, ["h2", "h3"], "not sent: h1, which relays to the others, failed")
    for host in ("h2", "h3"):
        told = [(e.kind, e.status, e.reason) for e in out.reporter.events if e.host == host and e.step == COPY]
        assert told == [(LOOKED, "failed", "not sent: h1, which relays to the others, failed"),
                        (DONE, "failed", "not sent: h1, which relays to the others, failed")]
    model_sync._tell_not_sent(None, ["h2"], "x")  # a quiet run (up's look): nothing to tell, nothing raised


def test_a_send_that_breaks_down_fails_every_host_that_waited_for_it(monkeypatch):
    def broken(run, plans, manifest, algo):
        raise RuntimeError("cannot start the sender: no ssh client")

    monkeypatch.setattr(model_sync, "_send_round", broken)
    run, live = _run(["h1", "h2", "h3"], {"h1": [LACKS_A], "h2": [LACKS_A], "h3": [COMPLETE]})
    _copy_steps(run, live, MANIFEST, "sha256")
    assert {n: r.status for n, r in run.reports.items()} == {"h1": "failed", "h2": "failed", "h3": "unchanged"}
    for host in ("h1", "h2"):  # whichever ran the round, neither says it sent anything
        assert _end(run, host).status == "failed" and "no ssh client" in _end(run, host).reason
        assert "no ssh client" in run.reports[host].error


def test_ctrl_c_during_the_send_ends_it_and_its_senders_long_before_the_send_would(monkeypatch, tmp_path):
    """The rounds run in the verb's thread (the acts wait for them): an interrupt there ends the command
    at once, every sender process ended and the part kept for a resume. The send is held to a rate that
    makes it last ``floor`` seconds at the least, whatever the machine; the interrupt comes once the
    receiver has written its first bytes."""
    import signal
    import subprocess
    import sys
    import threading

    from sparkctl.model import agent as agent_mod

    size, rate = 40 * agent_mod.CHUNK, 16.0  # MB/s: 10.5 s at the least
    floor = size / (rate * 1e6)
    source, dest = tmp_path / "src", tmp_path / "dst"
    source.mkdir(), dest.mkdir()
    with open(source / "big", "wb") as handle:
        handle.truncate(size)  # sparse: read as zeros, no disk
    manifest = {"algo": "sha256", "files": {"big": {"size": size, "sha256": "0" * 64}}}
    receive = [sys.executable, "-c", "import sys; from sparkctl.model import agent; sys.exit(agent.main(sys.argv[1:]))",
               "receive", str(dest)]
    monkeypatch.setattr(model_sync, "_routes", lambda run, plans: {})
    monkeypatch.setattr(model_sync, "_receiver_argv", lambda run, name, routes: (receive, "this machine"))
    senders = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            senders.append(self)
    monkeypatch.setattr(agent_mod.subprocess, "Popen", Recorded)
    run, live = _run(["h1"], {"h1": [{"free": 10**12, "files": {"big": {"state": "missing", "part": 0}}}]})
    run.local_dir, run.options.bwlimit = str(source), rate
    part = dest / ("big" + agent_mod.PART_SUFFIX)
    interrupted = []

    def interrupt_once_bytes_arrive() -> None:
        while not (part.exists() and part.stat().st_size > 0):
            time.sleep(0.05)
        interrupted.append(time.monotonic())
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_bytes_arrive, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            _copy_steps(run, live, manifest, "sha256")
        ended = time.monotonic()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted and ended - started < floor / 2  # well before the send's own end
    assert senders and all(p.poll() is not None for p in senders)  # the senders ended, not left running
    assert 0 < part.stat().st_size < size and not (dest / "big").exists()  # the part kept: a resume continues it
    assert _end(run, "h1").status == "failed" and _end(run, "h1").reason == "stopped: interrupted"


def test_a_host_the_round_synced_is_synced_though_it_cannot_be_reached_again(sends):
    """The acts reach no host: each says what the rounds did for its host (the sender reaches it on its
    own), so a host whose connection is lost after its look is not failed when the round synced it."""
    run, live = _run(["h1", "h2"], {"h1": [LACKS_A], "h2": [LACKS_A]})
    looked = run.pool.get

    def lost_after_its_look(target):
        if target.name == "h2" and "h2" in run.pool.asked:
            return FakeTransport("h2", unreachable="refused")
        return looked(target)
    run.pool.get = lost_after_its_look
    _copy_steps(run, live, MANIFEST, "sha256")
    assert sends.rounds == [["h1", "h2"]]
    assert {n: r.status for n, r in run.reports.items()} == {"h1": "synced", "h2": "synced"}
    assert _end(run, "h2").status == "changed" and _end(run, "h2").reason == "sent 1 file(s), 1000 B; verified"
