"""``sparkctl model sync``: the checkpoint into ``paths.model_dir`` on every host, verified.

1. The source: a folder here, a folder on an inventory host (``--from HOST``), or a hub repo
   (``hf:OWNER/NAME[@REV]``), downloaded once onto this machine (sparkctl.model.hub).
2. A small agent (sparkctl.model.agent, standard library only) is copied to every host involved,
   the way ``distribute --from`` copies its relay (the same zip builder).
3. The source's manifest: every file's size and fast hash (xxh3-128 when every party has
   ``xxhash``, else sha256); from the hub, each LFS file's sha256 is checked against the hub's too.
4. Each receiver's ``copy`` step of the one runner (``ops/host_steps.HostSteps``), told to the run's
   reporter under its name: its look checks its copy against the manifest, all hosts at once (size,
   then content); the plan (pure, sparkctl.model.plan) sends only the files that are missing or
   differ, continues a part file left by an interrupted transfer, and refuses a host whose
   filesystem cannot hold what it lacks (that host's step fails, the others go on).
5. Its act: the source streams to every host whose look said send at once, one round for all of
   them (``_Sends``, run in this verb's thread while the acts wait, so Ctrl-C stops it), from this machine or from ``--from HOST`` itself (over the fabric, with that
   host's ssh and only the host keys this machine verified); each host writes
   ``NAME.sparkctl-part``, renames it once the whole file hashes right, and keeps the manifest last.
   A host whose stream failed is checked and tried again (``retries``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from sparkctl import engines
from sparkctl.commands.probes import read_file_argv
from sparkctl.errors import ConfigError, OperationFailed
from sparkctl.model import agent as agent_mod
from sparkctl.model.plan import (INDEX_NAME, HostPlan, Source, engram_table_files, human, parse_source, plan_host,
                                 weight_map_of, without)
from sparkctl.ops.host_steps import HostDecisions, HostSteps
from sparkctl.ops.steps import CHANGED, FAILED, OK, PLANNED, Look, Step, StepFailed
from sparkctl.reporter import Reporter
from sparkctl.transfer import Transfer
from sparkctl.remote.jsonlines import JsonLines
from sparkctl.remote.openssh import choose_routes, client_argv, known_hosts_lines, peer_argv
from sparkctl.remote.result import RemoteError
from sparkctl.remote.transport import ShippedAgent, ship_agent

# The agent and what it imports (all standard library underneath), zipped like distribute's relay.
AGENT_MODULES = ("sparkctl.model.agent", "sparkctl.images.pipe", "sparkctl.images.fanout", "sparkctl.images.archive",
                 "sparkctl.images.inputs", "sparkctl.images.orphan")
# Hashing a host's copy is bounded: 10 minutes plus the time to read it at 50 MB/s (an NVMe reads
# 510 GB at several GB/s; eight hashing threads do over 1 GB/s), so a hung host fails, a slow one not.
HASH_FLOOR_BYTES_S = 50e6
HERE = "this machine"  # a local source's hashing progress: whose bytes they are
HASH_TIMEOUT_S = 600 + 600e9 / HASH_FLOOR_BYTES_S  # the source: its size is not known before


@dataclass
class SyncOptions:
    source: str
    from_host: str | None = None
    hosts: list[str] | None = None
    model_dir: str | None = None  # default: the inventory's paths.model_dir
    bwlimit: float | None = None  # MB/s per receiving host
    without_engram_tables: bool = False
    download_dir: str | None = None
    dry_run: bool = False
    retries: int = 1
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    progress_every: float = 5.0
    download_only: bool = False  # a hub source: download and verify here, send nowhere
    engram_mode: str | None = None  # the profile's engram.mode (None: no profile)
    engine: str | None = None


@dataclass
class HostReport:
    name: str
    status: str = "failed"  # synced | unchanged | failed (dry run: planned | unchanged | failed)
    files_sent: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    error: str | None = None
    resumed_bytes: int = 0
    to_send: int = 0

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "files_sent": self.files_sent, "bytes_sent": self.bytes_sent,
                "seconds": round(self.seconds, 3), "error": self.error}


@dataclass
class SyncReport:
    source: str
    hosts: list[HostReport]
    algo: str = ""
    files: int = 0
    total_bytes: int = 0
    left_out: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(h.status != "failed" for h in self.hosts)

    def outcome(self) -> tuple[str, str]:
        """As a step's end: ok (every copy verified), changed (files sent), or StepFailed naming the hosts."""
        if not self.ok:
            raise StepFailed("; ".join(f"{h.name}: {h.error}" for h in self.hosts if h.status == "failed"))
        synced = [h for h in self.hosts if h.status == "synced"]
        if not synced:
            return OK, f"present and verified on {len(self.hosts)} host(s) ({self.files} files, {self.algo})"
        parts = [f"{h.name} ({h.files_sent} file(s), {human(h.bytes_sent)})" for h in synced]
        return CHANGED, f"sent from {self.source} to " + ", ".join(parts) + "; every host verified"

    def to_json(self) -> dict:
        doc = {"source": self.source, "hosts": [h.to_json() for h in self.hosts]}
        if self.dry_run:
            doc["dry_run"] = True
        return doc


