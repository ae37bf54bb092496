"""``sparkctl distribute`` (alias ``share``): get one image onto every host that lacks it, fast.

1. Facts, from every host at once: its engine's storage driver and every image it has (ID, tags,
   RepoDigests, layer diff IDs), so we know the layer chains it already holds.
2. Plan (pure, ``plan_host``): skip a host that has the image (by ID or a shared RepoDigest; it is
   re-tagged if needed); otherwise send it a thin archive (the layers it lacks) when its engine
   is a graph-driver one, or the full archive (containerd image store, or nothing in common).
3. One ``docker save`` -- on this machine's engine, or ``--from HOST``'s -- is read once and streamed
   to all those hosts' ``docker load`` at the same time (sparkctl.images.fanout: per-host bounded
   queues; a host that falls behind is detached and retried alone with its own read). With
   ``--from HOST`` that host does this itself (sparkctl.images.relay), so the bytes go host to host.
4. Every loaded host's image ID is checked against the source's; a failed host is retried
   (``--retries``) with fresh facts and its own read.

Each host's part is its ``load`` step, run by the one runner (sparkctl.ops.steps) and told to the
run's reporter: its look is its plan (2), its act waits for that host's end in the shared stream
(3, 4): ``ok`` (it has the image), ``skipped`` (the source), ``changed`` or ``failed`` in one line.

The bulk stream goes over the system OpenSSH client when it is installed (it measured faster than
paramiko's channel here, see bench/distribute_transport.py), else paramiko; commands stay on
paramiko (sparkctl.remote). OpenSSH gets argv lists only, the inventory's identity and known_hosts,
and StrictHostKeyChecking=yes. It connects to a host's fabric address when this machine can reach
it (HostKeyAlias keeps the key check on the management name), else to the management address.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from sparkctl.commands import facts as F
from sparkctl.commands.docker import FREE_MARK, IMAGES_MARK, LOAD_ARGV, image_store_argv, save_argv, tag_argv
from sparkctl.errors import ConfigError, OperationFailed
from sparkctl.images.engine import DockerPyEngine
from sparkctl.images.fanout import DEFAULT_QUEUE_BYTES, SendResult, Sink, StreamAborted, stream_to_all
from sparkctl.images.inputs import chain_ids
from sparkctl.images.pipe import Rate
from sparkctl.images.relay import relay_zip
from sparkctl.ops.ask import ask
from sparkctl.ops.host_steps import HostDecisions, HostSteps
from sparkctl.ops.steps import CHANGED, OK, Look, Step, StepFailed
from sparkctl.transfer import Transfer
from sparkctl.remote.connection import Connection
from sparkctl.remote.jsonlines import JsonLines
from sparkctl.remote.openssh import (BULK_SSH_OPTIONS, Route, choose_route, client_argv,  # noqa: F401
                                     known_hosts_lines, peer_argv, reachable)
from sparkctl.remote.pool import fan_out, run_pool
from sparkctl.remote.process import over_openssh
from sparkctl.remote.result import RemoteError
from sparkctl.remote.transport import last_line, ship_agent

CHUNK = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Facts


@dataclass(frozen=True)
class ImageEntry:
    id: str
    tags: tuple[str, ...] = ()
    digests: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()


@dataclass
class ImageStore:
    """A host's Docker engine and the images it holds (what ``distribute`` plans each host's send from).
    Read through the fact runner (``IMAGE_STORE``), fresh each round: a send changes it."""

    name: str
    driver: str
    containerd_store: bool
    server_version: str
    images: list[ImageEntry] = field(default_factory=list)
    free_bytes: int | None = None  # free space where the engine keeps its layers (None: unknown)

    def tagged(self, tag: str) -> ImageEntry | None:
        return next((image for image in self.images if tag in image.tags), None)

    def by_id(self, image_id: str) -> ImageEntry | None:
        return next((image for image in self.images if image.id == image_id), None)

    def chain_ids(self) -> set[str]:
        out: set[str] = set()
        for image in self.images:
            out.update(chain_ids(list(image.layers)))
        return out


@dataclass(frozen=True)
class SourceImage:
    tag: str
    id: str
    layers: tuple[str, ...]
    digests: tuple[str, ...] = ()
    size: int = 0
    where: str = "local"


def is_containerd_store(info: dict) -> bool:
    """Docker's containerd image store (snapshotters) keeps no graph-driver layer store: thin loads fail."""
    for pair in info.get("DriverStatus") or []:
        if len(pair) == 2 and pair[0] == "driver-type" and "containerd" in str(pair[1]):
            return True
    return "containerd" in str(info.get("Driver", "")).lower()


