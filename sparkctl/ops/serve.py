"""``sparkctl serve``: the rendered deployment, planned and run on the hosts, under the deploy lock.

Plan (pure, ``plan_serve``): from the render plan (per host: env file, compose file, launch script,
``docker run`` argv) plus a deployment record, the endpoint, the ports the head must have free,
the memory every host must have available, the lock and the audit log. ``--dry-run`` prints it.

Execute (``execute_serve``), the Kamal way:

1. **Deploy lock** on the inventory's head (``sparkctl.ops.lock``): an atomic rename, holding who,
   when, what and the holder's process. A second serve or stop meanwhile is refused with that
   information; ``--break-lock`` removes a lock whose run is gone (never a live one).
2. **Facts** from every host at once: this profile's containers (and any same-named one), the image,
   and on the head who listens on the serving and rendezvous ports (doctor's ``ss`` probe). A port
   held by anything but the containers being replaced refuses the deploy before anything changes.
3. **Files**: ``/var/lib/sparkctl/<profile>/{engine.env,compose.yaml,launch.sh,deployment.json}``,
   each written to a temporary name, synced and renamed (argv lists; content on stdin).
4. **Old containers** of the profile (or of the same name) are stopped, the head first (the engines
   then end their workers' jobs in order), and removed. Unlike Kamal, old containers cannot stay
   up until the new ones are healthy: one GB10 holds one copy of the model.
5. The ports are checked again, and every host's MemAvailable against what the engine will take
   (``memory.unified_memory_gb x gpu_memory_utilization``; the free-memory guard of the single-box engine's README).
6. **Start** every container at once: the engines' rendezvous does not care about order (workers
   retry until the head listens, the head waits for every rank), so ordering would only add time.
7. **Health**: poll the head's ``/health`` then ``/v1/models`` with backoff up to the profile's
   ``serving.health_timeout_s``, checking every few seconds that all containers still run. On
   failure every host's ``docker logs --tail`` and container state are reported, exit 1.
8. One **audit** line on the head (``/var/lib/sparkctl/audit.log``), success or not; then the lock goes.

Each step after the lock is one method of ``ServeRun`` (facts, files, replace, room, start, health,
record), all sharing the run's ``ServeReport``. The argv lists and parsers are
``sparkctl.commands.serve`` and ``sparkctl.commands.facts``; ``status``, ``logs`` and ``stop`` have
their own modules.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from sparkctl.commands import facts
from sparkctl.commands.docker import bind_sources, make_bind_sources_argv, remote_profile_dir
from sparkctl.commands.lock import audit_log, lock_dir
from sparkctl import engines, launchers
from sparkctl.commands.ranks import Ranked, role_of
from sparkctl.commands.serve import (
    DEPLOYMENT_FILE,
    STOP_TIMEOUT_S,
    Container,
    remove_argv,
    stop_argv,
    url_host,
    write_file_argv,
)
from sparkctl.ops.liveness import RankWatch
from sparkctl.ops.lock import LockRefused, deploy_lock, who_am_i
from sparkctl.ops.steps import (CHANGED, OK, STEP_TIMEOUT_S, Look, Step, StepFailed, ask, check_result, list_containers,
                                run_steps, stop_and_remove, tail_logs, utc_now)
from sparkctl.errors import ConfigError
from sparkctl.output import one_line
from sparkctl.reporter import Reporter
from sparkctl.secrets import mask_argv, mask_env

LOG_TAIL = 40
UNDO_STOP_TIMEOUT_S = 10  # a rank that failed to come up has nothing to drain
ALIVE_EVERY_S = 3.0  # the health wait's look at the ranks (ops/liveness): restarted, exited or gone ends it

# ---------------------------------------------------------------------------------------------
# The plan (pure)


@dataclass(frozen=True)
class PlannedFile:
    name: str
    content: str
    mode: int


@dataclass
class ServeHost(Ranked):
    name: str
    address: str
    rank: int
    env: dict[str, str]
    docker_argv: list[str]
    engine_argv: list[str]
    files: list[PlannedFile]


@dataclass
class ServePlan:
    profile: str
    engine: str
    image: str
    container: str
    remote_dir: str
    state_dir: str  # the inventory's paths.state_dir: files, deploy lock and audit log live under it
    endpoint: str
    served_model_name: str
    head_ports: dict[str, int]  # what must be free on the head: serving port, rendezvous/Ray port
    health_timeout_s: float
    min_free_gb: float  # MemAvailable every host needs before the start
    lock_host: str  # the inventory's head: where the deploy lock and the audit log live
    hosts: list[ServeHost]
    who: str
    when: str
    overrides: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    engine_version: str = ""

    @property
    def head(self) -> ServeHost:
        return self.hosts[0]

    @property
    def what(self) -> str:
        return f"serve {self.profile} on {', '.join(h.name for h in self.hosts)}"

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "engine": self.engine,
            "image": self.image,
            "container": self.container,
            "endpoint": self.endpoint,
            "served_model_name": self.served_model_name,
            "health_timeout_s": self.health_timeout_s,
            "start": "all hosts at once (the engines' rendezvous does not depend on order)",
            "lock": {"host": self.lock_host, "path": lock_dir(self.state_dir), "who": self.who, "when": self.when, "what": self.what},
            "audit": {"host": self.lock_host, "path": audit_log(self.state_dir)},
            "head_ports": self.head_ports,
            "min_free_gb": self.min_free_gb,
            "hosts": [
                {
                    "name": h.name,
                    "address": h.address,
                    "rank": h.rank,
                    "role": h.role,
                    "dir": self.remote_dir,
                    "files": [{"path": f"{self.remote_dir}/{f.name}", "mode": f"{f.mode:04o}", "bytes": len(f.content.encode())}
                              for f in h.files],
                    "env": mask_env(h.env),
                    "replace": [stop_argv([self.container]), remove_argv([self.container])],
                    "docker_argv": mask_argv(h.docker_argv),
                    "engine_argv": mask_argv(h.engine_argv),
                }
                for h in self.hosts
            ],
            "notes": self.notes,
        }


def deployment_record(plan_fields: dict, host_name: str, rank: int) -> dict:
    return {**plan_fields, "host": host_name, "rank": rank, "role": role_of(rank)}


def plan_serve(loaded, inventory, render_plan, *, who: str, when: str) -> ServePlan:
    """The serve of ``render_plan`` (``sparkctl.ops.render``): no I/O."""
    profile = loaded.profile
    if not launchers.of(profile).runs_containers:  # no container to run: its launcher serves it (native_deploy)
        raise ConfigError(f"profile {profile.name} runs its engine as a host process (launcher: native): "
                          "`sparkctl serve` starts it; --set launcher=docker for its container", field="launcher")
    by_name = {h.name: h for h in inventory.hosts}
    head_view = by_name[render_plan.hosts[0].name]
    engine = engines.get(profile.engine)
    if engine.listens_on_serving_host:  # its container publishes the port where serving.host says
        from sparkctl.ops.native import require_reachable

        require_reachable(profile.serving.host, head_view)
    endpoint = f"http://{url_host(head_view.address)}:{profile.serving.port}"
    state_dir = inventory.model.paths.state_dir
    remote_dir = remote_profile_dir(profile.name, state_dir)
    shared = {
        "profile": profile.name,
        "engine": profile.engine,
        "engine_version": profile.engine_version,
        "image": profile.image.tag,
        "container": profile.container.name,
        "endpoint": endpoint,
        "served_model_name": profile.serving.served_model_name,
        "hosts": [h.name for h in render_plan.hosts],
        "overrides": loaded.recorded_overrides,
        "who": who,
        "when": when,
    }
    hosts = [_serve_host(rendered, by_name[rendered.name], shared) for rendered in render_plan.hosts]
    return ServePlan(
        profile=profile.name,
        engine=profile.engine,
        image=profile.image.tag,
        container=profile.container.name,
        remote_dir=remote_dir,
        state_dir=state_dir,
        endpoint=endpoint,
        served_model_name=profile.serving.served_model_name,
        head_ports=head_ports(profile, len(render_plan.hosts)),
        health_timeout_s=float(profile.serving.health_timeout_s),
        min_free_gb=round(engine.min_free_gb(profile), 2),
        lock_host=inventory.head.name,
        hosts=hosts,
        who=who,
        when=when,
        overrides=loaded.recorded_overrides,
        notes=list(render_plan.notes),
        engine_version=profile.engine_version,
    )


def head_ports(profile, host_count: int) -> dict[str, int]:
    """The ports the head must have free: the endpoint's, and the ranks' rendezvous when there are several."""
    ports = {"serving port": profile.serving.port}
    if profile.tensor_parallel > 1 or host_count > 1:
        if engines.get(profile.engine).uses_ray(profile):
            ports["ray port"] = profile.distributed.ray_port
        else:
            ports["rendezvous port"] = profile.distributed.master_port
    return ports


def _serve_host(rendered, view, shared: dict) -> ServeHost:
    """One host of the serve: its rendered files (modes as render says) and its deployment record."""
    from sparkctl.ops.render import FILE_MODES

    files = []
    for relative, content in rendered.files.items():
        name = relative.split("/", 1)[1]
        files.append(PlannedFile(name, content, FILE_MODES.get(name, 0o644)))
    record = deployment_record(shared, rendered.name, rendered.rank)
    files.append(PlannedFile(DEPLOYMENT_FILE, json.dumps(record, indent=2) + "\n", 0o644))
    return ServeHost(rendered.name, view.address, rendered.rank, rendered.env, rendered.docker_argv,
                     rendered.engine_argv, files)


def build_plan(inventory, profile_name: str, *, sets=(), envs=(), wanted_hosts=None,
               who: str | None = None, when: str | None = None) -> ServePlan:
    """Load the profile, render it and plan the serve (reads recipes and templates, touches no host)."""
    from sparkctl.config.profile import load_profile
    from sparkctl.ops.render import render

    render_plan, _ = render(inventory, profile_name, sets=sets, envs=envs, wanted_hosts=wanted_hosts)
    loaded = load_profile(profile_name, sets=sets, envs=envs)
    return plan_serve(loaded, inventory, render_plan, who=who or who_am_i(), when=when or utc_now())


# ---------------------------------------------------------------------------------------------
# serve


@dataclass
class HostOutcome(Ranked):
    name: str
    rank: int
    ok: bool = True
    container: Optional[Container] = None
    container_id: str = ""
    replaced: list[str] = field(default_factory=list)
    error: Optional[str] = None
    logs: Optional[str] = None

    def to_json(self) -> dict:
        return {"name": self.name, "rank": self.rank, "role": self.role, "ok": self.ok,
                "container_id": (self.container_id or (self.container.id if self.container else ""))[:12] or None,
                "state": self.container.status if self.container else None,
                "container": self.container.to_json() if self.container else None,
                "replaced": self.replaced, "error": self.error, "logs": self.logs}


@dataclass(kw_only=True)
class ServeOutcome:
    """How a serve ended, for both launchers (containers: ``ServeReport``; a host process:
    ``native_deploy.NativeServeReport``): the stage that failed and why, the endpoint's health."""

    ok: bool = False
    stage: str = "lock"  # the step that failed (or "done")
    message: str = ""
    health: Optional[dict] = None
    seconds: float = 0.0
    health_seconds: Optional[float] = None
    broken_lock: Optional[dict] = None
    audit: Optional[str] = None

    def fail(self, stage: str, message: str):
        self.ok, self.stage, self.message = False, stage, message
        return self

    @property
    def audit_result(self) -> str:
        """The audit line's ``result``: ok, or the stage that failed."""
        return "ok" if self.ok else f"failed:{self.stage}"