# ---------------------------------------------------------------------------------------------- the agent


def agent_zip() -> bytes:
    from sparkctl.images.relay import relay_zip

    return relay_zip(AGENT_MODULES, "sparkctl.model.agent")


class Agents:
    """The agent shipped into a temporary folder on each host (removed by ``cleanup``)."""

    def __init__(self, pool):
        self.pool = pool
        self.shipped: dict[str, ShippedAgent] = {}
        self._zip = agent_zip()
        self._lock = threading.Lock()

    @property
    def paths(self) -> dict[str, str]:
        return {name: agent.path for name, agent in self.shipped.items()}

    def install(self, connection) -> str:
        """Ship the agent (again: a receiver whose sender went away removed its own folder)."""
        with self._lock:  # a copy that fails must leave no path behind that a later step would run
            previous = self.shipped.pop(connection.name, None)
        if previous is not None:
            previous.remove()
        agent = ship_agent(connection, self._zip, prefix="sparkctl-model", name="agent.pyz")
        with self._lock:
            self.shipped[connection.name] = agent
        return agent.path

    def json(self, connection, args: list[str], stdin: bytes | None = None, timeout: float | None = None) -> dict:
        """Run the agent on ``connection``'s host and read its one JSON line."""
        return self.shipped[connection.name].json(args, stdin=stdin, timeout=timeout, purpose="model sync")

    def cleanup(self, targets: dict) -> None:
        for agent in self.shipped.values():
            agent.remove()


def _say(out, message: str) -> None:
    """A note to the run's reporter (``out.reporter``), drawn as it is: file names may hold brackets."""
    out.reporter.note(message)