def parse_facts(name: str, stdout: str) -> ImageStore:
    head, sep, rest = stdout.partition(IMAGES_MARK)
    if not sep:
        raise ValueError("unexpected output from docker (no image listing)")
    free_bytes = None
    info_lines = []
    for line in head.strip().splitlines():
        if line.startswith(FREE_MARK):
            value = line[len(FREE_MARK):].strip()
            free_bytes = int(value) * 1024 if value.isdigit() and value.isascii() else None
        else:
            info_lines.append(line)
    info = json.loads("\n".join(info_lines))
    images = []
    for line in rest.splitlines():
        line = line.strip()
        if not line:
            continue
        data = json.loads(line)
        images.append(ImageEntry(data["id"], tuple(data.get("tags") or ()), tuple(data.get("digests") or ()),
                                 tuple(data.get("layers") or ())))
    return ImageStore(name=name, driver=str(info.get("Driver", "")), containerd_store=is_containerd_store(info),
                     server_version=str(info.get("ServerVersion", "")), images=images, free_bytes=free_bytes)


# docker info, the free space where it keeps layers, and every image with its layers (one command)
IMAGE_STORE = F.Fact("read the Docker engine and its images", image_store_argv, lambda stdout: parse_facts("", stdout))


def gather_facts(connection) -> ImageStore:
    return replace(ask(connection, IMAGE_STORE, timeout=120, fresh=True), name=connection.name)


# ---------------------------------------------------------------------------------------------
# Plan (pure)


@dataclass
class HostPlan:
    name: str
    action: str  # "skip" or "send"
    mode: str  # "none", "full" or "thin"
    reason: str
    present: frozenset[str] = frozenset()  # chain IDs whose layer tars are left out
    retag: str | None = None  # skip: tag this image ID with the tag
    layers_present: int = 0
    layers_total: int = 0


def plan_host(source: SourceImage, facts: ImageStore, *, thin: bool = True) -> HostPlan:
    tagged = facts.tagged(source.tag)
    same = facts.by_id(source.id)
    if same is not None:
        retag = None if tagged is not None and tagged.id == source.id else same.id
        return HostPlan(facts.name, "skip", "none", "has the image" + (" (re-tagged)" if retag else ""), retag=retag)
    shared = set(source.digests)
    if shared:
        twin = next((image for image in facts.images if shared & set(image.digests)), None)
        if twin is not None:
            retag = None if tagged is not None and tagged.id == twin.id else twin.id
            return HostPlan(facts.name, "skip", "none", "has the image by a shared RepoDigest", retag=retag)
    wanted = chain_ids(list(source.layers))
    have = facts.chain_ids() & set(wanted)
    total = len(wanted)
    if facts.containerd_store:
        return HostPlan(facts.name, "send", "full", "containerd image store: every layer is needed", layers_total=total)
    if not thin or not have:
        reason = "--full" if not thin else "has none of its layers"
        return HostPlan(facts.name, "send", "full", reason, layers_total=total)
    return HostPlan(facts.name, "send", "thin", f"has {len(have)} of {total} layers", present=frozenset(have),
                    layers_present=len(have), layers_total=total)


SPACE_MARGIN = 1.1  # docker load writes a little more than the layers themselves (metadata, its own temp files)


def space_problem(plan: HostPlan, facts: ImageStore, source: SourceImage) -> str | None:
    """Why ``plan`` cannot fit where the host's engine keeps its layers (None when it can, or when
    either size is unknown): checked before the stream, so a full disk is not found after it."""
    if plan.action != "send" or facts.free_bytes is None or not source.size:
        return None
    share = 1.0 if plan.mode == "full" or not plan.layers_total else 1 - plan.layers_present / plan.layers_total
    needed = int(source.size * share * SPACE_MARGIN)
    if facts.free_bytes >= needed:
        return None
    return (f"{facts.free_bytes / 1e9:.2f} GB free where docker keeps its images, the {plan.mode} load needs about "
            f"{needed / 1e9:.2f} GB: free some space (docker image prune, docker system df) and run it again")


# ---------------------------------------------------------------------------------------------
# Routes and transports for the bulk stream


class _Routes:
    """Each host's route, probed in a daemon thread (a skipped host's probe is never waited for)."""

    def __init__(self):
        self._threads: dict[str, threading.Thread] = {}
        self._found: dict[str, Route] = {}

    def probe(self, name: str, target, fabric_addresses: tuple[str, ...]) -> None:
        def run() -> None:
            self._found[name] = choose_route(name, target, fabric_addresses)

        thread = threading.Thread(target=run, name=f"sparkctl-route-{name}", daemon=True)
        self._threads[name] = thread
        thread.start()

    def get(self, name: str) -> Route:
        self._threads[name].join()
        return self._found[name]


