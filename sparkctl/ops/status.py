"""``sparkctl status`` / ``logs`` / ``stop``: the deployment as the hosts see it, and its removal.

``status`` and ``logs`` find the deployment by the containers' ``sparkctl.profile``/``sparkctl.rank``
labels and the head's deployment record, so they need neither the ``--set`` options of the serve nor
the same host selection (``gather_states``, ``find_deployment``; ``sparkctl bench`` reads the endpoint
the same way). ``stop`` takes serve's deploy lock, stops the head first, removes the profile's
containers on every host and their deployment records (idempotent), and writes one audit line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Optional

from sparkctl.commands import probes
from sparkctl.commands.serve import (
    STOP_TIMEOUT_S,
    Container,
    audit_argv,
    audit_line,
    audit_log,
    image_layers_argv,
    lock_dir,
    logs_argv,
    parse_image_layers,
    record_argv,
    remove_record_argv,
    url_host,
)
from sparkctl.ops.serve import (
    STEP_TIMEOUT_S,
    DeployLock,
    LockHeld,
    Say,
    check_result,
    describe_lock,
    list_containers,
    quiet,
    stop_and_remove,
    utc_now,
    who_am_i,
)


@dataclass
class HostState:
    name: str
    address: str
    reachable: bool = True
    error: Optional[str] = None
    containers: list[Container] = field(default_factory=list)  # this profile's
    record: Optional[dict] = None
    tag_image_id: Optional[str] = None  # what the container's image tag names on the host now (None: gone)
    running_layers: Optional[tuple[str, ...]] = None  # the content of the image the container runs

    @property
    def container(self) -> Optional[Container]:
        return self.containers[0] if self.containers else None

    @property
    def rank(self) -> Optional[int]:
        if self.record is not None and isinstance(self.record.get("rank"), int):
            return self.record["rank"]
        return self.container.rank if self.container else None


def _host_state(conn, profile: str, state_dir: str):
    """(this profile's containers, the deployment record, the tag's image ID now, the running image's layers)"""
    containers = [c for c in list_containers(conn, profile) if c.profile == profile]
    containers.sort(key=lambda c: (not c.running, c.name))
    raw = conn.run(record_argv(profile, state_dir), timeout=STEP_TIMEOUT_S).stdout
    try:
        record = json.loads(raw) if raw.strip() else None
    except json.JSONDecodeError:
        record = None
    tag_image_id = layers = None
    if containers:
        tagged = conn.run(probes.image_argv(containers[0].image), timeout=STEP_TIMEOUT_S)
        tag_image_id = tagged.stdout.strip() if tagged.ok else None
        inspected = conn.run(image_layers_argv(containers[0].image_id), timeout=STEP_TIMEOUT_S)
        layers = parse_image_layers(inspected.stdout) if inspected.ok else None
    record = record if isinstance(record, dict) and record.get("profile") == profile else None
    return containers, record, tag_image_id, layers


def gather_states(inventory, hosts, profile: str, *, pool, max_workers: int = 16) -> list[HostState]:
    from sparkctl.remote.pool import fan_out

    results = fan_out([inventory.ssh_target(h) for h in hosts], lambda conn: _host_state(conn, profile, inventory.model.paths.state_dir),
                      pool=pool, max_workers=max_workers)
    states = []
    for host, result in zip(hosts, results):
        state = HostState(host.name, host.address)
        if result.ok:
            state.containers, state.record, state.tag_image_id, state.running_layers = result.value
        else:
            state.reachable, state.error = False, result.error
        states.append(state)
    return states


@dataclass
class Deployment:
    """What the hosts say is deployed: the head's record (or, without one, the containers' labels)."""

    hosts: list[str]  # rank order
    head: Optional[str]
    endpoint: Optional[str]
    served_model_name: Optional[str]
    record: Optional[dict]


def find_deployment(states: list[HostState], fallback_port: int, fallback_model: str | None) -> Optional[Deployment]:
    heads = [s for s in states if s.record and s.record.get("rank") == 0]
    if heads:
        record = heads[0].record
        return Deployment(list(record.get("hosts") or [heads[0].name]), heads[0].name, record.get("endpoint"),
                          record.get("served_model_name"), record)
    labelled = [s for s in states if s.containers]
    if not labelled:
        return None
    labelled.sort(key=lambda s: (s.rank is None, s.rank if s.rank is not None else 0))
    head = next((s for s in labelled if s.rank == 0), None)
    endpoint = f"http://{url_host(head.address)}:{fallback_port}" if head else None
    return Deployment([s.name for s in labelled], head.name if head else None, endpoint, fallback_model, None)


@dataclass
class StatusReport:
    profile: str
    states: list[HostState]
    deployment: Optional[Deployment]
    probe: Optional[dict] = None
    problems: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)  # notices: what changed since the serve (see ops/drift.py)

    @property
    def ok(self) -> bool:
        return self.deployment is not None and not self.problems

    def to_json(self) -> dict:
        d = self.deployment
        members = set(d.hosts) if d else set()
        hosts = []
        for s in self.states:
            hosts.append({
                "name": s.name, "address": s.address, "reachable": s.reachable, "error": s.error,
                "in_deployment": s.name in members, "rank": s.rank,
                "role": None if s.rank is None else ("head" if s.rank == 0 else "worker"),
                "container": s.container.to_json() if s.container else None,
                "state": s.container.status if s.container else None,
            })
        return {
            "profile": self.profile, "ok": self.ok, "deployed": d is not None,
            "endpoint": d.endpoint if d else None, "served_model_name": d.served_model_name if d else None,
            "deployed_by": (d.record or {}).get("who") if d else None,
            "deployed_at": (d.record or {}).get("when") if d else None,
            "image": (d.record or {}).get("image") if d else None,
            "hosts": hosts, "health": self.probe, "problems": self.problems, "drift": self.drift,
        }