@dataclass
class ServeReport(ServeOutcome):
    plan: ServePlan
    hosts: list[HostOutcome]

    def host(self, name: str) -> HostOutcome:
        return next(h for h in self.hosts if h.name == name)

    def outcome(self, why: str) -> tuple[str, str]:
        """As a step's end (served because ``why``): changed, or StepFailed with the stage and the hosts."""
        if not self.ok:
            hosts = "; ".join(f"{h.name}: {h.error}" for h in self.hosts if h.error)
            raise StepFailed(f"serve failed ({self.stage}): {self.message}" + (f" [{hosts}]" if hosts else ""))
        return CHANGED, f"{why}: served; healthy after {self.health_seconds or 0:.1f} s"

    def to_json(self) -> dict:
        return {"ok": self.ok, "profile": self.plan.profile, "endpoint": self.plan.endpoint, "stage": self.stage,
                "message": self.message or None, "served_model_name": self.plan.served_model_name,
                "health": self.health, "seconds": round(self.seconds, 3),
                "health_seconds": None if self.health_seconds is None else round(self.health_seconds, 3),
                "hosts": [h.to_json() for h in self.hosts], "broken_lock": self.broken_lock, "audit": self.audit}



def execute_serve(plan: ServePlan, inventory, *, pool, reporter: Optional[Reporter] = None, timeout_s: float | None = None,
                  break_lock: bool = False, force_break_lock: bool = False, log_tail: int = LOG_TAIL,
                  max_workers: int = 16, on_health_attempt: Callable | None = None) -> ServeReport:
    """Run ``plan`` under the deploy lock; every failure is in the report (stage, message, hosts).
    Its progress goes to ``reporter`` as notes (None: recorded only)."""
    reporter = reporter or Reporter()
    report = ServeReport(plan, [HostOutcome(h.name, h.rank) for h in plan.hosts])

    def serve() -> None:
        serve_locked(plan, inventory, report, pool=pool, reporter=reporter, timeout_s=timeout_s, log_tail=log_tail,
                     max_workers=max_workers, on_health_attempt=on_health_attempt)

    def audit() -> dict:
        return {"profile": plan.profile, "hosts": [h.name for h in plan.hosts], "image": plan.image,
                "endpoint": plan.endpoint, "result": report.audit_result,
                "seconds": f"{report.seconds:.1f}", "overrides": plan.overrides or None}

    under_deploy_lock(report, plan, inventory, pool, serve, audit, reporter=reporter, break_lock=break_lock,
                      force_break_lock=force_break_lock)
    return report