class BulkStreams:
    """``docker load`` / ``docker save`` streams to and from hosts, each over a transport of its own
    (aborting one leaves the control connection alone): the system ssh client or paramiko."""

    def __init__(self, name: str, accept_new_host_keys: bool = False, connect_timeout: float = 10.0):
        self.name = name
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout

    def _open(self, route: Route):
        if self.name == "openssh":
            return over_openssh(route, connect_timeout=self.connect_timeout)
        return Connection.for_route(route, accept_new_host_keys=self.accept_new_host_keys, connect_timeout=self.connect_timeout)

    def load(self, route: Route, sink: Sink, on_sent) -> SendResult:
        transport = self._open(route)
        sink.on_abort(transport.close)
        try:
            result = transport.run_stream_in(LOAD_ARGV, sink.chunks(on_sent))
        except RemoteError as err:
            return SendResult(False, str(err), err.cause)
        except StreamAborted as err:
            return SendResult(False, str(err), "lagged")
        finally:
            transport.close()
        if result.exit_code == 0:
            return SendResult(True)
        return SendResult(False, f"docker load failed (exit {result.exit_code}): {last_line(result.stderr) or last_line(result.stdout)}")

    def save(self, route: Route, ref: str) -> tuple[Iterator[bytes], Callable[[], None]]:
        transport = self._open(route)
        blocks: queue.Queue = queue.Queue(maxsize=16)
        done = object()
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = transport.run_stream_out(save_argv(ref), blocks.put)
            except BaseException as err:  # reported through the iterator
                outcome["error"] = err
            blocks.put(done)

        thread = threading.Thread(target=run, name="sparkctl-save", daemon=True)
        thread.start()

        def chunks() -> Iterator[bytes]:
            while True:
                block = blocks.get()
                if block is done:
                    break
                yield block
            if "error" in outcome:
                raise outcome["error"]
            result = outcome["result"]
            if result.exit_code != 0:
                raise OperationFailed(f"docker save on {route.name} failed (exit {result.exit_code}): {last_line(result.stderr)}")

        def close() -> None:
            transport.close()
            while thread.is_alive():  # unblock a reader waiting on a full queue
                try:
                    blocks.get_nowait()
                except queue.Empty:
                    time.sleep(0.01)

        return chunks(), close


def pick_transport(name: str, accept_new_host_keys: bool = False, connect_timeout: float = 10.0):
    if name == "auto":
        name = "openssh" if shutil.which("ssh") else "paramiko"
    if name == "openssh":
        if not shutil.which("ssh"):
            raise ConfigError("--transport openssh: no `ssh` client on this machine (apt-get install openssh-client)", field="--transport")
        return BulkStreams("openssh", connect_timeout=connect_timeout)
    return BulkStreams("paramiko", accept_new_host_keys, connect_timeout)


# ---------------------------------------------------------------------------------------------
# Execution


@dataclass
class DistributeOptions:
    tag: str
    hosts: list[str] | None = None
    source: str | None = None  # --from HOST
    via_here: bool = False  # with --from: pass the stream through this machine, not host to host
    dry_run: bool = False
    transport: str = "auto"
    retries: int = 1
    thin: bool = True
    accept_new_host_keys: bool = False
    bwlimit: float | None = None  # MB/s per host (None: as fast as it goes)
    stall_timeout: float = 30.0
    lag_fraction: float = 0.5
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    retry_delay: float = 1.0
    connect_timeout: float = 10.0  # seconds an SSH connection may take to open (control and bulk)
    on_progress: Callable[[str, int], None] | None = None  # (host, bytes sent so far)


@dataclass
class HostReport:
    name: str
    status: str = "failed"  # skipped | loaded | failed (dry run: skipped | planned | failed)
    mode: str = "none"  # none | full | thin
    bytes_sent: int = 0
    seconds: float = 0.0
    error: str | None = None
    address: str | None = None
    attempts: int = 0
    reason: str = ""
    retagged: bool = False  # it had the image under another tag, and was tagged

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "mode": self.mode, "bytes_sent": self.bytes_sent,
                "seconds": round(self.seconds, 3), "error": self.error}