# (host names in rank order, the serve's recorded overrides) -> host -> (engine argv, environment,
# docker run argv) as the profile renders them now
ExpectedFor = Callable[[list[str], list[str]], dict[str, tuple[list[str], dict[str, str], list[str]]]]


def gather_status(inventory, hosts, profile, *, pool, probe_timeout_s: float = 5.0,
                  expected_for: Optional[ExpectedFor] = None, env_given: frozenset[str] = frozenset()) -> StatusReport:
    from sparkctl.ops.health import probe_endpoint

    states = gather_states(inventory, hosts, profile.name, pool=pool)
    deployment = find_deployment(states, profile.serving.port, profile.serving.served_model_name)
    report = StatusReport(profile.name, states, deployment)
    if deployment is None:
        unreachable = [s.name for s in states if not s.reachable]
        report.problems.append(f"profile {profile.name} is not deployed on any host"
                               + (f" that answered (unreachable: {', '.join(unreachable)})" if unreachable else ""))
        return report
    by_name = {s.name: s for s in states}
    for name in deployment.hosts:
        state = by_name.get(name)
        if state is None:
            report.problems.append(f"{name}: in the deployment but not among the hosts asked (--hosts)")
        elif not state.reachable:
            report.problems.append(f"{name}: unreachable: {state.error}")
        elif state.container is None:
            report.problems.append(f"{name}: no {profile.name} container")
        elif not state.container.running:
            report.problems.append(f"{name}: container {state.container.name} {state.container.describe()}")
    for state in states:
        if state.name not in deployment.hosts and state.containers:
            report.problems.append(f"{state.name}: stray container {state.container.name} of profile {profile.name} "
                                   f"outside the deployment (`sparkctl stop -p {profile.name} --hosts {state.name}`)")
    _add_drift(report, [by_name[n] for n in deployment.hosts if n in by_name], profile.image.tag, expected_for, env_given)
    if deployment.endpoint:
        from sparkctl.config.apikey import api_key_for
        from sparkctl.errors import ConfigError

        try:
            api_key = api_key_for(profile)
        except ConfigError as err:  # still probe: /health answers without a key
            api_key = None
            report.problems.append(f"API key: {err}")
        probe = probe_endpoint(deployment.endpoint, deployment.served_model_name, timeout_s=probe_timeout_s,
                               api_key=api_key)
        report.probe = probe.to_json()
        if not probe.ok:
            report.problems.append(f"{deployment.endpoint}: not serving ({probe.stage}: {probe.detail})")
    else:
        report.problems.append("no rank-0 container: no endpoint to ask")
    return report