def under_deploy_lock(report: ServeOutcome, plan, inventory, pool, serve: Callable[[], None], audit: Callable[[], dict],
                      *, reporter: Optional[Reporter] = None, break_lock: bool, force_break_lock: bool) -> None:
    """Run ``serve`` holding the deploy lock (both launchers): the lock it broke, the time taken and
    the audit line (``audit()``'s fields, asked once the time is known) land in ``report``; a lock
    held by another deploy fails it at stage "lock". The lock's notes go to ``reporter``."""
    started = time.monotonic()
    try:
        with deploy_lock(inventory, pool, verb="serve", what=plan.what, who=plan.who, break_lock=break_lock,
                         force_break=force_break_lock, reporter=reporter) as held:
            report.broken_lock = held.broken
            try:
                serve()
            finally:
                report.seconds = time.monotonic() - started
                held.audit_fields = audit()
        report.audit = held.audit
    except LockRefused as err:
        report.fail("lock", str(err))
    report.seconds = time.monotonic() - started


def serve_locked(plan: ServePlan, inventory, report: ServeReport, *, pool, reporter: Optional[Reporter] = None,
                 about: Optional[str] = None, timeout_s: float | None = None, log_tail: int = LOG_TAIL,
                 max_workers: int = 16, on_health_attempt: Callable | None = None) -> ServeReport:
    """The serve's stages, for a caller that already holds the deploy lock (``serve``, ``up``); its
    notes go to ``reporter``, ``about`` the part of the run this serve is (a replica's name)."""
    ServeRun(plan, inventory, report, pool=pool, reporter=reporter or Reporter(), about=about,
             max_workers=max_workers).run(timeout_s, log_tail, on_health_attempt)
    return report