@dataclass
class DistributionReport:
    image: str
    image_id: str | None
    hosts: list[HostReport]
    dry_run: bool = False
    transport: str = ""
    source: str = "local"
    source_bytes: int = 0  # bytes read from docker save (all rounds)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(h.status != "failed" for h in self.hosts)

    def outcome(self, origin: str) -> tuple[str, str]:
        """As a step's end, the image sent from ``origin``: changed, or StepFailed naming the hosts."""
        if not self.ok:
            failed = [f"{h.name}: {h.error}" for h in self.hosts if h.status == "failed"]
            raise StepFailed("could not copy the image to " + "; ".join(failed))
        parts = [f"{h.name} ({h.mode}, {h.bytes_sent / 1048576:.1f} MiB)" for h in self.hosts if h.status == "loaded"]
        if not parts:  # every host had it by the time the step acted: nothing was copied
            return OK, f"{self.image} is already on every host"
        return CHANGED, f"copied {self.image} from {origin} to " + ", ".join(parts)

    def to_json(self) -> dict:
        doc = {"image": self.image, "image_id": self.image_id, "hosts": [h.to_json() for h in self.hosts]}
        if self.dry_run:
            doc["dry_run"] = True
        return doc


def _say(out, message: str) -> None:
    """A note to the run's reporter (``out.reporter``: stderr as the user chose, or JSON lines)."""
    out.reporter.note(message)


def _progress(out, plans: list[HostPlan], size: int) -> Transfer:
    """Bytes per host (a full archive's size is known; a thin one's is not), told to the run's reporter."""
    return Transfer(out.reporter, {p.name: size if p.mode == "full" else None for p in plans},
                    labels={p.name: f"{p.name} {p.mode}" for p in plans}, verb="sending")


def _mib(n: float) -> str:
    return f"{n / 1048576:.1f} MiB"


def _source_image(options: DistributeOptions, pool, inventory, source_host) -> SourceImage:
    tag = options.tag
    if source_host is None:
        with DockerPyEngine() as engine:
            info = engine.inspect(tag)
        if info is None:
            raise OperationFailed(f"{tag} is not on this machine's Docker engine: build it first "
                                  f"(`sparkctl build`), or stream from a host that has it (--from HOST)")
        return SourceImage(tag, info.id, tuple(info.layers), tuple(info.digests), info.size, "local")
    try:
        data = ask(pool.get(inventory.ssh_target(source_host)), F.IMAGE_DOC, tag)
    except RuntimeError as err:
        if "permission denied" in str(err).lower():  # a bare host: the user is not in the docker group yet
            raise OperationFailed(f"--from {source_host.name}: this user may not use Docker there ({err}); "
                                  "run `sparkctl setup` first") from None
        raise
    if data is None:
        raise OperationFailed(f"{tag} is not on {source_host.name}")
    return SourceImage(tag, data["Id"], tuple((data.get("RootFS") or {}).get("Layers") or ()),
                       tuple(data.get("RepoDigests") or ()), int(data.get("Size") or 0), source_host.name)


def _open_source(options: DistributeOptions, transport, source_route: Route | None):
    if source_route is None:
        engine = DockerPyEngine()
        stream = engine.save(options.tag, CHUNK)
        return stream, engine.close
    return transport.save(source_route, options.tag)


def _select_hosts(inventory, options: DistributeOptions):
    source = inventory.host(options.source, field="--from") if options.source is not None else None
    return inventory.pick(options.hosts), source


LOAD = "load"  # each host's one step: the image there, loaded when it lacks it


def run_distribute(inventory, options: DistributeOptions, out, pool=None) -> DistributionReport:
    """Each chosen host's ``load`` step through the one runner, told to the run's reporter: every
    host's look (its engine's facts, read from all hosts at once, and its plan), then every host's
    act, each waiting for its end in the one shared stream (``_Distribution.send_rounds``).
    ``pool``: the run's connections (``up``'s), else this verb opens its own."""
    started = time.monotonic()
    chosen, source_host = _select_hosts(inventory, options)
    transport = pick_transport(options.transport, options.accept_new_host_keys, options.connect_timeout)
    targets = {h.name: inventory.ssh_target(h) for h in chosen}
    # Routes are probed in the background while the source and the facts are read: an unreachable
    # fabric address costs a timeout, which should not add to the distribution.
    routes = _Routes()
    for host in chosen:
        routes.probe(host.name, targets[host.name], host.fabric_addresses)
    if source_host is not None:
        routes.probe(source_host.name, inventory.ssh_target(source_host), source_host.fabric_addresses)
    with run_pool(pool, connect_timeout=options.connect_timeout, accept_new_host_keys=options.accept_new_host_keys) as pool:
        source = _source_image(options, pool, inventory, source_host)
        _say_source(out, source, source_host, options, transport)
        dist = _Distribution(source, source_host, chosen, routes, transport, options,
                             {h.name: _row(h.name, source_host) for h in chosen}, pool, targets, inventory, out)
        dist.read_facts()
        _load_every_host(dist, out.reporter)
    return DistributionReport(image=source.tag, image_id=source.id, hosts=[dist.reports[h.name] for h in chosen],
                              dry_run=options.dry_run, transport=transport.name, source=source.where,
                              source_bytes=dist.source_bytes, seconds=time.monotonic() - started)