def _last(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ---------------------------------------------------------------------------------------------- steps


def _select(inventory, options: SyncOptions):
    source_host = inventory.host(options.from_host, field="--from") if options.from_host is not None else None
    return inventory.pick(options.hosts), source_host


def _check_engram_option(options: SyncOptions) -> None:
    if not options.without_engram_tables:
        return
    if options.engram_mode is None:
        raise ConfigError("needs --profile (only a profile with engram.mode=disk may leave the tables out)",
                          field="--without-engram-tables")
    if options.engine is None or not engines.get(options.engine).skips_engram_tables(options.engram_mode):
        raise ConfigError(f"the profile reads the Engram tables from the checkpoint (engine {options.engine}, "
                          f"engram.mode={options.engram_mode}); only vLLM with engram.mode=disk skips them on load",
                          field="--without-engram-tables")


def default_download_dir(repo: str) -> str:
    base = os.environ.get("SPARKCTL_MODEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sparkctl", "models")
    return os.path.join(base, repo.replace("/", "--"))


@dataclass
class _Run:
    """One sync's settled facts, shared by its steps."""

    inventory: object
    options: SyncOptions
    source: Source
    source_host: object | None  # HostView with --from
    local_dir: str | None  # the source folder on this machine (a folder source, or the hub download)
    expected: dict[str, str] | None  # the hub's LFS sha256 per file
    model_dir: str
    receivers: list
    targets: dict
    reports: dict[str, HostReport]
    out: object
    started: float
    pool: object = None
    agents: Agents | None = None
    sends: object = None  # the send rounds every host's act takes part in (_Sends)

    def say(self, message: str) -> None:
        if self.out is not None:
            _say(self.out, message)

    @property
    def where(self) -> str:
        return f"{self.source_host.name}:{self.source.path}" if self.source_host is not None else str(self.local_dir)


def run_sync(inventory, options: SyncOptions, out=None, pool=None) -> SyncReport:
    """``pool``: the run's connections (``up``'s), else this verb opens its own."""
    from sparkctl.remote.pool import run_pool

    started = time.monotonic()
    _check_engram_option(options)
    source = parse_source(options.source)
    if source.kind == "hub" and options.dry_run:
        raise ConfigError("a hub source is planned after its download: run without --dry-run, or sync the downloaded folder",
                          field="--dry-run")
    if options.download_only and source.kind != "hub":
        raise ConfigError("is for a hub source (hf:OWNER/NAME)", field="--download-only")
    chosen, source_host = _select(inventory, options)
    if source.kind == "hub" and source_host is not None:
        return _hub_via_host(inventory, options, source, chosen, source_host, out, started)
    model_dir = options.model_dir or inventory.model.paths.model_dir
    # The source host receives too when its folder is not the model_dir (it then copies from itself).
    same_folder = source_host is not None and os.path.normpath(source.path) == os.path.normpath(model_dir)
    receivers = [h for h in chosen if not (same_folder and h.name == source_host.name)]
    targets = {h.name: inventory.ssh_target(h) for h in receivers}
    if source_host is not None:
        targets[source_host.name] = inventory.ssh_target(source_host)
        if not source.path.startswith("/"):
            raise ConfigError(f"with --from, the folder on {source_host.name} must be an absolute path, got {source.path!r}",
                              field="--source")
    run = _Run(inventory, options, source, source_host, None, None, model_dir, receivers, targets,
               {h.name: HostReport(h.name) for h in receivers}, out, started)

    if source.kind == "hub":
        from sparkctl.model import hub

        files = hub.hub_files(source.repo, source.revision)
        run.local_dir = os.path.abspath(options.download_dir or default_download_dir(source.repo))
        run.say(f"hf:{source.repo} at {files.commit[:12]}: {len(files.sizes)} files, {human(sum(files.sizes.values()))}; "
                f"downloading into {run.local_dir} (resumes what is there)")
        hub.download(source.repo, files, run.local_dir)
        run.expected = files.sha256
        if options.download_only:
            return _verify_download(run)
    elif source_host is None:
        run.local_dir = os.path.abspath(source.path)
        if not os.path.isdir(run.local_dir):
            raise ConfigError(f"no such folder on this machine: {run.local_dir}", field="--source")

    if source_host is None and receivers and not options.dry_run and not shutil.which("ssh"):
        raise ConfigError("sending from this machine needs the OpenSSH client here (apt-get install openssh-client), "
                          "or a folder on a host (--from HOST)", field="--source")
    with run_pool(pool, connect_timeout=options.connect_timeout, accept_new_host_keys=options.accept_new_host_keys) as pool:
        run.pool, run.agents = pool, Agents(pool)
        try:
            return _sync(run)
        finally:
            run.agents.cleanup(targets)


def _hub_via_host(inventory, options: SyncOptions, source: Source, chosen, relay, out, started: float) -> SyncReport:
    """A hub source with ``--from HOST``: downloaded here once, sent to HOST, and HOST sends it to the
    others over the fabric (this machine's link carries it once, not once per host)."""
    from dataclasses import replace

    model_dir = options.model_dir or inventory.model.paths.model_dir
    first = run_sync(inventory, replace(options, from_host=None, hosts=[relay.name]), out)
    others = [h.name for h in chosen if h.name != relay.name]
    rows = {h.name: h for h in first.hosts}
    report = first
    if first.ok and others:
        report = run_sync(inventory, replace(options, source=model_dir, from_host=relay.name, hosts=others,
                                             model_dir=model_dir), out)
        rows.update({h.name: h for h in report.hosts})
    elif others:
        reason = f"not sent: {relay.name}, which relays to the others, failed"
        for name in others:
            rows[name] = HostReport(name, error=reason)
        _tell_not_sent(out, others, reason)
    return SyncReport(source=str(source), hosts=[rows[h.name] for h in chosen if h.name in rows], algo=report.algo,
                      files=first.files, total_bytes=first.total_bytes, left_out=first.left_out,
                      seconds=time.monotonic() - started)


def _tell_not_sent(out, names: list[str], reason: str) -> None:
    """The hosts a failed relay could not reach: each one's ``copy`` step failed with why, never looked at."""
    if out is None:
        return
    steps = HostSteps([Step(COPY, look_copy, act_copy)], {name: None for name in names}, {}, out.reporter, pool=None)
    for name in names:
        steps.fail(name, reason)
    steps.end_failed()


def _verify_download(run: _Run) -> SyncReport:
    """Hash the download against the hub's sha256 and keep the manifest with it."""
    run.say(f"verifying {run.local_dir} against the hub's sha256")
    manifest = agent_mod.build(run.local_dir, "sha256", run.expected)
    problems = manifest.pop("problems")
    if problems:
        raise OperationFailed(f"the download differs from the hub: {'; '.join(problems[:3])}")
    manifest["source"] = str(run.source)
    agent_mod.write_atomic(os.path.join(run.local_dir, agent_mod.MANIFEST_NAME), json.dumps(manifest, indent=1).encode())
    return SyncReport(source=str(run.source), hosts=[], algo="sha256", files=len(manifest["files"]),
                      total_bytes=sum(e["size"] for e in manifest["files"].values()),
                      seconds=time.monotonic() - run.started)


def _sync(run: _Run) -> SyncReport:
    live, algo = _install_agents(run)
    manifest = _source_manifest(run, algo)
    host_manifest, left_out = manifest, {}
    if run.options.without_engram_tables:
        skip = engram_table_files(weight_map_of(_read_index(run, manifest), f"{run.where}/{INDEX_NAME}"))
        host_manifest = without(manifest, skip)
        left_out = host_manifest.get("left_out", {})
        run.say(f"leaving out the Engram table files (engram.mode=disk, patched loader): {', '.join(skip) or 'none found'}; "
                f"{human(sum(v for v in left_out.values() if v))} less per host")
    total = sum(e["size"] for e in host_manifest["files"].values())
    run.say(f"{len(host_manifest['files'])} files, {human(total)} per host")
    _copy_steps(run, live, host_manifest, algo)
    return SyncReport(source=str(run.source), hosts=[run.reports[h.name] for h in run.receivers], algo=algo,
                      files=len(host_manifest["files"]), total_bytes=total, left_out=left_out,
                      dry_run=run.options.dry_run, seconds=time.monotonic() - run.started)


def _install_agents(run: _Run) -> tuple[list, str]:
    """The agent on every host involved; the receivers that answered, and the hash every party can compute."""
    from sparkctl.remote.pool import fan_out

    source_name = run.source_host.name if run.source_host is not None else None
    involved = list(dict.fromkeys([h.name for h in run.receivers] + ([source_name] if source_name else [])))

    def install(connection) -> dict:
        run.agents.install(connection)
        return run.agents.json(connection, ["probe", run.model_dir], timeout=60)

    probes = {}
    for result in fan_out([run.targets[name] for name in involved], install, pool=run.pool):
        if result.ok:
            probes[result.name] = result.value
        elif result.name == source_name:
            raise OperationFailed(f"{source_name} (--from): {result.error}")
        else:
            run.reports[result.name].error = result.error
    source_xxhash = probes[source_name]["has_xxhash"] if source_name else agent_mod.has_xxhash()
    live = [h for h in run.receivers if h.name in probes]
    algo = "xxh3_128" if source_xxhash and all(probes[h.name]["has_xxhash"] for h in live) else "sha256"
    return live, algo


def _source_manifest(run: _Run, algo: str) -> dict:
    """Every source file read once: size and hash (and the hub's sha256 checked on the way)."""
    run.say(f"hashing the source {run.where} ({algo})")
    if run.source_host is not None:
        manifest = _hash_there(run, algo)
    else:
        manifest = _hash_here(run, algo)
    problems = manifest.pop("problems")
    if problems:
        raise OperationFailed(f"the source differs from the hub: {'; '.join(problems[:3])}")
    if not manifest["files"]:
        raise OperationFailed(f"the source {run.where} holds no files")
    manifest["source"] = str(run.source)
    return manifest


def _hash_there(run: _Run, algo: str) -> dict:
    """The source host's manifest, with the same progress as a local source (the agent says how far
    it is while it reads; its first word gives the total, so the transfer starts then)."""
    host = run.source_host.name
    found: dict = {}
    hashing: list[Transfer] = []  # the one transfer, once the agent has said the total

    def on_doc(doc: dict) -> None:
        if "hashing" in doc:
            if not hashing:
                hashing.append(_hashing(run, host, doc["hashing"]["total"]))
            hashing[0].update(host, doc["hashing"]["done"])
        found.update(doc)

    try:  # the progress ends whatever happens (a live bar would stay drawn under the error)
        result = run.agents.shipped[host].stream_out(["build-told", run.source.path, algo], JsonLines(on_doc),
                                                      timeout=HASH_TIMEOUT_S)
    finally:
        for transfer in hashing:
            transfer.close()
    if result.exit_code != 0 or "manifest" not in found:
        raise OperationFailed(f"hashing the source on {host} failed (exit {result.exit_code}): {_last(result.stderr)}")
    return found["manifest"]


def _hash_here(run: _Run, algo: str) -> dict:
    """The local source's manifest, with progress (percent, rate, ETA): a 510 GB checkpoint reads for minutes."""
    names = agent_mod.checkpoint_files(run.local_dir) if os.path.isdir(run.local_dir) else []
    total = sum(os.path.getsize(os.path.join(run.local_dir, n)) for n in names)
    hashing = _hashing(run, HERE, total)
    try:
        return agent_mod.build(run.local_dir, algo, run.expected, on_read=lambda n: hashing.advance(HERE, n))
    finally:
        hashing.close()


def _hashing(run: _Run, where: str, total: int | None) -> Transfer:
    """The source's bytes read and hashed, told to the run's reporter like a transfer (``hashed``)."""
    return Transfer(run.out.reporter if run.out is not None else None, {where: total or None},
                    every=run.options.progress_every, verb="hashed")


COPY = "copy"  # each receiver's one step: its copy checked (look), what differs sent (act)


@dataclass
class HostCopy:
    """One receiver's step context: the sync, its row of the document, whether its agent answered, its
    connection, and what its look found."""

    run: _Run
    report: HostReport
    manifest: dict
    conn: object = None
    plan: HostPlan | None = None

    @property
    def name(self) -> str:
        return self.report.name


def look_copy(hc: HostCopy) -> Look:
    """The host's copy checked against the source's manifest: complete, refused (no room, ...), or what it needs."""
    plan = hc.plan = _check_one(hc.run, hc.conn, hc.manifest)
    hc.run.say(plan_line(plan))
    hc.report.to_send = plan.bytes_to_send
    if plan.refused:
        hc.report.status, hc.report.error = "failed", plan.refused
        raise StepFailed(plan.refused)
    if plan.unchanged:
        hc.report.status, hc.report.error = "unchanged", None
        return Look(False, "has every file, verified")
    hc.report.status = "planned"  # a dry run's word; the act says how it ended
    return Look(True, plan_line(plan).strip().removeprefix(hc.name).strip())


def act_copy(hc: HostCopy, look: Look) -> tuple[str, str]:
    """The host's end in the send rounds (run in the verb's thread, ``_Sends.rounds``): what they did for it."""
    hc.run.sends.wait(hc.name)
    report = hc.report
    if report.status != "synced":
        raise StepFailed(report.error or "not sent")
    resumed = f", resumed after {human(report.resumed_bytes)}" if report.resumed_bytes else ""
    return CHANGED, f"sent {report.files_sent} file(s), {human(report.bytes_sent)}{resumed}; verified"


class _Sends:
    """The sends of one sync. The source streams to every host whose look said send at once (read
    once, teed: ``agent.send_all``), in rounds that run in the verb's own thread while the hosts' acts
    wait (so Ctrl-C stops the send at once, and the senders with it); each act waits only for its own
    host to be decided. A host whose stream failed is checked again and sent to in the next round
    (``retries``)."""

    def __init__(self, run: _Run, manifest: dict, algo: str):
        self.run, self.manifest, self.algo = run, manifest, algo
        self.plans: dict[str, HostPlan] = {}  # the hosts to send to, from their looks
        self.decisions = HostDecisions([h.name for h in run.receivers])  # each act waits for its host's
        self._error: str | None = None  # why the rounds stopped before deciding every host

    def rounds(self) -> None:
        """Every round (the acts' ``alongside``). A failure no host's row holds is kept for the acts still
        waiting; an interrupt is kept too and raised on (the command ends with it)."""
        try:
            self._rounds()
        except Exception as err:
            self._error = f"the send failed: {' '.join(str(err).split()) or type(err).__name__}"
        except BaseException as err:
            self._error = "stopped: interrupted" if isinstance(err, KeyboardInterrupt) else f"stopped: {type(err).__name__}"
            raise

    def wait(self, name: str) -> None:
        """Until a round decided ``name`` (or the rounds ended); fails as they did if none decided it."""
        if not self.decisions.wait(name) and self._error is not None:
            raise StepFailed(self._error)

    def _rounds(self) -> None:
        run, plans = self.run, dict(self.plans)
        for attempt in range(run.options.retries + 1):
            if not plans:
                return
            sending = list(plans)
            failed = self._round(list(plans.values()))
            if not failed or attempt == run.options.retries:
                self.decisions.decide(sending)
                return
            self.decisions.decide([n for n in sending if n not in failed])
            run.say(f"checking again and retrying {', '.join(failed)}")
            plans = self._again([h for h in run.receivers if h.name in failed])
            self.decisions.decide([n for n in failed if n not in plans])  # refused, verified after all, or unreachable

    def _round(self, sending: list[HostPlan]) -> list[str]:
        """One send to ``sending``; each host's row updated; the hosts whose stream failed."""
        results = _send_round(self.run, sending, self.manifest, self.algo)
        failed = []
        for plan in sending:
            report, result = self.run.reports[plan.name], results[plan.name]
            arrived = [line for line in result.get("files", []) if line.get("ok") and "file" in line]
            report.files_sent += len(arrived)
            report.bytes_sent += int(result.get("bytes_sent") or 0)
            report.seconds += float(result.get("seconds") or 0)
            report.resumed_bytes += sum(int(line.get("resumed_from") or 0) for line in arrived)
            report.status, report.error = ("synced", None) if result["ok"] else ("failed", result["error"])
            if not result["ok"]:
                failed.append(plan.name)
        return failed

    def _again(self, hosts: list) -> dict[str, HostPlan]:
        """The failed hosts' agents shipped again and their copies checked again: what the next round sends."""
        plans = {}
        for name, plan in _check_all(self.run, _ship_again(self.run, hosts), self.manifest).items():
            self.run.say(plan_line(plan))
            report = self.run.reports[name]
            if plan.refused:
                report.status, report.error = "failed", plan.refused
            elif plan.unchanged:  # the last round got it there after all
                report.status, report.error = "synced", None
            else:
                plans[name] = plan
        return plans


def _copy_steps(run: _Run, live: list, manifest: dict, algo: str) -> None:
    """Each receiver's ``copy`` step: every look at once; with ``dry_run`` that is all, else every host
    that needs files acts (one send for all of them), a refused or unreachable host failing alone."""
    run.sends = _Sends(run, manifest, algo)
    copies = {h.name: HostCopy(run, run.reports[h.name], manifest) for h in run.receivers}
    reporter = run.out.reporter if run.out is not None else Reporter()
    steps = HostSteps([Step(COPY, look_copy, act_copy)], copies, {n: run.targets[n] for n in copies}, reporter,
                      pool=run.pool)
    names = [h.name for h in live]
    for name, copy in copies.items():
        if name not in names:  # its agent could not be copied there (the row says why)
            steps.fail(name, (copy.report.error or "the sync agent could not be copied there").removeprefix(f"{name}: "))
    steps.look(names)
    _settle(copies, steps)
    if run.options.dry_run:
        return
    steps.end_failed()
    run.sends.plans = {n: c.plan for n, c in copies.items() if steps.status(n, COPY)[0] == PLANNED}
    # The acts reach no host: each reads what the rounds (here, in this thread) did for its host, so a
    # host the rounds synced is not failed for a connection its act never needed.
    steps.pool = None
    steps.act([n for n in names if n not in steps.failed()], alongside=run.sends.rounds, release=run.sends.decisions.release)
    _settle(copies, steps)


def _settle(copies: dict[str, HostCopy], steps: HostSteps) -> None:
    """A step that failed without saying so in its row (a connection lost) fails the row."""
    for name, copy in copies.items():
        status, reason = steps.status(name, COPY)
        if status == FAILED and copy.report.status != "failed":
            copy.report.status = "failed"
            copy.report.error = reason if reason.startswith(f"{name}:") else f"{name}: {reason}"


def _ship_again(run: _Run, hosts: list) -> list:
    """A receiver whose stream ended early removed the folder it was shipped to (its sender may have
    been a killed sparkctl): the retry ships it again. The hosts that have it again; a host that
    cannot take it fails with that reason (not with what running the missing agent would print)."""
    from sparkctl.remote.pool import fan_out

    shipped = []
    for host, result in zip(hosts, fan_out([run.targets[h.name] for h in hosts], run.agents.install, pool=run.pool)):
        if result.ok:
            shipped.append(host)
            continue
        cause = result.error.removeprefix(f"{host.name}: ")
        report = run.reports[host.name]
        first = f"the transfer failed ({report.error}) and " if report.error else ""
        report.status, report.error = "failed", f"{first}could not copy the sync agent to {host.name} again for the retry: {cause}"
    return shipped


def _read_index(run: _Run, manifest: dict) -> str:
    if INDEX_NAME not in manifest["files"]:
        raise ConfigError(f"the source has no {INDEX_NAME}: cannot tell which files hold only Engram tables",
                          field="--without-engram-tables")
    if run.source_host is None:
        from sparkctl.fileio import read_named_file

        return read_named_file(os.path.join(run.local_dir, INDEX_NAME), field="--source", max_bytes=64 * 2**20)
    result = run.pool.get(run.targets[run.source_host.name]).run(read_file_argv(f"{run.source.path}/{INDEX_NAME}"), timeout=60)
    if result.exit_code != 0:
        raise OperationFailed(f"{run.source_host.name}: cannot read {INDEX_NAME}: {_last(result.stderr)}")
    return result.stdout


def _check_timeout(manifest: dict) -> float:
    return 600 + sum(e["size"] for e in manifest["files"].values()) / HASH_FLOOR_BYTES_S


def _check_one(run: _Run, connection, manifest: dict) -> HostPlan:
    """The host's copy checked by its agent (size, then content) against ``manifest``: its plan."""
    found = run.agents.json(connection, ["check", run.model_dir], stdin=json.dumps(manifest).encode(),
                            timeout=_check_timeout(manifest))
    return plan_host(connection.name, manifest, found)


def _check_all(run: _Run, hosts: list, manifest: dict) -> dict[str, HostPlan]:
    """``_check_one`` on every host at once (a retry's); a host that cannot be checked fails its row."""
    from sparkctl.remote.pool import fan_out

    plans = {}
    for result in fan_out([run.targets[h.name] for h in hosts], lambda c: _check_one(run, c, manifest), pool=run.pool):
        if not result.ok:
            run.reports[result.name].status, run.reports[result.name].error = "failed", result.error
            continue
        plans[result.name] = result.value
    return plans


def plan_line(plan: HostPlan) -> str:
    """A host's plan in one line: refused (why), complete, or what it needs and the room it has."""
    if plan.refused:
        return f"  {plan.name:<12} refused: {plan.refused}"
    if plan.unchanged:
        return f"  {plan.name:<12} has every file, verified"
    counts: dict[str, int] = {}
    for item in plan.send:
        counts[plan.states[item["file"]]] = counts.get(plan.states[item["file"]], 0) + 1
    detail = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "only the manifest"
    resumed = f", resuming {human(plan.resumed_bytes)} already there" if plan.resumed_bytes else ""
    return (f"  {plan.name:<12} needs {len(plan.send)} file(s) ({detail}), {human(plan.bytes_to_send)}{resumed}; "
            f"{human(plan.free)} free")


def _receiver_argv(run: _Run, name: str, routes: dict) -> tuple[list[str], str]:
    """How the sender reaches ``name``'s ``agent receive``: the argv and the address it connects to."""
    host = next(h for h in run.inventory.hosts if h.name == name)
    receive = run.agents.shipped[name].argv(["receive", run.model_dir])
    if run.source_host is None:  # this machine sends: the fabric address when it answers here (as distribute)
        return client_argv(routes[name], receive), routes[name].address
    # The source host sends, over the fabric, with only the host keys this machine verified (as distribute --from).
    return peer_argv(host, run.targets[name], name, receive), host.fabric_address


def _routes(run: _Run, plans: list[HostPlan]) -> dict:
    """This machine's route to every receiver, all probed at once (none needed with --from)."""
    if run.source_host is not None:
        return {}
    hosts = {h.name: h for h in run.inventory.hosts}
    return choose_routes([(p.name, run.targets[p.name], hosts[p.name].fabric_addresses) for p in plans])


def _send_round(run: _Run, plans: list[HostPlan], manifest: dict, algo: str) -> dict[str, dict]:
    progress = Transfer(run.out.reporter if run.out is not None else None, {p.name: p.bytes_to_send for p in plans},
                        every=run.options.progress_every)
    spec = {"algo": algo, "manifest": manifest, "bwlimit": run.options.bwlimit, "targets": []}
    routes = _routes(run, plans)
    for plan in plans:
        argv, where = _receiver_argv(run, plan.name, routes)
        spec["targets"].append({"name": plan.name, "argv": argv, "where": where, "files": plan.send})
    done: dict = {}

    def on_doc(doc: dict) -> None:
        for name, sent in (doc.get("progress") or {}).items():
            progress.update(name, sent)
        if "done" in doc:
            done.update(doc["done"])

    failure = "no result from the sender"
    if run.source_host is None:
        spec["root"] = run.local_dir
        agent_mod.send_all(spec, on_doc)
    else:
        spec["root"] = run.source.path
        spec["known_hosts"] = known_hosts_lines({p.name: run.pool.get(run.targets[p.name]).server_key() for p in plans})
        sender = run.source_host.name
        agent = run.agents.shipped[sender]
        try:
            spec_file = agent.put_beside("spec.json", json.dumps(spec).encode())
            result = agent.stream_out(["send", spec_file], JsonLines(on_doc))
            failure = f"the sender on {sender} stopped (exit {result.exit_code}): {_last(result.stderr)}"
        except (RemoteError, OperationFailed) as err:
            failure = f"the sender on {sender} could not run: {err}"
    progress.close()
    return {p.name: done.get(p.name) or {"ok": False, "error": failure, "files": [], "bytes_sent": 0} for p in plans}


def format_report(report: SyncReport) -> str:
    synced = sum(1 for h in report.hosts if h.status == "synced")
    lines = [f"{report.source}{' (dry run)' if report.dry_run else ''}: {report.files} files, {human(report.total_bytes)} "
             f"per host ({report.algo}); {human(sum(h.bytes_sent for h in report.hosts))} sent to {synced} host(s) "
             f"in {report.seconds:.1f}s"]
    if report.left_out:
        saved = sum(v for v in report.left_out.values() if v)
        lines.append(f"  left out on every host: {', '.join(report.left_out)} ({human(saved)})")
    width = max([len(h.name) for h in report.hosts] + [4])
    for host in report.hosts:
        extra = f"  resumed after {human(host.resumed_bytes)}" if host.resumed_bytes else ""
        if report.dry_run and host.status == "planned":
            extra = f"  would send {human(host.to_send)}"
        lines.append(f"  {host.name:<{width}}  {host.status:<9} {host.files_sent:>4} file(s) {human(host.bytes_sent):>11} "
                     f"{host.seconds:>7.1f}s{extra}" + (f"  {host.error}" if host.error else ""))
    return "\n".join(lines)