class StageFailed(StepFailed):
    """A stage of the serve failed; the report already says how."""


# The serve's stages, in order, as steps (each always acts: a serve serves), and how each ends:
# ok for a stage that only checks, changed for one that changes the hosts.
STAGES = (("check", OK), ("write", CHANGED), ("replace", CHANGED), ("room", OK), ("start", CHANGED), ("health", OK),
          ("record", CHANGED), ("commit", CHANGED))


def _stage(name: str, ends: str, work: Callable[[], None]) -> Step:
    def act(serve, look: Look) -> tuple[str, str]:
        work()
        return ends, name

    return Step(name, lambda serve: Look(True, f"the serve's {name} stage"), act)


@dataclass
class ServeFindings:
    containers: list[Container]
    image_id: Optional[str]  # what the plan's tag names on the host (None: no such image)
    ports: Optional[facts.PortUsers]  # the head's listening ports (None on the workers)


@dataclass
class HostRoom:
    available_bytes: int
    ports: Optional[facts.PortUsers]


class ServeRun:
    """The stages of one serve, in order, sharing the report; each stage fails the run by raising StageFailed."""

    def __init__(self, plan: ServePlan, inventory, report: ServeReport, *, pool, reporter: Reporter,
                 about: Optional[str] = None, max_workers: int = 16):
        views = {h.name: h for h in inventory.hosts}
        self.plan, self.report, self.pool, self.max_workers = plan, report, pool, max_workers
        self.reporter, self.about = reporter, about  # what the user sees: a note per stage, about this serve
        self.targets = [inventory.ssh_target(views[h.name]) for h in plan.hosts]
        self.by_name = {h.name: h for h in plan.hosts}
        self.replaced: dict[str, list[Container]] = {}  # per host: the containers this serve replaces
        self.others_running: dict[str, list[Container]] = {}  # per host: other running sparkctl containers
        self.events = Reporter()  # the stages' looks and ends, recorded (the notes are what the user sees)
        self.watches: dict[str, RankWatch] = {}  # per host: the rank this serve started (its container ID)

    def run(self, timeout_s: float | None, log_tail: int, on_health_attempt: Callable | None) -> None:
        """The stages through the one step runner (``ops/steps.StepRun``): the first that fails
        (StageFailed, the report already saying how) stops the rest; an error no stage foresaw goes
        up to the caller unchanged. ``self.events``: the stages as they ended."""
        work = {"check": self.facts, "write": self.files, "replace": self.replace, "room": self.room,
                "start": lambda: self.start(log_tail), "health": lambda: self.health(timeout_s, log_tail, on_health_attempt),
                "record": lambda: self.record(log_tail), "commit": self.commit}
        run = run_steps([_stage(name, ends, work[name]) for name, ends in STAGES], self, self.events,
                        raise_on=(Exception,))
        if run.failed is None:
            self.report.ok, self.report.stage, self.report.message = True, "done", ""

    # -- helpers -------------------------------------------------------------------------------------

    def note(self, message: str) -> None:
        self.reporter.note(message, self.about)

    def on_hosts(self, fn, hosts: list[str] | None = None, *, stage: str = "", failing: str = "") -> dict:
        """``fn(conn)`` on the plan's hosts (or ``hosts``) at once: host -> value of those that succeeded.
        A host that failed gets its error; with ``failing``, any failure fails the stage."""
        from sparkctl.remote.pool import fan_out

        chosen = self.targets if hosts is None else [t for t in self.targets if t.name in hosts]
        results = fan_out(chosen, fn, pool=self.pool, max_workers=self.max_workers)
        for result in results:
            if not result.ok:
                outcome = self.report.host(result.name)
                outcome.ok, outcome.error = False, result.error
        failed = [r.name for r in results if not r.ok]
        if failed and failing:
            self.fail(stage, failing + ", ".join(failed))
        return {r.name: r.value for r in results if r.ok}

    def fail(self, stage: str, message: str, host_errors: dict[str, str] | None = None):
        for name, error in (host_errors or {}).items():
            outcome = self.report.host(name)
            outcome.ok, outcome.error = False, error
        self.report.fail(stage, message)
        raise StageFailed(message)

    def check_ports(self, ports: Optional[facts.PortUsers], ignore: bool) -> None:
        head = self.plan.head.name
        conflict = port_conflicts(self.plan, ports, self.others_running[head], ignore=ignore)
        if conflict:
            self.fail("check", f"{head}: {conflict}", {head: conflict})

    def container_states(self) -> dict[str, Optional[Container]]:
        """Per host that answered: the plan's container now (None when it is gone). One ``docker inspect``
        of the name per host (the health wait asks every few seconds: the listing would be two dockers
        and a shell); never kept, since a container changes by itself."""
        name = self.plan.container
        found = self.on_hosts(lambda conn: ask(conn, facts.CONTAINER, name, fresh=True))
        # (docker takes an ID prefix too when no container has the name: only the name itself counts)
        return {host: container if container is not None and container.name == name else None
                for host, container in found.items()}

    # -- the stages ------------------------------------------------------------------------------------

    def facts(self) -> None:
        """Containers, image and (on the head) listening ports; refuse before anything changes."""
        plan, head = self.plan, self.plan.head.name
        self.note(f"checking {len(plan.hosts)} host(s): image {plan.image}, containers, ports")

        def look(conn) -> ServeFindings:
            return ServeFindings(list_containers(conn, plan.profile, plan.container), ask(conn, facts.IMAGE_ID, plan.image),
                             ask(conn, facts.PORT_USERS) if conn.target.name == head else None)

        found: dict[str, ServeFindings] = self.on_hosts(look, stage="check", failing="cannot reach or inspect ")
        missing = [name for name, f in found.items() if f.image_id is None]
        if missing:
            self.fail("check", f"image {plan.image} is missing on {', '.join(missing)} "
                               "(build it, or copy it with `sparkctl distribute`)",
                      {name: f"image {plan.image} is not on this host" for name in missing})
        for name, f in found.items():
            self.replaced[name] = [c for c in f.containers if c.profile == plan.profile or c.name == plan.container]
            self.others_running[name] = [c for c in f.containers if c.running and c not in self.replaced[name]]
            self.report.host(name).replaced = [f"{c.name} ({c.status})" for c in self.replaced[name]]
        self.check_surface({name: f.image_id for name, f in found.items()})
        self.check_ports(found[head].ports, ignore=any(c.running for c in self.replaced[head]))

    def check_surface(self, image_ids: dict[str, str]) -> None:
        """Refuse a flag or variable the engine in the hosts' image does not know (its surface is read
        there once when this machine has not kept it)."""
        def run_on(host: str, argv: list[str]):
            answers = self.on_hosts(lambda conn: conn.run(argv, timeout=STEP_TIMEOUT_S * 10), hosts=[host])
            result = answers.get(host)
            return (result is not None and result.ok), (result.stdout if result is not None else "")

        refusal, warnings = check_surface(self.plan, image_ids, run_on)
        for warning in warnings:
            self.reporter.warning(warning, self.about)
        if refusal:
            self.fail("check", refusal)

    def files(self) -> None:
        plan = self.plan
        names = [f.name for f in plan.head.files if f.name != DEPLOYMENT_FILE]  # the record comes last (commit)
        self.note(f"writing {plan.remote_dir}/{{{','.join(names)}}} on every host")

        def write(conn) -> None:
            sources = bind_sources(self.by_name[conn.target.name].docker_argv)
            if sources:
                check_result(conn.run(make_bind_sources_argv(sources), timeout=STEP_TIMEOUT_S),
                             f"create the bind-mounted folders {', '.join(sources)} (`sparkctl setup` makes them the user's)")
            for f in self.by_name[conn.target.name].files:
                if f.name == DEPLOYMENT_FILE:  # the record changes last, once the new deployment serves (commit)
                    continue
                check_result(conn.run(write_file_argv(plan.remote_dir, f.name, f.mode), stdin=f.content.encode(),
                                      timeout=STEP_TIMEOUT_S), f"write {plan.remote_dir}/{f.name}")

        self.on_hosts(write, stage="write", failing="cannot write the deployment files on ")

    def replace(self) -> None:
        """Stop and remove the old containers: the head first (the engines then end their workers' jobs in order)."""
        if not any(self.replaced.values()):
            return
        self.note("stopping the old containers: " + "; ".join(f"{n}: {', '.join(c.name for c in cs)}"
                                                             for n, cs in self.replaced.items() if cs))
        for group in ([self.plan.head.name], [h.name for h in self.plan.hosts[1:]]):
            wanted = [n for n in group if self.replaced.get(n)]
            if wanted:
                self.on_hosts(lambda conn: stop_and_remove(conn, [c.name for c in self.replaced[conn.target.name]],
                                                           STOP_TIMEOUT_S),
                              wanted, stage="replace", failing="cannot remove the old containers on ")

    def room(self) -> None:
        """The head's ports again (nothing may have taken them meanwhile), every host's available memory."""
        plan, head = self.plan, self.plan.head.name

        def look(conn) -> HostRoom:
            return HostRoom(ask(conn, facts.MEMINFO)["MemAvailable"],
                            ask(conn, facts.PORT_USERS) if conn.target.name == head else None)

        rooms: dict[str, HostRoom] = self.on_hosts(look, stage="check", failing="cannot check memory and ports on ")
        self.check_ports(rooms[head].ports, ignore=False)
        short = {}
        for name, room in rooms.items():
            if room.available_bytes < plan.min_free_gb * 1e9:
                holders = ", ".join(c.name for c in self.others_running.get(name, [])) or "no sparkctl container"
                short[name] = (f"{room.available_bytes / 1e9:.1f} GB available, the engine needs {plan.min_free_gb:g} GB "
                               f"(running: {holders})")
        if short:
            self.fail("check", "not enough free memory on " + ", ".join(short) + " (see each host; stop what holds it, "
                               "or lower gpu_memory_utilization)", short)

    def start(self, log_tail: int) -> None:
        """Every container at once: the engines' rendezvous does not care about order."""
        plan = self.plan
        self.note(f"starting {len(plan.hosts)} container(s) {plan.container} ({plan.image}) on every host at once")

        def run(conn) -> str:
            result = conn.run(self.by_name[conn.target.name].docker_argv, timeout=STEP_TIMEOUT_S * 2)
            if not result.ok:
                raise RuntimeError(one_line(result.stderr or result.stdout or f"docker run exit {result.exit_code}", 300))
            return result.stdout.strip()

        started = self.on_hosts(run)
        for name, container_id in started.items():
            self.report.host(name).container_id = container_id
            self.watches[name] = RankWatch(name, self.by_name[name].rank, plan.container, container_id)
        failed = [h.name for h in plan.hosts if h.name not in started]
        if failed:
            self.collect_failure(log_tail)
            self.fail("start", "docker run failed on " + ", ".join(failed) + "; " + self.undo_start())

    def health(self, timeout_s: float | None, log_tail: int, on_health_attempt: Callable | None) -> None:
        """Poll the head's /health then /v1/models, checking every few seconds that every container still runs."""
        from sparkctl.ops.health import wait_healthy

        plan = self.plan
        limit = timeout_s if timeout_s is not None else plan.health_timeout_s
        self.note(f"waiting for {plan.endpoint}/health and /v1/models (up to {limit:g} s)")
        api_key = next((h.env.get("VLLM_API_KEY") for h in plan.hosts if h.rank == 0), None)  # what the engine got
        # A look every 3 s (one `docker inspect` per host): a rank failing at start ends the wait soon after.
        waited = wait_healthy(plan.endpoint, plan.served_model_name, timeout_s=limit, check_alive=self.why_not_alive,
                              alive_every_s=ALIVE_EVERY_S, on_attempt=on_health_attempt, api_key=api_key)
        self.report.health_seconds = waited.seconds
        self.report.health = waited.probe.to_json()
        if not waited.ok:
            if waited.stopped_by:
                message = f"a container stopped while waiting for the endpoint: {waited.stopped_by}"
            else:
                message = (f"{plan.endpoint} did not become healthy within {limit:g} s ({waited.attempts} attempts); "
                           f"last: {waited.probe.stage}: {waited.probe.detail}")
            self.collect_failure(log_tail)
            self.fail("health", message + "; " + self.undo_start())
        # Answering /v1/models is not serving: a chat, plain and streamed, must work too (smoke's quick part).
        from sparkctl.ops.smoke import run_smoke

        self.note(f"quick smoke of {plan.endpoint}: models, chat, streamed chat")
        smoke = run_smoke(plan.endpoint, model=plan.served_model_name, api_key=api_key, engine=plan.engine, quick=True,
                          timeout_s=120.0)
        self.report.health["smoke"] = smoke.to_json()
        if not smoke.ok:
            self.collect_failure(log_tail)
            self.fail("health", "the endpoint answers /v1/models but the quick smoke failed: "
                      + "; ".join(f"{c.name}: {c.detail}" for c in smoke.failed) + "; " + self.undo_start())

    def why_not_alive(self) -> Optional[str]:
        """None while every rank is the run this serve started, running and never restarted
        (``ops/liveness``); else what happened, host and rank by host and rank."""
        states = self.container_states()
        problems = []
        for host in self.plan.hosts:
            watch = self.watches.get(host.name) or RankWatch(host.name, host.rank, self.plan.container)
            if host.name not in states:
                problems.append(f"{watch.label}: {self.report.host(host.name).error}")
            else:
                problems.append(watch.why_not(states[host.name]))
        return "; ".join(p for p in problems if p) or None

    def record(self, log_tail: int) -> None:
        """Each host's container as it runs now, into the report."""
        for name, container in self.container_states().items():
            outcome = self.report.host(name)
            outcome.container = container
            if container is None or not container.running:
                outcome.ok, outcome.error = False, "container not running after the endpoint became healthy"
        bad = [h.name for h in self.report.hosts if not h.ok]
        if bad:
            self.collect_failure(log_tail)  # every host's logs, read before the rollback removes the containers
            self.fail("health", "healthy endpoint, but the containers on " + ", ".join(bad) + " are not running; "
                      + self.undo_start())

    def commit(self) -> None:
        """Each host's deployment record, now that the deployment serves: a failed serve keeps the previous one."""
        plan = self.plan

        def write(conn) -> None:
            record = next(f for f in self.by_name[conn.target.name].files if f.name == DEPLOYMENT_FILE)
            check_result(conn.run(write_file_argv(plan.remote_dir, record.name, record.mode), stdin=record.content.encode(),
                                  timeout=STEP_TIMEOUT_S), f"write {plan.remote_dir}/{record.name}")

        self.on_hosts(write, stage="record", failing="serving, but cannot write the deployment record on ")

    def undo_start(self) -> str:
        """A serve is all or nothing: the ranks it started are stopped and removed on every host it can
        reach (never half up); returns the state it leaves, for the report."""
        from sparkctl.remote.pool import fan_out

        plan = self.plan

        def remove_rank(conn) -> bool:
            found = [c.name for c in list_containers(conn, plan.profile, plan.container, fresh=True)
                     if c.name == plan.container]
            stop_and_remove(conn, found, UNDO_STOP_TIMEOUT_S)
            return bool(found)

        results = fan_out(self.targets, remove_rank, pool=self.pool, max_workers=self.max_workers)
        removed = [r.name for r in results if r.ok and r.value]
        stuck = [r for r in results if not r.ok]
        self.note("stopping what this serve started: " + (", ".join(removed) or "nothing was running"))
        state = (f"stopped and removed the ranks it started on {', '.join(removed)}" if removed else "no rank was left running")
        if stuck:
            state += ("; could not stop the rank on " + "; ".join(r.error or r.name for r in stuck)
                      + f" (run `sparkctl stop -p {plan.profile}` once it answers)")
        return state + f": nothing of {plan.profile} runs; the previous deployment record is kept"

    def collect_failure(self, log_tail: int) -> None:
        """Every host's container state and the tail of its logs, into the report."""
        plan = self.plan

        def look(conn):
            containers = [c for c in list_containers(conn, plan.profile, plan.container, fresh=True)
                          if c.name == plan.container]
            logs = tail_logs(conn, plan.container, log_tail) if containers else None
            return (containers[0] if containers else None), logs

        for name, (container, logs) in self.on_hosts(look).items():
            outcome = self.report.host(name)
            outcome.container, outcome.logs = container, logs
            if container is not None and not container.running:
                outcome.ok = False
                outcome.error = outcome.error or f"container {container.describe()}"


def check_surface(plan: ServePlan, image_ids: dict[str, str], run_on) -> tuple[str | None, list[str]]:
    """The rendered commands and environments against the engine surface of the image on the hosts:
    (refusal or None, warnings). ``run_on(host, argv)`` -> (ok, stdout) reads a surface there when unknown."""
    from sparkctl.images import surface

    return surface.verify_deployment(plan.engine, plan.engine_version, plan.image, plan.hosts, image_ids, run_on)


def port_conflicts(plan: ServePlan, ports: Optional[facts.PortUsers], others_running: list[Container],
                   ignore: bool) -> str | None:
    """Why the head cannot serve (a port held by something that is not being replaced), or None."""
    if ports is None or ignore:
        return None
    taken = [(what, port) for what, port in plan.head_ports.items() if port in ports.listening]
    if not taken:
        return None
    message = "; ".join(f"port {port} ({what}) is in use by {ports.holder(port)}" for what, port in taken)
    sparkctl = [c for c in others_running if c.profile]
    if sparkctl:
        c = sparkctl[0]
        message += f"; container {c.name} of profile {c.profile} runs there (`sparkctl stop -p {c.profile}` first)"
    return message + "; or pick other ports with --set serving.port=... / distributed.master_port=..."