def _row(name: str, source_host) -> HostReport:
    """A host's row of the report before its step: the source host's is skipped already."""
    if source_host is not None and name == source_host.name:
        return HostReport(name, status="skipped", reason="the source")
    return HostReport(name)


def _say_source(out, source: SourceImage, source_host, options: DistributeOptions, transport) -> None:
    where = f"{source_host.name}'s engine" if source_host else "this machine's engine"
    how = (f"{source_host.name} sends it to the others itself (--via-here: through this machine)"
           if source_host is not None and not options.via_here else f"bulk stream over {transport.name}")
    _say(out, f"{source.tag} {source.id[:19]} ({_mib(source.size)}, {len(source.layers)} layers) from {where}; {how}")


def load_step() -> Step:
    """A host's ``load``: its look is its plan (``ok``: it has the image; ``skipped``: the source;
    failed: its engine could not be read, or has no room, and no retry is left); its act waits for
    its end in the shared stream: ``changed`` (loaded, or re-tagged) or failed with why."""
    return Step(LOAD, lambda host: host.dist.look(host.name), lambda host, look: host.dist.act(host.name))


@dataclass
class _HostLoad:
    """One host's ``load`` step's context: its name and the run's distribution."""

    name: str
    dist: "_Distribution"


def _load_every_host(dist: "_Distribution", reporter) -> None:
    """Every host's look (the plan), then, unless a dry run, every host's act at once, each waiting
    for its host's end, while this thread sends (so an interrupt here stops the stream as before, and
    the acts end with it): the one runner's ``HostSteps``, without connections (the facts were read)."""
    steps = HostSteps([load_step()], {h.name: _HostLoad(h.name, dist) for h in dist.chosen}, {}, reporter, pool=None)
    steps.look()
    if dist.options.dry_run:
        return

    def send() -> None:
        try:
            dist.send_rounds()
        except BaseException as err:  # what stopped the sending: the acts still waiting say so
            dist.error = err
            raise
    steps.act(alongside=send, release=dist.decisions.release)