def _add_drift(report: StatusReport, members: list[HostState], tag: str, expected_for: Optional[ExpectedFor],
               env_given: frozenset[str]) -> None:
    from sparkctl.errors import SparkctlError
    from sparkctl.ops import drift

    running = {s.name: s.container for s in members if s.container is not None and s.container.running}
    by_name = {s.name: s for s in members}
    images = drift.image_drift({n: c.image_id for n, c in running.items()},
                               {n: by_name[n].tag_image_id for n in running},
                               {n: by_name[n].running_layers for n in running},
                               next(iter(running.values())).image if running else tag)
    report.problems += images.problems
    report.drift += images.notices
    if expected_for is None or not running:
        return
    # Variables given with --env at the serve are recorded by name only: their values cannot be
    # compared, unless this status is given them again.
    record = next((s.record for s in members if s.record), None) or {}
    recorded = [o for o in record.get("overrides") or [] if isinstance(o, str)]
    env_skip = {o[4:].partition("=")[0] for o in recorded if o.startswith("env ")} - env_given
    try:
        expected = expected_for([s.name for s in members], recorded)
    except SparkctlError as err:
        report.drift.append(f"cannot compare with the profile as it renders now: {err}")
        return
    for name, container in running.items():
        if name in expected:
            argv, env, run_argv = expected[name]
            report.drift += drift.config_drift(name, container.cmd, container.env, argv, env, env_skip,
                                               container.host_config, run_argv)


@dataclass
class StopOutcome:
    name: str
    ok: bool = True
    removed: list[str] = field(default_factory=list)  # "name (state before)"
    error: Optional[str] = None

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "removed": self.removed, "error": self.error}


@dataclass
class StopReport:
    profile: str
    hosts: list[StopOutcome]
    ok: bool = True
    stage: str = "stop"  # "lock" when the deploy lock could not be taken (nothing was looked at)
    message: str = ""
    audit: Optional[str] = None

    def to_json(self) -> dict:
        return {"profile": self.profile, "ok": self.ok, "stage": self.stage, "message": self.message or None,
                "hosts": [h.to_json() for h in self.hosts] if self.stage != "lock" else [], "audit": self.audit}


