"""``sparkctl model sync``: the checkpoint into ``paths.model_dir`` on every host, verified.

1. The source: a folder here, a folder on an inventory host (``--from HOST``), or a hub repo
   (``hf:OWNER/NAME[@REV]``), downloaded once onto this machine (sparkctl.model.hub).
2. A small agent (sparkctl.model.agent, standard library only) is copied to every host involved,
   the way ``distribute --from`` copies its relay (the same zip builder).
3. The source's manifest: every file's size and fast hash (xxh3-128 when every party has
   ``xxhash``, else sha256); from the hub, each LFS file's sha256 is checked against the hub's too.
4. Every host checks its copy against it, all at once (size, then content); the plan (pure,
   sparkctl.model.plan) sends only the files that are missing or differ, continues a part file
   left by an interrupted transfer, and refuses a host whose filesystem cannot hold what it lacks.
5. The source streams to every host at once (from ``--from HOST`` itself, over the fabric, with that
   host's ssh and only the host keys this machine verified); each host writes ``NAME.sparkctl-part``,
   renames it once the whole file hashes right, and keeps the manifest last. A host whose stream
   failed is checked and tried again (``retries``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from sparkctl.errors import ConfigError, OperationFailed
from sparkctl.model import agent as agent_mod
from sparkctl.model.plan import (INDEX_NAME, HostPlan, Source, engram_table_files, human, parse_source, plan_host,
                                 weight_map_of, without)

AGENT_MODULES = ("sparkctl.model.agent",)
# Hashing a host's copy is bounded: 10 minutes plus the time to read it at 50 MB/s (an NVMe reads
# 510 GB at several GB/s; eight hashing threads do over 1 GB/s), so a hung host fails, a slow one not.
HASH_FLOOR_BYTES_S = 50e6
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
    """The agent copied into a temporary folder on each host (removed by ``cleanup``)."""

    def __init__(self, pool):
        self.pool = pool
        self.paths: dict[str, str] = {}
        self._zip = agent_zip()
        self._lock = threading.Lock()

    def install(self, connection) -> str:
        made = connection.run(["mktemp", "-d", "/tmp/sparkctl-model.XXXXXX"], timeout=60)
        if made.exit_code != 0:
            raise OperationFailed(f"mktemp failed: {_last(made.stderr)}")
        path = made.stdout.strip() + "/agent.pyz"
        with self._lock:
            self.paths[connection.name] = path
        shipped = connection.run(["sh", "-c", 'cat > "$1"', "sh", path], stdin=self._zip, timeout=120)
        if shipped.exit_code != 0:
            raise OperationFailed(f"could not write {path}: {_last(shipped.stderr)}")
        return path

    def json(self, connection, args: list[str], stdin: bytes | None = None, timeout: float | None = None) -> dict:
        """Run the agent on ``connection``'s host and read its one JSON line."""
        result = connection.run(["python3", self.paths[connection.name], *args], stdin=stdin, timeout=timeout)
        if result.exit_code == 127:
            raise OperationFailed("python3 is needed on the host for model sync")
        if result.exit_code != 0:
            raise OperationFailed(f"agent {args[0]} failed (exit {result.exit_code}): {_last(result.stderr)}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def cleanup(self, targets: dict) -> None:
        from sparkctl.remote.result import RemoteError

        for name, path in self.paths.items():
            try:
                self.pool.get(targets[name]).run(["rm", "-rf", "--", os.path.dirname(path)], timeout=30)
            except (RemoteError, OSError):
                pass


def _say(out, message: str) -> None:
    """A line on stderr as it is (no wrapping, no markup: file names may hold brackets)."""
    out.console.print(message, soft_wrap=True, markup=False, highlight=False)


def _last(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class _JsonLines:
    """Cuts a remote program's stdout into JSON documents as they arrive."""

    def __init__(self, on_doc: Callable[[dict], None]):
        self.on_doc, self.pending = on_doc, b""

    def __call__(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            if line.strip():
                self.on_doc(json.loads(line))


class _Progress:
    """Bytes per host and in total, a line on stderr every few seconds."""

    def __init__(self, out, totals: dict[str, int], every: float):
        self.out, self.totals, self.every = out, totals, every
        self.sent = {name: 0 for name in totals}
        self.started = self._last = time.monotonic()
        self._printed: dict | None = None

    def update(self, sent: dict[str, int], final: bool = False) -> None:
        self.sent.update({k: v for k, v in sent.items() if k in self.sent})
        now = time.monotonic()
        if self.out is None or (not final and now - self._last < self.every) or self.sent == self._printed:
            return
        self._last, self._printed = now, dict(self.sent)
        elapsed = max(now - self.started, 1e-6)
        parts = [f"{n} {human(b)}/{human(self.totals[n])}" for n, b in self.sent.items()]
        total = sum(self.sent.values())
        _say(self.out, f"  sent {human(total)} of {human(sum(self.totals.values()))} "
                       f"({human(total / elapsed)}/s): " + ", ".join(parts))


# ---------------------------------------------------------------------------------------------- steps


def _select(inventory, options: SyncOptions):
    by_name = {h.name: h for h in inventory.hosts}
    source_host = None
    if options.from_host is not None:
        source_host = by_name.get(options.from_host)
        if source_host is None:
            raise ConfigError(f"unknown host {options.from_host!r} (inventory has: {', '.join(by_name)})", field="--from")
    if options.hosts:
        unknown = [n for n in options.hosts if n not in by_name]
        if unknown:
            raise ConfigError(f"unknown host {unknown[0]!r} (inventory has: {', '.join(by_name)})", field="--hosts")
        chosen = [by_name[n] for n in dict.fromkeys(options.hosts)]
    else:
        chosen = list(inventory.hosts)
    return chosen, source_host


def _check_engram_option(options: SyncOptions) -> None:
    if not options.without_engram_tables:
        return
    if options.engram_mode is None:
        raise ConfigError("needs --profile (only a profile with engram.mode=disk may leave the tables out)",
                          field="--without-engram-tables")
    if options.engram_mode != "disk" or options.engine != "vllm":
        raise ConfigError(f"the profile reads the Engram tables from the checkpoint (engine {options.engine}, "
                          f"engram.mode={options.engram_mode}); only vLLM with engram.mode=disk skips them on load",
                          field="--without-engram-tables")


def default_download_dir(repo: str) -> str:
    base = os.environ.get("SPARKCTL_MODEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sparkctl", "models")
    return os.path.join(base, repo.replace("/", "--"))


def run_sync(inventory, options: SyncOptions, out=None) -> SyncReport:
    from sparkctl.remote.pool import ConnectionPool, fan_out

    started = time.monotonic()
    _check_engram_option(options)
    source = parse_source(options.source)
    if source.kind == "hub" and options.dry_run:
        raise ConfigError("a hub source is planned after its download: run without --dry-run, or sync the downloaded folder",
                          field="--dry-run")
    if options.download_only and source.kind != "hub":
        raise ConfigError("is for a hub source (hf:OWNER/NAME)", field="--download-only")
    if source.kind == "hub" and options.from_host:
        raise ConfigError("a hub source is downloaded onto this machine; --from names a host holding a folder", field="--from")
    chosen, source_host = _select(inventory, options)
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
    reports = {h.name: HostReport(h.name) for h in receivers}
    say = (lambda message: _say(out, message)) if out is not None else (lambda message: None)

    expected = None
    local_dir = None
    if source.kind == "hub":
        from sparkctl.model import hub

        files = hub.hub_files(source.repo, source.revision)
        local_dir = os.path.abspath(options.download_dir or default_download_dir(source.repo))
        say(f"hf:{source.repo} at {files.commit[:12]}: {len(files.sizes)} files, {human(sum(files.sizes.values()))}; "
            f"downloading into {local_dir} (resumes what is there)")
        hub.download(source.repo, files, local_dir)
        expected = files.sha256
        if options.download_only:
            return _verify_download(source, local_dir, expected, say, started)
    elif source_host is None:
        local_dir = os.path.abspath(source.path)
        if not os.path.isdir(local_dir):
            raise ConfigError(f"no such folder on this machine: {local_dir}", field="--source")

    with ConnectionPool(connect_timeout=options.connect_timeout, accept_new_host_keys=options.accept_new_host_keys) as pool:
        agents = Agents(pool)
        try:
            return _sync(inventory, options, source, source_host, local_dir, expected, model_dir, receivers, targets,
                         reports, pool, fan_out, agents, say, out, started)
        finally:
            agents.cleanup(targets)


def _verify_download(source: Source, local_dir: str, expected: dict, say, started: float) -> SyncReport:
    """Hash the download against the hub's sha256 and keep the manifest with it."""
    say(f"verifying {local_dir} against the hub's sha256")
    manifest = agent_mod.build(local_dir, "sha256", expected)
    problems = manifest.pop("problems")
    if problems:
        raise OperationFailed(f"the download differs from the hub: {'; '.join(problems[:3])}")
    manifest["source"] = str(source)
    agent_mod.write_atomic(os.path.join(local_dir, agent_mod.MANIFEST_NAME), json.dumps(manifest, indent=1).encode())
    return SyncReport(source=str(source), hosts=[], algo="sha256", files=len(manifest["files"]),
                      total_bytes=sum(e["size"] for e in manifest["files"].values()), seconds=time.monotonic() - started)


def _sync(inventory, options, source, source_host, local_dir, expected, model_dir, receivers, targets, reports, pool,
          fan_out, agents, say, out, started) -> SyncReport:
    # The agent on every host involved, and what each can hash with.
    involved = list(dict.fromkeys([h.name for h in receivers] + ([source_host.name] if source_host else [])))
    installed = fan_out([targets[name] for name in involved],
                        lambda c: (agents.install(c), agents.json(c, ["probe", model_dir], timeout=60))[1], pool=pool)
    probes = {}
    for result in installed:
        if result.ok:
            probes[result.name] = result.value
        elif source_host is not None and result.name == source_host.name:
            raise OperationFailed(f"{source_host.name} (--from): {result.error}")
        else:
            reports[result.name].error = result.error
    if source_host is not None:
        source_xxhash = probes[source_host.name]["has_xxhash"]
    else:
        source_xxhash = agent_mod.has_xxhash()
    live = [h for h in receivers if h.name in probes]
    algo = "xxh3_128" if source_xxhash and all(probes[h.name]["has_xxhash"] for h in live) else "sha256"

    # The source's manifest (every file read once).
    where = f"{source_host.name}:{source.path}" if source_host is not None else local_dir
    say(f"hashing the source {where} ({algo})")
    if source_host is not None:
        head = pool.get(targets[source_host.name])
        manifest = agents.json(head, ["build", source.path, algo], stdin=b"null", timeout=HASH_TIMEOUT_S)
    else:
        manifest = agent_mod.build(local_dir, algo, expected)
    if manifest["problems"]:
        raise OperationFailed(f"the source differs from the hub: {'; '.join(manifest['problems'][:3])}")
    del manifest["problems"]
    manifest["source"] = str(source)
    if not manifest["files"]:
        raise OperationFailed(f"the source {where} holds no files")
    left_out: dict[str, int] = {}
    host_manifest = manifest
    if options.without_engram_tables:
        index = _read_index(source_host, source.path if source_host else local_dir, pool, targets, manifest)
        skip = engram_table_files(weight_map_of(index, f"{where}/{INDEX_NAME}"))
        host_manifest = without(manifest, skip)
        left_out = host_manifest.get("left_out", {})
        say(f"leaving out the Engram table files (engram.mode=disk, patched loader): {', '.join(skip) or 'none found'}; "
            f"{human(sum(left_out.values()))} less per host")
    total = sum(e["size"] for e in host_manifest["files"].values())
    say(f"{len(host_manifest['files'])} files, {human(total)} per host")

    pending = list(live)
    for attempt in range(options.retries + 1):
        if not pending:
            break
        plans = _check_all(pending, host_manifest, model_dir, targets, reports, agents, pool, fan_out)
        for name, plan in plans.items():
            _say_plan(say, plan, attempt)
        if options.dry_run:
            for name, plan in plans.items():
                reports[name].status = "failed" if plan.refused else ("unchanged" if plan.unchanged else "planned")
                reports[name].error = plan.refused
                reports[name].to_send = plan.bytes_to_send
            break
        sending = []
        for name, plan in plans.items():
            report = reports[name]
            if plan.refused:
                report.status, report.error = "failed", plan.refused
            elif plan.unchanged:
                report.status = "unchanged" if attempt == 0 else "synced"
                report.error = None
            else:
                sending.append(plan)
        if not sending:
            break
        results = _send_round(sending, host_manifest, algo, model_dir, source_host, local_dir, source, inventory,
                              targets, pool, agents, options, out)
        pending = []
        for plan in sending:
            report, result = reports[plan.name], results[plan.name]
            ok_lines = [line for line in result.get("files", []) if line.get("ok") and "file" in line]
            report.files_sent += len(ok_lines)
            report.bytes_sent += int(result.get("bytes_sent") or 0)
            report.seconds += float(result.get("seconds") or 0)
            report.resumed_bytes += sum(int(line.get("resumed_from") or 0) for line in ok_lines)
            if result["ok"]:
                report.status, report.error = "synced", None
            else:
                report.status, report.error = "failed", result["error"]
                pending.append(next(h for h in live if h.name == plan.name))
        if pending and attempt < options.retries:
            say(f"checking again and retrying {', '.join(h.name for h in pending)}")
    return SyncReport(source=str(source), hosts=[reports[h.name] for h in receivers], algo=algo,
                      files=len(host_manifest["files"]), total_bytes=total, left_out=left_out, dry_run=options.dry_run,
                      seconds=time.monotonic() - started)


def _read_index(source_host, folder, pool, targets, manifest) -> str:
    if INDEX_NAME not in manifest["files"]:
        raise ConfigError(f"the source has no {INDEX_NAME}: cannot tell which files hold only Engram tables",
                          field="--without-engram-tables")
    if source_host is None:
        with open(os.path.join(folder, INDEX_NAME), encoding="utf-8") as handle:
            return handle.read()
    result = pool.get(targets[source_host.name]).run(["cat", "--", f"{folder}/{INDEX_NAME}"], timeout=60)
    if result.exit_code != 0:
        raise OperationFailed(f"{source_host.name}: cannot read {INDEX_NAME}: {_last(result.stderr)}")
    return result.stdout


def _check_all(hosts, manifest, model_dir, targets, reports, agents, pool, fan_out) -> dict[str, HostPlan]:
    doc = json.dumps(manifest).encode()
    total = sum(e["size"] for e in manifest["files"].values())
    timeout = 600 + total / HASH_FLOOR_BYTES_S
    checked = fan_out([targets[h.name] for h in hosts],
                      lambda c: agents.json(c, ["check", model_dir], stdin=doc, timeout=timeout),
                      pool=pool)
    plans = {}
    for result in checked:
        if not result.ok:
            reports[result.name].status, reports[result.name].error = "failed", result.error
            continue
        plans[result.name] = plan_host(result.name, manifest, result.value)
    return plans


def _say_plan(say, plan: HostPlan, attempt: int) -> None:
    if plan.refused:
        say(f"  {plan.name:<12} refused: {plan.refused}")
        return
    if plan.unchanged:
        say(f"  {plan.name:<12} has every file, verified")
        return
    counts: dict[str, int] = {}
    for item in plan.send:
        counts[plan.states[item["file"]]] = counts.get(plan.states[item["file"]], 0) + 1
    detail = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "only the manifest"
    resumed = f", resuming {human(plan.resumed_bytes)} already there" if plan.resumed_bytes else ""
    say(f"  {plan.name:<12} needs {len(plan.send)} file(s) ({detail}), {human(plan.bytes_to_send)}{resumed}; "
        f"{human(plan.free)} free")


def _send_round(plans, manifest, algo, model_dir, source_host, local_dir, source, inventory, targets, pool, agents,
                options, out) -> dict[str, dict]:
    from sparkctl.remote.connection import join_argv

    progress = _Progress(out, {p.name: p.bytes_to_send for p in plans}, options.progress_every)
    hosts = {h.name: h for h in inventory.hosts}
    spec = {"algo": algo, "manifest": manifest, "bwlimit": options.bwlimit, "targets": []}
    for plan in plans:
        receive = ["python3", agents.paths[plan.name], "receive", model_dir]
        if source_host is None:
            from sparkctl.ops.distribute import choose_route, openssh_argv

            route = choose_route(plan.name, targets[plan.name], hosts[plan.name].fabric_addresses, "openssh")
            argv, where = openssh_argv(route, receive), route.address
        else:
            from sparkctl.commands.bulk_ssh import peer_ssh_options

            argv = ["ssh", "-o", "UserKnownHostsFile={known_hosts}",
                    *peer_ssh_options(hosts[plan.name], targets[plan.name], alias=plan.name), join_argv(receive)]
            where = hosts[plan.name].fabric_address
        spec["targets"].append({"name": plan.name, "argv": argv, "where": where, "files": plan.send})
    done: dict = {}

    def on_doc(doc: dict) -> None:
        if "progress" in doc:
            progress.update(doc["progress"])
        if "done" in doc:
            done.update(doc["done"])

    if source_host is None:
        spec["root"] = local_dir
        agent_mod.send_all(spec, on_doc)
    else:
        from sparkctl.remote.result import RemoteError

        spec["root"] = source.path
        keys = {p.name: pool.get(targets[p.name]).server_key() for p in plans}
        spec["known_hosts"] = "".join(f"{n} {k.get_name()} {k.get_base64()}\n" for n, k in keys.items())
        head = pool.get(targets[source_host.name])
        try:
            result = head.run_stream_out(["python3", agents.paths[source_host.name], "send", json.dumps(spec)],
                                         _JsonLines(on_doc))
            failure = None if done else f"the sender on {source_host.name} stopped (exit {result.exit_code}): {_last(result.stderr)}"
        except RemoteError as err:
            failure = f"the sender on {source_host.name} could not run: {err}"
        if failure:
            return {p.name: done.get(p.name) or {"ok": False, "error": failure, "files": [], "bytes_sent": 0}
                    for p in plans}
    progress.update({}, final=True)
    return {p.name: done.get(p.name) or {"ok": False, "error": "no result from the sender", "files": []} for p in plans}


def format_report(report: SyncReport) -> str:
    synced = sum(1 for h in report.hosts if h.status == "synced")
    lines = [f"{report.source}{' (dry run)' if report.dry_run else ''}: {report.files} files, {human(report.total_bytes)} "
             f"per host ({report.algo}); {human(sum(h.bytes_sent for h in report.hosts))} sent to {synced} host(s) "
             f"in {report.seconds:.1f}s"]
    if report.left_out:
        lines.append(f"  left out on every host: {', '.join(report.left_out)} ({human(sum(report.left_out.values()))})")
    width = max([len(h.name) for h in report.hosts] + [4])
    for host in report.hosts:
        extra = f"  resumed after {human(host.resumed_bytes)}" if host.resumed_bytes else ""
        if report.dry_run and host.status == "planned":
            extra = f"  would send {human(host.to_send)}"
        lines.append(f"  {host.name:<{width}}  {host.status:<9} {host.files_sent:>4} file(s) {human(host.bytes_sent):>11} "
                     f"{host.seconds:>7.1f}s{extra}" + (f"  {host.error}" if host.error else ""))
    return "\n".join(lines)