@dataclass
class _Distribution:
    """What every host's ``load`` step shares: the source, the hosts and their routes, the bulk
    transport, the reports (the ``--json`` rows), and the rounds of sending: the first from the
    plans the looks made, then each failed host retried (``--retries``) with fresh facts and its
    own read. A host's act waits for its host to be decided (its end known), not for the others."""

    source: SourceImage
    source_host: object | None
    chosen: list
    routes: _Routes
    transport: BulkStreams
    options: DistributeOptions
    reports: dict
    pool: object
    targets: dict
    inventory: object
    out: object
    facts: dict = field(default_factory=dict)  # the first round's facts, by host
    first_plans: dict = field(default_factory=dict)  # the looks' plans that act (send, or re-tag), by host
    retry_first: list = field(default_factory=list)  # hosts whose facts failed (or no room): the second round's
    source_bytes: int = 0  # read from docker save, every round
    error: BaseException | None = None  # what stopped the sending (raised to the caller)
    decisions: HostDecisions | None = None  # the hosts a round ended (each act waits for its own)

    def read_facts(self) -> None:
        """Every host's engine and images at once (the source host's are not needed)."""
        names = [h.name for h in self.chosen if not self._is_source(h.name)]
        self.facts = {r.name: r for r in fan_out([self.targets[n] for n in names], gather_facts, pool=self.pool)}
        self.decisions = HostDecisions([h.name for h in self.chosen])

    def _is_source(self, name: str) -> bool:
        return self.source_host is not None and name == self.source_host.name

    def look(self, name: str) -> Look:
        """The host's plan from its facts (changes nothing on the host; fills its report's row)."""
        report = self.reports[name]
        if self._is_source(name):  # (its row says so from the start)
            return Look(False, "the source of the image", {"skip": True})
        report.attempts = 1
        plan, problem = _plan_from(self.source, self.facts[name], self.options)
        if plan is not None:
            report.mode, report.reason = plan.mode, plan.reason
        if problem:
            report.status, report.error = "failed", problem
            if self.options.dry_run or not self.options.retries:
                raise StepFailed(_without_name(name, problem))
            if name not in self.retry_first:
                self.retry_first.append(name)
            return Look(True, f"{_without_name(name, problem)}: asked again in the next round")
        if plan.action == "skip":
            report.status, report.error = "skipped", None
            if not plan.retag:
                return Look(False, f"has {self.source.tag} ({self.source.id[7:19]})")
            self.first_plans[name] = plan
            return Look(True, f"has the image as {plan.retag[7:19]}: tag it {self.source.tag}")
        report.status = "planned"  # a dry run's word; the send's end replaces it
        self.first_plans[name] = plan
        return Look(True, f"send {_what(plan)}: {plan.reason}")

    def act(self, name: str) -> tuple[str, str]:
        """Wait for the host's end in the rounds; the step's end from its report."""
        decided = self.decisions.wait(name)
        report = self.reports[name]
        if self.error is not None and not decided:
            raise StepFailed(f"stopped: {' '.join(str(self.error).split()) or type(self.error).__name__}")
        if report.status not in ("loaded", "skipped"):
            raise StepFailed(_without_name(name, report.error or report.status))
        if report.retagged:
            return CHANGED, f"had the image: tagged it {self.source.tag}"
        if report.bytes_sent:
            return CHANGED, (f"loaded {report.mode}, {_mib(report.bytes_sent)} in {report.seconds:.1f}s"
                             + (f" via {report.address}" if report.address else ""))
        return OK, report.reason or "has the image"

    def send_rounds(self) -> None:
        """The first round from the looks' plans, then the failed hosts again, each round's ended
        hosts decided as soon as it is over."""
        first = list(self.first_plans.values())
        plans = self._ready(first, 0)  # (a failed re-tag is tried again, as a failed send)
        failed = [*self.retry_first, *self._retag_failed(first)]
        for attempt in range(self.options.retries + 1):
            if attempt:
                if not failed:
                    return
                self._say_retry(failed, attempt)
                facts = fan_out([self.targets[n] for n in failed], gather_facts, pool=self.pool)
                plans, failed = self._plan_round(facts, attempt)
            self.source_bytes += self.send(plans, direct=self.source_host is not None and not self.options.via_here
                                           and attempt == 0)
            failed += [p.name for p in plans if self.reports[p.name].status == "failed"]
            self.decisions.decide([n for n in self.reports if self.reports[n].status != "failed"])

    def _say_retry(self, failed: list[str], attempt: int) -> None:
        time.sleep(self.options.retry_delay)
        for name in failed:
            _say(self.out, f"  {name}: {_without_name(name, self.reports[name].error or 'failed')}")
        _say(self.out, f"retrying {', '.join(failed)} (attempt {attempt + 1} of {self.options.retries + 1}), "
                       "each with its own read")

    def _plan_round(self, facts, attempt: int) -> tuple[list[HostPlan], list[str]]:
        """A retry's plans from fresh facts: the hosts to send to, and the hosts that failed already
        (no facts, no room, or a failed re-tag). A host that has the image now is re-tagged if needed."""
        plans: list[HostPlan] = []
        failed: list[str] = []
        for result in facts:
            report = self.reports[result.name]
            report.attempts += 1
            plan, problem = _plan_from(self.source, result, self.options)
            if plan is not None:
                report.mode, report.reason = plan.mode, plan.reason
            if problem:
                report.status, report.error = "failed", problem
                failed.append(result.name)
                continue
            plans.append(plan)
        return self._ready(plans, attempt), failed + self._retag_failed(plans)

    def _retag_failed(self, plans: list[HostPlan]) -> list[str]:
        """The hosts that had the image and could not be tagged (a send's status is its round's)."""
        return [p.name for p in plans if p.action == "skip" and self.reports[p.name].status == "failed"]

    def _ready(self, plans: list[HostPlan], attempt: int) -> list[HostPlan]:
        """The plans to send; a host that has the image is re-tagged if needed and ends here."""
        sends = []
        for plan in plans:
            report = self.reports[plan.name]
            if plan.action != "skip":
                sends.append(plan)
                continue
            if plan.retag:
                tagged = self.pool.get(self.targets[plan.name]).run(tag_argv(plan.retag, self.source.tag), timeout=60)
                if tagged.exit_code != 0:
                    report.status, report.error = "failed", f"docker tag failed: {last_line(tagged.stderr)}"
                    continue
                report.retagged = True
            report.status = "skipped" if attempt == 0 and report.bytes_sent == 0 else "loaded"
            report.error = None
        return sends

    def send(self, plans: list[HostPlan], *, direct: bool) -> int:
        """One round's sending: by the source host itself (``direct``, --from HOST's first round) or
        streamed by this machine; one line per host says where its bytes go. The bytes read."""
        if not plans:
            return 0
        by_name = {h.name: h for h in self.chosen}
        chosen_routes = {p.name: self.routes.get(p.name) for p in plans}
        for plan in plans:
            address = by_name[plan.name].fabric_address if direct else chosen_routes[plan.name].address
            self.reports[plan.name].address = address
            _say(self.out, f"  {plan.name:<12} {_what(plan)} via {address}" + (f" from {self.source_host.name}" if direct else ""))
        if direct:
            return _relay_round(self.source, plans, self.source_host, self.inventory, self.options, self.reports,
                                self.pool, self.targets, self.out)
        route = self.routes.get(self.source_host.name) if self.source_host is not None else None
        return _stream_round(self.source, plans, chosen_routes, self.transport, self.options, route, self.reports,
                             self.pool, self.targets, self.out)