def execute_stop(inventory, hosts, profile: str, *, pool, say: Say = quiet, break_lock: bool = False,
                 stop_timeout_s: int = STOP_TIMEOUT_S, max_workers: int = 16) -> StopReport:
    """Stop and remove ``profile``'s containers on ``hosts`` (head first) and their deployment records."""
    from sparkctl.remote.pool import fan_out
    from sparkctl.remote.result import RemoteError

    report = StopReport(profile, [StopOutcome(h.name) for h in hosts])
    outcome = {o.name: o for o in report.hosts}
    lock_target = inventory.ssh_target(inventory.head)
    state_dir = inventory.model.paths.state_dir
    who = who_am_i()
    try:
        lock = DeployLock(pool.get(lock_target), inventory.head.name, who, f"stop {profile}", lock_dir(state_dir))
        broken = lock.acquire(break_lock)
    except LockHeld as err:
        report.ok, report.stage, report.message = False, "lock", str(err)
        return report
    except (RemoteError, RuntimeError) as err:
        report.ok, report.stage = False, "lock"
        report.message = f"cannot take the deploy lock on {inventory.head.name}: {err}"
        return report
    if broken:
        say(f"broke a stale deploy lock: {describe_lock(broken, inventory.head.name, lock_dir(state_dir))}")
    try:
        states = gather_states(inventory, hosts, profile, pool=pool, max_workers=max_workers)
        for state in states:
            if not state.reachable:
                o = outcome[state.name]
                o.ok, o.error = False, state.error
        reachable = [s for s in states if s.reachable]
        heads = [s for s in reachable if any(c.rank == 0 for c in s.containers)]
        rest = [s for s in reachable if s not in heads]
        by_name = {h.name: h for h in hosts}
        for group in (heads, rest):
            if not group:
                continue
            if any(s.containers for s in group):
                say("stopping " + "; ".join(f"{s.name}: {', '.join(c.name for c in s.containers)}" for s in group if s.containers))

            def stop_one(conn, states_by={s.name: s for s in group}):
                state = states_by[conn.target.name]
                stop_and_remove(conn, [c.name for c in state.containers], stop_timeout_s)
                conn.run(remove_record_argv(profile, state_dir), timeout=STEP_TIMEOUT_S)
                return [f"{c.name} ({c.status})" for c in state.containers]

            results = fan_out([inventory.ssh_target(by_name[s.name]) for s in group], stop_one, pool=pool,
                              max_workers=max_workers)
            for result in results:
                o = outcome[result.name]
                if result.ok:
                    o.removed = result.value
                else:
                    o.ok, o.error = False, result.error
        report.ok = all(o.ok for o in report.hosts)
        if not report.ok:
            report.message = "could not stop on " + ", ".join(o.name for o in report.hosts if not o.ok)
    finally:
        line = audit_line(utc_now(), who, "stop", {
            "profile": profile, "hosts": [h.name for h in hosts],
            "removed": [f"{o.name}:{len(o.removed)}" for o in report.hosts],
            "result": "ok" if report.ok else "failed",
        })
        try:
            if pool.get(lock_target).run(audit_argv(line, audit_log(state_dir)), timeout=STEP_TIMEOUT_S).ok:
                report.audit = line
            lock.release()
        except (RemoteError, OSError) as err:
            say(f"warning: could not write the audit line or release the lock on {inventory.head.name}: {err}")
    return report


def collect_logs(inventory, states: list[HostState], *, pool, tail: int | None, max_workers: int = 16) -> dict[str, str]:
    """``docker logs`` of each state's container (host name -> text)."""
    from sparkctl.remote.pool import fan_out

    by_name = {h.name: h for h in inventory.hosts}
    chosen = [s for s in states if s.container is not None]
    containers = {s.name: s.container.name for s in chosen}

    def read(conn):
        result = conn.run(logs_argv(containers[conn.target.name], tail), timeout=STEP_TIMEOUT_S * 2)
        check_result(result, "read the container's logs")
        return result.stdout

    results = fan_out([inventory.ssh_target(by_name[s.name]) for s in chosen], read, pool=pool, max_workers=max_workers)
    return {r.name: (r.value if r.ok else f"(error: {r.error})") for r in results}


def follow_logs(inventory, states: list[HostState], *, pool, tail: int | None, write: Callable[[str], None]) -> None:
    """``docker logs --follow`` on every chosen host at once, each line prefixed with the host name."""
    import threading

    by_name = {h.name: h for h in inventory.hosts}
    chosen = [s for s in states if s.container is not None]
    width = max((len(s.name) for s in chosen), default=0)
    lock = threading.Lock()

    def one(state: HostState) -> None:
        buffer = b""

        def sink(data: bytes) -> None:
            nonlocal buffer
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            with lock:
                for line in lines:
                    write(f"{state.name:<{width}} | {line.decode('utf-8', 'replace')}")

        conn = pool.get(inventory.ssh_target(by_name[state.name]))
        try:
            conn.run_stream_out(logs_argv(state.container.name, tail, follow=True), sink)
        except Exception as err:  # the host went away: say so and let the others go on
            with lock:
                write(f"{state.name:<{width}} | (log stream ended: {err})")

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in chosen]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
