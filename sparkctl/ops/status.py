"""``sparkctl status``: the deployment as the hosts see it.

``status`` (and ``logs``, ``stop`` and ``bench``) find the deployment by the containers'
``sparkctl.profile``/``sparkctl.rank`` labels and the head's deployment record, so they need neither
the ``--set`` options of the serve nor the same host selection (``gather_states``, ``find_deployment``).
It also says when the deploy lock is held, and by whom.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Callable, Optional

from sparkctl.commands import facts
from sparkctl.commands.ranks import role_of
from sparkctl.commands.serve import Container, url_host
from sparkctl.config.apikey import api_key_for
from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.ops import drift
from sparkctl.ops.health import probe_endpoint
from sparkctl.ops.lock import current_lock
from sparkctl.ops.steps import Look, Step, StepFailed, StepRun, ask, list_containers
from sparkctl.remote.pool import fan_out
from sparkctl.remote.result import RemoteError
from sparkctl.reporter import Reporter

if TYPE_CHECKING:
    from sparkctl.ops.lock import LockStatus


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


def host_state(conn, profile: str, state_dir: str):
    """(this profile's containers, the deployment record, the tag's image ID now, the running image's layers)"""
    containers = [c for c in list_containers(conn, profile) if c.profile == profile]
    containers.sort(key=lambda c: (not c.running, c.name))
    record = ask(conn, facts.DEPLOYMENT_RECORD, profile, state_dir)
    tag_image_id = layers = None
    if containers:
        # One inspect of the tag answers both while the tag still names the image the container runs
        # (the usual case); the running image's own layers are asked only when the tag has moved.
        doc = ask(conn, facts.IMAGE_DOC, containers[0].image)
        tag_image_id = doc["Id"] if doc is not None else None
        layers = facts.image_doc_layers(doc) if tag_image_id == containers[0].image_id else None
        if layers is None:
            layers = ask(conn, facts.IMAGE_LAYERS, containers[0].image_id)
    record = record if record is not None and record.get("profile") == profile else None
    return containers, record, tag_image_id, layers


def gather_states(inventory, hosts, profile: str, *, pool, max_workers: int = 16) -> list[HostState]:
    results = fan_out([inventory.ssh_target(h) for h in hosts], lambda conn: host_state(conn, profile, inventory.model.paths.state_dir),
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
    lock: Optional["LockStatus"] = None  # the deploy lock, when a run holds it (a serve or stop under way, or a dead one)
    fix: Optional[str] = None  # the command that brings the deployment back, when a rank is down or it does not serve

    @property
    def ok(self) -> bool:
        return self.deployment is not None and not self.problems

    def to_json(self) -> dict:
        d = self.deployment
        members = set(d.hosts) if d else set()
        hosts = []
        for s in self.states:
            # An unreachable host's rank is still known: the deployment record lists the hosts in rank order.
            rank = s.rank if s.rank is not None or not d or s.name not in d.hosts else d.hosts.index(s.name)
            hosts.append({
                "name": s.name, "address": s.address, "reachable": s.reachable, "error": s.error,
                "in_deployment": s.name in members, "rank": rank,
                "role": None if rank is None else role_of(rank),
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
            "lock": self.lock.to_json() if self.lock else None, "fix": self.fix,
        }


# (host names in rank order, the serve's recorded overrides) -> host -> (engine argv, environment,
# docker run argv) as the profile renders them now
ExpectedFor = Callable[[list[str], list[str]], dict[str, tuple[list[str], dict[str, str], list[str]]]]


def gather_status(inventory, hosts, profile, *, pool, probe_timeout_s: float = 5.0,
                  expected_for: Optional[ExpectedFor] = None, env_given: frozenset[str] = frozenset(),
                  reporter: Optional[Reporter] = None) -> StatusReport:
    """How the deployment stands; each host's verdict told to ``reporter`` (None: to no one) as a step."""
    report = _gather_status(inventory, hosts, profile, pool=pool, probe_timeout_s=probe_timeout_s,
                            expected_for=expected_for, env_given=env_given)
    if reporter is not None:
        tell_hosts(report, reporter)
    return report


STATE = "state"  # each host's one step: how the deployment stands there


def tell_hosts(report: StatusReport, reporter: Reporter) -> None:
    """Each host's verdict as a step of the one runner that only looks (status changes nothing; as
    doctor's checks): failed with its problems, skipped outside the deployment, ok with what runs."""
    for state in report.states:
        StepRun([Step(STATE, partial(_host_verdict, report), _never_acts)], state, reporter, host=state.name,
                keep_going=True, relook=False, cannot_look="").look()


def _host_verdict(report: StatusReport, state: HostState) -> Look:
    mine = [p[len(state.name) + 2:] for p in report.problems if p.startswith(f"{state.name}: ")]
    if mine:
        raise StepFailed("; ".join(mine))
    if not state.reachable:
        raise StepFailed(_without_name(state.name, state.error))
    if report.deployment is None or state.name not in report.deployment.hosts or state.container is None:
        return Look(False, "not in the deployment", {"skip": True})
    return Look(False, f"rank {state.rank}: {state.container.name} {state.container.status}")


def _never_acts(state: HostState, look: Look) -> tuple[str, str]:
    raise AssertionError("status never acts")  # its look never says act


def _gather_status(inventory, hosts, profile, *, pool, probe_timeout_s: float, expected_for: Optional[ExpectedFor],
                   env_given: frozenset[str]) -> StatusReport:
    states = gather_states(inventory, hosts, profile.name, pool=pool)
    deployment = find_deployment(states, profile.serving.port, profile.serving.served_model_name)
    report = StatusReport(profile.name, states, deployment, lock=held_lock(inventory, pool))
    if deployment is None:
        unreachable = [s.error or s.name for s in states if not s.reachable]  # each names its host and why
        report.problems.append(f"profile {profile.name} is not deployed on any host"
                               + (f" that answered; unreachable: {'; '.join(unreachable)}" if unreachable else ""))
        return report
    by_name = {s.name: s for s in states}
    for name in deployment.hosts:
        state = by_name.get(name)
        if state is None:
            report.problems.append(f"{name}: in the deployment but not among the hosts asked (--hosts)")
        elif not state.reachable:  # not reached, or a question failed there (e.g. its Docker engine is down)
            report.problems.append(f"{name}: {_without_name(name, state.error)}")
        elif state.container is None:
            report.problems.append(f"{name}: no {profile.name} container")
        elif not state.container.running:
            report.problems.append(f"{name}: container {state.container.name} {state.container.describe()}: "
                                   f"{what_happened(state.container)}")
    for state in states:
        if state.name not in deployment.hosts and state.containers:
            report.problems.append(f"{state.name}: stray container {state.container.name} of profile {profile.name} "
                                   f"outside the deployment (`sparkctl stop -p {profile.name} --hosts {state.name}`)")
    _add_drift(report, [by_name[n] for n in deployment.hosts if n in by_name], profile.image.tag, expected_for, env_given)
    if deployment.endpoint:
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
    down = [n for n in deployment.hosts if n in by_name and by_name[n].reachable
            and (by_name[n].container is None or not by_name[n].container.running)]
    if down or (report.probe is not None and not report.probe.get("ok")):
        report.fix = fix_command(profile.name, (deployment.record or {}).get("overrides") or [])
    return report


def _without_name(name: str, error: Optional[str]) -> str:
    text = error or "could not be asked"
    return text[len(name) + 2:] if text.startswith(f"{name}: ") else text


def what_happened(container: Container) -> str:
    """Why a rank's container is not running, and whether docker brings it back by itself."""
    if container.status == "restarting":
        return "it failed and docker is restarting it (restart policy on-failure)"
    if container.status == "exited" and container.restart_policy == "no":
        return "it is not restarted (started without a restart policy, by an older sparkctl)"
    if container.status == "exited" and container.exit_code == 0:
        return "it ended cleanly (the job was shut down); docker restarts only a failed rank"
    if container.status == "exited" and container.exit_code in (137, 143):
        return ("it was stopped or killed (docker stop/kill, or the kernel's OOM killer); docker does not restart a "
                "rank stopped on purpose, and the other ranks wait for it")
    return "it failed; docker restarts a failed rank (restart policy on-failure) unless it keeps failing"


def fix_command(profile: str, overrides: list[str]) -> str:
    """The serve that brings the deployment back as it was served: the --set recorded then
    (values of --env and --set env.NAME were not recorded: they must be given again, as NAME=...)."""
    parts = ["sparkctl", "serve", "--profile", profile]
    for override in overrides:
        if not isinstance(override, str):
            continue
        if override.startswith("env "):
            parts += ["--env", override[4:].partition("=")[0] + "=..."]
        elif override.endswith("=(not recorded)"):
            parts += ["--set", override.partition("=")[0] + "=..."]
        else:
            parts += ["--set", override]
    return " ".join(shlex.quote(p) if not p.endswith("=...") else p for p in parts)


def held_lock(inventory, pool) -> Optional["LockStatus"]:
    """The deploy lock if held; an unreachable head is reported by the host states, not here."""
    try:
        return current_lock(inventory, pool)
    except (RemoteError, RuntimeError):
        return None


def _add_drift(report: StatusReport, members: list[HostState], tag: str, expected_for: Optional[ExpectedFor],
               env_given: frozenset[str]) -> None:
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
    # Variables given with --env or --set env.X at the serve are recorded by name only: their
    # values cannot be compared, unless this status is given them again.
    record = next((s.record for s in members if s.record), None) or {}
    recorded = [o for o in record.get("overrides") or [] if isinstance(o, str)]
    replay, env_skip = drift.replayable_overrides(recorded, env_given)
    try:
        expected = expected_for([s.name for s in members], replay)
    except SparkctlError as err:
        report.drift.append(f"cannot compare with the profile as it renders now: {err}")
        return
    for name, container in running.items():
        if name in expected:
            argv, env, run_argv = expected[name]
            report.drift += drift.config_drift(name, container.cmd, container.env, argv, env, env_skip,
                                               container.host_config, run_argv)