def _plan_from(source: SourceImage, facts, options: DistributeOptions) -> tuple[HostPlan | None, str | None]:
    """(the host's plan, why it cannot be carried out now: its facts failed, or it has no room)."""
    if not facts.ok:
        return None, facts.error
    plan = plan_host(source, facts.value, thin=options.thin)
    return plan, space_problem(plan, facts.value, source)


def _what(plan: HostPlan) -> str:
    if plan.mode == "thin":
        return f"thin ({plan.layers_total - plan.layers_present} of {plan.layers_total} layers)"
    return plan.mode


def _without_name(name: str, message: str) -> str:
    """A host's error as its step's reason (the step's line names the host already)."""
    return message[len(name) + 2:] if message.startswith(f"{name}: ") else message


def _stream_round(source: SourceImage, plans: list[HostPlan], routes, transport, options: DistributeOptions,
                  source_route, reports, pool, targets, out) -> int:
    sinks = [Sink(p.name, p.present, options.queue_bytes) for p in plans]
    progress = _progress(out, plans, source.size)
    base_sent = {p.name: reports[p.name].bytes_sent for p in plans}

    def send(sink: Sink) -> SendResult:
        limiter = Rate(options.bwlimit) if options.bwlimit else None

        def on_sent(sent: int) -> None:
            progress.update(sink.name, sent)
            if options.on_progress is not None:
                options.on_progress(sink.name, sent)
            if limiter is not None:
                limiter(sent)

        return transport.load(routes[sink.name], sink, on_sent)

    stream, close = _open_source(options, transport, source_route)
    try:
        result = stream_to_all(stream, list(source.layers), sinks, send, stall_timeout=options.stall_timeout,
                               lag_fraction=options.lag_fraction, close_source=close)
    finally:
        progress.close()
    outcomes = [_Outcome(s.name, s.state, s.error, base_sent[s.name] + s.bytes_sent, s.finished - s.started) for s in sinks]
    _finish_round(outcomes, source, reports, pool, targets)
    return result.source_bytes


@dataclass
class _Outcome:
    """How one host's stream ended (state ``done`` or not), from either kind of round."""

    name: str
    state: str
    error: str | None
    bytes_sent: int
    seconds: float


def _finish_round(outcomes: list[_Outcome], source: SourceImage, reports, pool, targets, prefix: str = "") -> None:
    """Verify every host whose stream completed (each host's line is its step's end)."""
    for outcome in outcomes:
        report = reports[outcome.name]
        report.bytes_sent = outcome.bytes_sent
        report.seconds += outcome.seconds
        if outcome.state != "done":
            report.status, report.error = "failed", f"{prefix}{outcome.name}: {outcome.error or outcome.state}"
            continue
        check = _verify(pool, targets[outcome.name], source)
        if check is None:
            report.status, report.error = "loaded", None
        else:
            report.status, report.error = "failed", check


# ---------------------------------------------------------------------------------------------
# --from HOST: the source host streams to the others itself (sparkctl.images.relay)

def relay_ssh_argv(host, target, alias: str, connect_timeout: float = 10.0) -> list[str]:
    """The ssh command the source host runs to load the stream on ``host``: its fabric address, the
    source host's own keys (or agent), and only the host key this machine verified (under ``alias``)."""
    return peer_argv(host, target, alias, LOAD_ARGV, connect_timeout=connect_timeout)


