"""``sparkctl serve``: the rendered deployment, planned and run on the hosts, under the deploy lock.

Plan (pure, ``plan_serve``): from the render plan (per host: env file, compose file, launch script,
``docker run`` argv) plus a deployment record, the endpoint, the ports the head must have free,
the memory every host must have available, the lock and the audit log. ``--dry-run`` prints it.

Execute (``execute_serve``), the Kamal way:

1. **Deploy lock** on the inventory's head: ``mkdir /var/lib/sparkctl/deploy.lock`` is atomic, and
   the directory holds ``info.json`` (who, when, what). A second serve or stop meanwhile is refused
   with that information; ``--break-lock`` removes a lock whose run is gone.
2. **Facts** from every host at once: this profile's containers (and any same-named one), the image,
   and on the head who listens on the serving and rendezvous ports (doctor's ``ss`` probe). A port
   held by anything but the containers being replaced refuses the deploy before anything changes.
3. **Files**: ``/var/lib/sparkctl/<profile>/{engine.env,compose.yaml,launch.sh,deployment.json}``,
   each written to a temporary name, synced and renamed (argv lists; content on stdin).
4. **Old containers** of the profile (or of the same name) are stopped, the head first (the engines
   then end their workers' jobs in order), and removed. Unlike Kamal, old containers cannot stay
   up until the new ones are healthy: one GB10 holds one copy of the model.
5. The ports are checked again, and every host's MemAvailable against what the engine will take
   (``memory.unified_memory_gb x gpu_memory_utilization``; seed 003's MIN_FREE guard).
6. **Start** every container at once: the engines' rendezvous does not care about order (workers
   retry until the head listens, the head waits for every rank), so ordering would only add time.
7. **Health**: poll the head's ``/health`` then ``/v1/models`` with backoff up to the profile's
   ``serving.health_timeout_s``, checking every few seconds that all containers still run. On
   failure every host's ``docker logs --tail`` and container state are reported, exit 1.
8. One **audit** line on the head (``/var/lib/sparkctl/audit.log``), success or not; then the lock goes.

This module owns the plan, the deploy lock (``DeployLock``, which ``stop`` takes too) and the few
remote steps serve and stop share (``list_containers``, ``stop_and_remove``, ``check_result``).
The argv lists and parsers are ``sparkctl.commands.serve``; ``status``, ``logs`` and ``stop`` are
``sparkctl.ops.status``.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Optional

from sparkctl.commands.docker import remote_profile_dir
from sparkctl.commands.serve import (
    DEPLOYMENT_FILE,
    LOCK_DIR,
    LOCK_HELD,
    PORTS_WITH_USERS_ARGV,
    STOP_TIMEOUT_S,
    Container,
    audit_argv,
    audit_line,
    audit_log,
    break_lock_argv,
    containers_argv,
    lock_argv,
    lock_dir,
    logs_argv,
    parse_containers,
    parse_lock_info,
    parse_port_users,
    remove_argv,
    stop_argv,
    unlock_argv,
    url_host,
    write_file_argv,
)
from sparkctl.commands import probes

LOG_TAIL = 40
STEP_TIMEOUT_S = 60  # one remote command (docker run/stop/inspect, a file write)

Say = Callable[[str], None]


def quiet(_: str) -> None:
    pass


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def who_am_i() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers): still say something
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# ---------------------------------------------------------------------------------------------
# The plan (pure)


@dataclass(frozen=True)
class PlannedFile:
    name: str
    content: str
    mode: int


@dataclass
class ServeHost:
    name: str
    address: str
    rank: int
    env: dict[str, str]
    docker_argv: list[str]
    engine_argv: list[str]
    files: list[PlannedFile]

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


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
                    "env": h.env,
                    "replace": [stop_argv([self.container]), remove_argv([self.container])],
                    "docker_argv": h.docker_argv,
                    "engine_argv": h.engine_argv,
                }
                for h in self.hosts
            ],
            "notes": self.notes,
        }


def deployment_record(plan_fields: dict, host_name: str, rank: int) -> dict:
    return {**plan_fields, "host": host_name, "rank": rank, "role": "head" if rank == 0 else "worker"}


def plan_serve(loaded, inventory, render_plan, *, who: str, when: str) -> ServePlan:
    """The serve of ``render_plan`` (``sparkctl.ops.render``): no I/O."""
    from sparkctl.ops.render import FILE_MODES

    profile = loaded.profile
    by_name = {h.name: h for h in inventory.hosts}
    head_view = by_name[render_plan.hosts[0].name]
    endpoint = f"http://{url_host(head_view.address)}:{profile.serving.port}"
    head_ports = {"serving port": profile.serving.port}
    if profile.tensor_parallel > 1 or len(render_plan.hosts) > 1:
        if profile.engine == "vllm" and profile.distributed.launcher == "ray":
            head_ports["ray port"] = profile.distributed.ray_port
        else:
            head_ports["rendezvous port"] = profile.distributed.master_port
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
    hosts = []
    for rendered in render_plan.hosts:
        view = by_name[rendered.name]
        files = []
        for relative, content in rendered.files.items():
            name = relative.split("/", 1)[1]
            files.append(PlannedFile(name, content, FILE_MODES.get(name, 0o644)))
        record = deployment_record(shared, rendered.name, rendered.rank)
        files.append(PlannedFile(DEPLOYMENT_FILE, json.dumps(record, indent=2) + "\n", 0o644))
        hosts.append(ServeHost(rendered.name, view.address, rendered.rank, rendered.env, rendered.docker_argv,
                               rendered.engine_argv, files))
    memory = profile.memory
    return ServePlan(
        profile=profile.name,
        engine=profile.engine,
        image=profile.image.tag,
        container=profile.container.name,
        remote_dir=remote_dir,
        state_dir=state_dir,
        endpoint=endpoint,
        served_model_name=profile.serving.served_model_name,
        head_ports=head_ports,
        health_timeout_s=float(profile.serving.health_timeout_s),
        min_free_gb=round(memory.unified_memory_gb * profile.gpu_memory_utilization, 2),
        lock_host=inventory.head.name,
        hosts=hosts,
        who=who,
        when=when,
        overrides=loaded.recorded_overrides,
        notes=list(render_plan.notes),
    )


def build_plan(inventory, profile_name: str, *, sets=(), envs=(), wanted_hosts=None,
               who: str | None = None, when: str | None = None) -> ServePlan:
    """Load the profile, render it and plan the serve (reads recipes and templates, touches no host)."""
    from sparkctl.config.profile import load_profile
    from sparkctl.ops.render import render

    render_plan, _ = render(inventory, profile_name, sets=sets, envs=envs, wanted_hosts=wanted_hosts)
    loaded = load_profile(profile_name, sets=sets, envs=envs)
    return plan_serve(loaded, inventory, render_plan, who=who or who_am_i(), when=when or utc_now())


# ---------------------------------------------------------------------------------------------
# The deploy lock


def describe_lock(info: dict, host: str, path: str = LOCK_DIR) -> str:
    if not info:
        return f"the deploy lock {host}:{path} is held (being taken right now, no details yet)"
    age = ""
    try:
        taken = datetime.strptime(info.get("when", ""), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        seconds = int((datetime.now(timezone.utc) - taken).total_seconds())
        age = f", {seconds // 3600}h{seconds % 3600 // 60:02d}m ago" if seconds >= 3600 else f", {seconds // 60}m{seconds % 60:02d}s ago"
    except ValueError:
        pass
    return (f"the deploy lock {host}:{path} is held by {info.get('who', '?')} since {info.get('when', '?')}{age} "
            f"({info.get('what', '?')})")


class LockHeld(Exception):
    pass


class DeployLock:
    """The lock directory on one host; released only by the run that holds it (its token)."""

    def __init__(self, conn, host: str, who: str, what: str, path: str = LOCK_DIR):
        self.conn, self.host, self.path = conn, host, path
        self.token = secrets.token_hex(8)
        self.info = {"who": who, "when": utc_now(), "what": what, "token": self.token}
        self.held = False

    def acquire(self, break_lock: bool = False) -> Optional[dict]:
        """Take it; returns the info of a lock that ``break_lock`` removed (else None). Raises LockHeld."""
        broken = None
        if break_lock:
            current = self.conn.run(["cat", f"{self.path}/info.json"], timeout=STEP_TIMEOUT_S)
            if current.ok or self.conn.run(["test", "-d", self.path], timeout=STEP_TIMEOUT_S).ok:
                broken = parse_lock_info(current.stdout) or {"what": "unknown"}
                check_result(self.conn.run(break_lock_argv(self.path), timeout=STEP_TIMEOUT_S), "remove the deploy lock")
        result = self.conn.run(lock_argv(self.info, self.path), timeout=STEP_TIMEOUT_S)
        if result.exit_code == LOCK_HELD:
            raise LockHeld(describe_lock(parse_lock_info(result.stdout), self.host, self.path)
                           + "; wait for it to finish, or pass --break-lock if that run is gone")
        check_result(result, "take the deploy lock")
        self.held = True
        return broken

    def release(self) -> None:
        if self.held:
            self.conn.run(unlock_argv(self.token, self.path), timeout=STEP_TIMEOUT_S)
            self.held = False


# ---------------------------------------------------------------------------------------------
# Remote steps (serve's, and stop's in sparkctl.ops.status)


def check_result(result, what: str) -> None:
    if not result.ok:
        detail = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}").splitlines()
        raise RuntimeError(f"cannot {what}: {detail[-1] if detail else result.exit_code}")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _write_files(conn, directory: str, files: list[PlannedFile]) -> None:
    for f in files:
        check_result(conn.run(write_file_argv(directory, f.name, f.mode), stdin=f.content.encode(), timeout=STEP_TIMEOUT_S),
               f"write {directory}/{f.name}")


def list_containers(conn, profile: str, name: str = "") -> list[Container]:
    result = conn.run(containers_argv(profile, name), timeout=STEP_TIMEOUT_S)
    check_result(result, "list containers")
    return parse_containers(result.stdout)


def stop_and_remove(conn, names: list[str], timeout_s: int) -> None:
    if not names:
        return
    conn.run(stop_argv(names, timeout_s), timeout=timeout_s + STEP_TIMEOUT_S)
    check_result(conn.run(remove_argv(names), timeout=STEP_TIMEOUT_S), f"remove {', '.join(names)}")


def _tail_logs(conn, name: str, tail: int) -> str:
    result = conn.run(logs_argv(name, tail), timeout=STEP_TIMEOUT_S)
    return result.stdout if result.ok else (result.stdout + result.stderr).strip() or f"(docker logs exit {result.exit_code})"


# ---------------------------------------------------------------------------------------------
# serve


@dataclass
class HostOutcome:
    name: str
    rank: int
    ok: bool = True
    container: Optional[Container] = None
    container_id: str = ""
    replaced: list[str] = field(default_factory=list)
    error: Optional[str] = None
    logs: Optional[str] = None

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"

    def to_json(self) -> dict:
        return {"name": self.name, "rank": self.rank, "role": self.role, "ok": self.ok,
                "container_id": (self.container_id or (self.container.id if self.container else ""))[:12] or None,
                "state": self.container.status if self.container else None,
                "container": self.container.to_json() if self.container else None,
                "replaced": self.replaced, "error": self.error, "logs": self.logs}


@dataclass
class ServeReport:
    plan: ServePlan
    hosts: list[HostOutcome]
    ok: bool = False
    stage: str = "lock"  # the step that failed (or "done")
    message: str = ""
    health: Optional[dict] = None
    seconds: float = 0.0
    health_seconds: Optional[float] = None
    broken_lock: Optional[dict] = None
    audit: Optional[str] = None

    def fail(self, stage: str, message: str) -> "ServeReport":
        self.ok, self.stage, self.message = False, stage, message
        return self

    def host(self, name: str) -> HostOutcome:
        return next(h for h in self.hosts if h.name == name)

    def to_json(self) -> dict:
        return {"ok": self.ok, "profile": self.plan.profile, "endpoint": self.plan.endpoint, "stage": self.stage,
                "message": self.message or None, "served_model_name": self.plan.served_model_name,
                "health": self.health, "seconds": round(self.seconds, 3),
                "health_seconds": None if self.health_seconds is None else round(self.health_seconds, 3),
                "hosts": [h.to_json() for h in self.hosts], "broken_lock": self.broken_lock, "audit": self.audit}


def execute_serve(plan: ServePlan, inventory, *, pool, say: Say = quiet, timeout_s: float | None = None,
                  break_lock: bool = False, log_tail: int = LOG_TAIL, max_workers: int = 16,
                  on_health_attempt: Callable | None = None) -> ServeReport:
    from sparkctl.remote.pool import fan_out
    from sparkctl.remote.result import RemoteError

    started = time.monotonic()
    views = {h.name: h for h in inventory.hosts}
    report = ServeReport(plan, [HostOutcome(h.name, h.rank) for h in plan.hosts])
    targets = [inventory.ssh_target(views[h.name]) for h in plan.hosts]
    by_name = {h.name: h for h in plan.hosts}
    lock_target = inventory.ssh_target(inventory.head)

    def run_all(fn, hosts=None) -> list:
        chosen = targets if hosts is None else [t for t in targets if t.name in hosts]
        results = fan_out(chosen, fn, pool=pool, max_workers=max_workers)
        for result in results:
            if not result.ok:
                outcome = report.host(result.name)
                outcome.ok, outcome.error = False, result.error
        return results

    def failed_names(results) -> list[str]:
        return [r.name for r in results if not r.ok]

    say(f"deploy lock on {plan.lock_host} ({lock_dir(plan.state_dir)})")
    try:
        lock = DeployLock(pool.get(lock_target), plan.lock_host, plan.who, plan.what, lock_dir(plan.state_dir))
        report.broken_lock = lock.acquire(break_lock)
    except LockHeld as err:
        report.seconds = time.monotonic() - started
        return report.fail("lock", str(err))
    except (RemoteError, RuntimeError) as err:
        report.seconds = time.monotonic() - started
        return report.fail("lock", f"cannot take the deploy lock on {plan.lock_host}: {err}")
    if report.broken_lock:
        say(f"broke a stale deploy lock: {describe_lock(report.broken_lock, plan.lock_host, lock_dir(plan.state_dir))}")
    try:
        _serve_locked(plan, report, run_all, failed_names, by_name, say, timeout_s, log_tail, on_health_attempt)
    finally:
        report.seconds = time.monotonic() - started
        line = audit_line(utc_now(), plan.who, "serve", {
            "profile": plan.profile, "hosts": [h.name for h in plan.hosts], "image": plan.image,
            "endpoint": plan.endpoint, "result": "ok" if report.ok else f"failed:{report.stage}",
            "seconds": f"{report.seconds:.1f}", "overrides": plan.overrides or None,
        })
        try:
            conn = pool.get(lock_target)
            if conn.run(audit_argv(line, audit_log(plan.state_dir)), timeout=STEP_TIMEOUT_S).ok:
                report.audit = line
            lock.release()
        except (RemoteError, OSError) as err:
            say(f"warning: could not write the audit line or release the lock on {plan.lock_host}: {err}")
    return report


def _serve_locked(plan, report, run_all, failed_names, by_name, say, timeout_s, log_tail, on_health_attempt) -> None:
    head = plan.head

    # -- facts: containers, image, ports --------------------------------------------------------
    say(f"checking {len(plan.hosts)} host(s): image {plan.image}, containers, ports")

    def facts(conn):
        containers = list_containers(conn, plan.profile, plan.container)
        image = conn.run(probes.image_argv(plan.image), timeout=STEP_TIMEOUT_S)
        ports = None
        if conn.target.name == head.name:
            ports_result = conn.run(PORTS_WITH_USERS_ARGV, timeout=STEP_TIMEOUT_S)
            check_result(ports_result, "list listening ports (ss)")
            ports = ports_result.stdout
        return containers, image.ok, ports

    results = run_all(facts)
    if failed_names(results):
        report.fail("check", "cannot reach or inspect " + ", ".join(failed_names(results)))
        return
    facts_by = {r.name: r.value for r in results}
    missing_image = [name for name, (_, has_image, _) in facts_by.items() if not has_image]
    if missing_image:
        for name in missing_image:
            o = report.host(name)
            o.ok, o.error = False, f"image {plan.image} is not on this host"
        report.fail("check", f"image {plan.image} is missing on {', '.join(missing_image)} "
                             "(build it, or copy it with `sparkctl distribute`)")
        return
    replaced: dict[str, list[Container]] = {}
    others_running: dict[str, list[Container]] = {}
    for name, (containers, _, _) in facts_by.items():
        replaced[name] = [c for c in containers if c.profile == plan.profile or c.name == plan.container]
        others_running[name] = [c for c in containers if c.running and c not in replaced[name]]
        report.host(name).replaced = [f"{c.name} ({c.status})" for c in replaced[name]]
    head_ports_text = facts_by[head.name][2]
    replacing_on_head = any(c.running for c in replaced[head.name])
    conflict = _port_conflicts(plan, head_ports_text, others_running[head.name], ignore=replacing_on_head)
    if conflict:
        o = report.host(head.name)
        o.ok, o.error = False, conflict
        report.fail("check", f"{head.name}: {conflict}")
        return

    # -- files ---------------------------------------------------------------------------------------
    say(f"writing {plan.remote_dir}/{{{','.join(f.name for f in head.files)}}} on every host")
    results = run_all(lambda conn: _write_files(conn, plan.remote_dir, by_name[conn.target.name].files))
    if failed_names(results):
        report.fail("write", "cannot write the deployment files on " + ", ".join(failed_names(results)))
        return

    # -- old containers: the head first, then the workers ---------------------------------------------
    if any(replaced.values()):
        say("stopping the old containers: " + "; ".join(f"{n}: {', '.join(c.name for c in cs)}"
                                                        for n, cs in replaced.items() if cs))
        order = [[head.name], [h.name for h in plan.hosts[1:]]]
        for group in order:
            wanted = [n for n in group if replaced.get(n)]
            if not wanted:
                continue
            results = run_all(lambda conn: stop_and_remove(conn, [c.name for c in replaced[conn.target.name]],
                                                           STOP_TIMEOUT_S), hosts=wanted)
            if failed_names(results):
                report.fail("replace", "cannot remove the old containers on " + ", ".join(failed_names(results)))
                return

    # -- ports again, memory ---------------------------------------------------------------------------
    def room(conn):
        memory = conn.run(probes.MEMINFO_ARGV, timeout=STEP_TIMEOUT_S)
        check_result(memory, "read /proc/meminfo")
        available = probes.parse_meminfo(memory.stdout)["MemAvailable"]
        ports = None
        if conn.target.name == head.name:
            ports_result = conn.run(PORTS_WITH_USERS_ARGV, timeout=STEP_TIMEOUT_S)
            check_result(ports_result, "list listening ports (ss)")
            ports = ports_result.stdout
        return available, ports

    results = run_all(room)
    if failed_names(results):
        report.fail("check", "cannot check memory and ports on " + ", ".join(failed_names(results)))
        return
    rooms = {r.name: r.value for r in results}
    conflict = _port_conflicts(plan, rooms[head.name][1], others_running[head.name], ignore=False)
    if conflict:
        o = report.host(head.name)
        o.ok, o.error = False, conflict
        report.fail("check", f"{head.name}: {conflict}")
        return
    short = []
    for name, (available, _) in rooms.items():
        if available < plan.min_free_gb * 1e9:
            o = report.host(name)
            holders = ", ".join(c.name for c in others_running.get(name, [])) or "no sparkctl container"
            o.ok, o.error = False, (f"{available / 1e9:.1f} GB available, the engine needs {plan.min_free_gb:g} GB "
                                    f"(running: {holders})")
            short.append(name)
    if short:
        report.fail("check", "not enough free memory on " + ", ".join(short) + " (see each host; stop what holds it, "
                             "or lower gpu_memory_utilization)")
        return

    # -- start -----------------------------------------------------------------------------------------
    say(f"starting {len(plan.hosts)} container(s) {plan.container} ({plan.image}) on every host at once")

    def start(conn):
        result = conn.run(by_name[conn.target.name].docker_argv, timeout=STEP_TIMEOUT_S * 2)
        if not result.ok:
            raise RuntimeError(_one_line(result.stderr or result.stdout or f"docker run exit {result.exit_code}"))
        return result.stdout.strip()

    results = run_all(start)
    for result in results:
        if result.ok:
            report.host(result.name).container_id = result.value
    if failed_names(results):
        report.fail("start", "docker run failed on " + ", ".join(failed_names(results)))
        _collect_failure(plan, report, run_all, log_tail)
        return

    # -- health ----------------------------------------------------------------------------------------
    from sparkctl.ops.health import wait_healthy

    limit = timeout_s if timeout_s is not None else plan.health_timeout_s
    say(f"waiting for {plan.endpoint}/health and /v1/models (up to {limit:g} s)")

    def check_alive() -> Optional[str]:
        states = run_all(lambda conn: list_containers(conn, plan.profile, plan.container))
        problems = []
        for result in states:
            if not result.ok:
                problems.append(f"{result.name}: {result.error}")
                continue
            mine = [c for c in result.value if c.name == plan.container]
            if not mine:
                problems.append(f"{result.name}: container {plan.container} is gone")
            elif not mine[0].running:
                problems.append(f"{result.name}: container {plan.container} {mine[0].describe()}")
        return "; ".join(problems) or None

    api_key = next((h.env.get("VLLM_API_KEY") for h in plan.hosts if h.rank == 0), None)  # what the engine got
    waited = wait_healthy(plan.endpoint, plan.served_model_name, timeout_s=limit, check_alive=check_alive,
                          on_attempt=on_health_attempt, api_key=api_key)
    report.health_seconds = waited.seconds
    report.health = waited.probe.to_json()
    if not waited.ok:
        if waited.stopped_by:
            message = f"a container stopped while waiting for the endpoint: {waited.stopped_by}"
        else:
            message = (f"{plan.endpoint} did not become healthy within {limit:g} s ({waited.attempts} attempts); "
                       f"last: {waited.probe.stage}: {waited.probe.detail}")
        report.fail("health", message)
        _collect_failure(plan, report, run_all, log_tail)
        return

    # -- final state per host ----------------------------------------------------------------------------
    results = run_all(lambda conn: list_containers(conn, plan.profile, plan.container))
    for result in results:
        if result.ok:
            mine = [c for c in result.value if c.name == plan.container]
            outcome = report.host(result.name)
            outcome.container = mine[0] if mine else None
            if outcome.container is None or not outcome.container.running:
                outcome.ok = False
                outcome.error = "container not running after the endpoint became healthy"
    bad = [h.name for h in report.hosts if not h.ok]
    if bad:
        report.fail("health", "healthy endpoint, but the containers on " + ", ".join(bad) + " are not running")
        return
    report.ok, report.stage, report.message = True, "done", ""


def _port_conflicts(plan: ServePlan, ss_output: str | None, others_running: list[Container], ignore: bool) -> str | None:
    """Why the head cannot serve (a port held by something that is not being replaced), or None."""
    if ss_output is None:
        return None
    listening = probes.parse_listening_ports(ss_output)
    users = parse_port_users(ss_output)
    taken = [(what, port) for what, port in plan.head_ports.items() if port in listening]
    if not taken or ignore:
        return None
    parts = []
    for what, port in taken:
        holder = users.get(port) or "another process"
        parts.append(f"port {port} ({what}) is in use by {holder}")
    message = "; ".join(parts)
    sparkctl = [c for c in others_running if c.profile]
    if sparkctl:
        c = sparkctl[0]
        message += f"; container {c.name} of profile {c.profile} runs there (`sparkctl stop -p {c.profile}` first)"
    return message + "; or pick other ports with --set serving.port=... / distributed.master_port=..."


def _collect_failure(plan: ServePlan, report: ServeReport, run_all, log_tail: int) -> None:
    """Every host's container state and the tail of its logs, into the report."""

    def look(conn):
        containers = [c for c in list_containers(conn, plan.profile, plan.container) if c.name == plan.container]
        logs = _tail_logs(conn, plan.container, log_tail) if containers else None
        return (containers[0] if containers else None), logs

    for result in run_all(look):
        if result.ok:
            outcome = report.host(result.name)
            outcome.container, outcome.logs = result.value
            if outcome.container is not None and not outcome.container.running:
                outcome.ok = False
                outcome.error = outcome.error or f"container {outcome.container.describe()}"