def relay_spec(source: SourceImage, plans: list[HostPlan], hosts: dict, targets: dict, host_keys: dict, options) -> dict:
    """What ``sparkctl.images.relay`` on the source host needs (pure)."""
    spec_targets = []
    for plan in plans:
        argv = relay_ssh_argv(hosts[plan.name], targets[plan.name], alias=plan.name,
                              connect_timeout=options.connect_timeout)
        spec_targets.append({"name": plan.name, "argv": argv, "where": hosts[plan.name].fabric_address,
                             "present": sorted(plan.present)})
    return {"tag": source.tag, "diff_ids": list(source.layers), "known_hosts": known_hosts_lines({p.name: host_keys[p.name] for p in plans}),
            "targets": spec_targets, "queue_bytes": options.queue_bytes, "stall_timeout": options.stall_timeout,
            "lag_fraction": options.lag_fraction, "bwlimit": options.bwlimit}


def _relay_round(source: SourceImage, plans: list[HostPlan], source_host, inventory, options: DistributeOptions,
                 reports, pool, targets, out) -> int:
    """One round sent by the source host itself. Any failure of the relay (no python3 there, the
    source host cannot ssh to a host, ...) fails those hosts; the caller retries them through here."""
    hosts = {h.name: h for h in inventory.hosts}
    head = pool.get(inventory.ssh_target(source_host))
    progress = _progress(out, plans, source.size)
    base_sent = {p.name: reports[p.name].bytes_sent for p in plans}
    done: dict = {}

    def on_doc(doc: dict) -> None:
        for name, sent in (doc.get("progress") or {}).items():
            progress.update(name, sent)
            if options.on_progress is not None:
                options.on_progress(name, sent)
        if "done" in doc:
            done.update(doc)

    started = time.monotonic()
    failure = None
    agent = None
    try:
        spec = relay_spec(source, plans, hosts, targets, {p.name: pool.get(targets[p.name]).server_key() for p in plans}, options)
        agent = ship_agent(head, relay_zip(), prefix="sparkctl-relay", name="relay.pyz")
        result = agent.stream_out([json.dumps(spec)], JsonLines(on_doc))
        if "done" not in done:
            failure = f"the relay on {source_host.name} stopped (exit {result.exit_code}): {last_line(result.stderr)}"
    except (RemoteError, OperationFailed, ValueError) as err:
        failure = f"the relay on {source_host.name} could not run: {err}"
    finally:
        progress.close()
        if agent is not None:
            agent.remove()
    seconds = time.monotonic() - started
    if failure is not None:
        outcomes = [_Outcome(p.name, "failed", failure, base_sent[p.name], seconds) for p in plans]
    else:
        if done.get("source_error"):
            _say(out, f"  {source_host.name}: {done['source_error']}")
        outcomes = [_Outcome(name, d["state"], d["error"], base_sent[name] + int(d["bytes_sent"]), float(d["seconds"]))
                    for name, d in done["done"].items()]
    _finish_round(outcomes, source, reports, pool, targets, prefix=f"{source_host.name} → ")
    return int(done.get("source_bytes") or 0)


def _verify(pool, target, source: SourceImage) -> str | None:
    """None when the host's tag now names the source's image ID; else why not."""
    try:
        loaded = ask(pool.get(target), F.IMAGE_ID, source.tag, fresh=True)
    except (RemoteError, OperationFailed) as err:
        return f"could not verify: {err}"
    if loaded is None:
        return f"{source.tag} is not there after docker load"
    if loaded != source.id:
        return f"{source.tag} is {loaded[:19]} after docker load, the source is {source.id[:19]}"
    return None


def format_report(report: DistributionReport) -> str:
    lines = [f"{report.image} {str(report.image_id)[:19]}{' (dry run)' if report.dry_run else ''}: "
             f"{sum(h.bytes_sent for h in report.hosts) / 1048576:.1f} MiB sent to "
             f"{sum(1 for h in report.hosts if h.status == 'loaded')} host(s) in {report.seconds:.1f}s "
             f"(docker save read {report.source_bytes / 1048576:.1f} MiB, over {report.transport})"]
    width = max([len(h.name) for h in report.hosts] + [4])
    for host in report.hosts:
        detail = host.error or host.reason
        lines.append(f"  {host.name:<{width}}  {host.status:<8} {host.mode:<5} {host.bytes_sent / 1048576:>10.1f} MiB "
                     f"{host.seconds:>7.1f}s  {detail}")
    return "\n".join(lines)
