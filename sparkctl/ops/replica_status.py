"""``status`` of a replicated profile: every replica as its own deployment, the router's view of each.

A replica's state comes from its hosts (containers, records, drift: ``ops/status.gather_status``
on the replica's hosts, asking the replica's own head), the router's view from its ``/workers``
(listed and healthy = in rotation; listed and unhealthy = the router stopped sending to it; absent
= out of the router). The health that counts for applications is asked through the router.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Optional

from sparkctl.commands import router as R
from sparkctl.config.apikey import api_key_for
from sparkctl.config.profile import parse_assignment
from sparkctl.ops.health import probe_endpoint
from sparkctl.ops.render import render
from sparkctl.ops.replicas import split_replicas
from sparkctl.ops.router import RouterClient
from sparkctl.ops.status import gather_status


@dataclass
class ReplicaState:
    replica: object  # ops.replicas.Replica
    status: object  # ops.status.StatusReport
    endpoint: Optional[str]
    router_view: str = "unknown"

    @property
    def serving(self) -> bool:
        return self.status.ok

    def to_json(self) -> dict:
        doc = self.status.to_json()
        return {"replica": self.replica.index + 1, "hosts": list(self.replica.hosts), "head": self.replica.head,
                "endpoint": self.endpoint, "state": "serving" if self.serving else "down",
                "router_view": self.router_view, "problems": doc["problems"], "drift": doc["drift"],
                "health": doc["health"], "containers": [h for h in doc["hosts"] if h["in_deployment"]]}


@dataclass
class ReplicaStatusReport:
    profile: object
    endpoint: str
    router_state: str
    replicas: list[ReplicaState]
    health: Optional[dict] = None
    problems: list[str] = field(default_factory=list)
    fix: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not self.problems and all(r.serving for r in self.replicas)

    def to_json(self) -> dict:
        return {"profile": self.profile.name, "ok": self.ok, "deployed": True, "endpoint": self.endpoint,
                "router": {"state": self.router_state, "policy": self.profile.router.policy,
                           "image": R.router_image(self.profile)},
                "replicas": [r.to_json() for r in self.replicas], "health": self.health,
                "problems": self.problems, "drift": [d for r in self.replicas for d in r.status.drift], "fix": self.fix}


def router_view(workers: Optional[list[dict]], url: Optional[str]) -> str:
    if workers is None:
        return "unknown (the router does not answer)"
    entry = next((w for w in workers if w["url"] == url), None)
    if entry is None:
        return "out of the router"
    if not entry["healthy"]:
        return "listed, unhealthy: the router sends it nothing"
    return f"in rotation (load {entry['load']})"


def _router_workers(plan_endpoint: str, api_key) -> tuple[Optional[list[dict]], str]:
    client = RouterClient(plan_endpoint, api_key, timeout_s=5.0)
    try:
        if not client.healthy():
            return None, "not answering"
        return client.workers(), "serving"
    except Exception as err:  # noqa: BLE001 - a router that answers oddly is reported, not raised
        return None, f"answers /health but not /workers ({' '.join(str(err).split())[:120]})"
    finally:
        client.close()


def _replica_status(inventory, profile, replica, pool, sets, envs):
    def expected_for(names, recorded):
        plan, _ = render(inventory, profile.name, sets=list(recorded) + list(replica.sets), envs=envs,
                         wanted_hosts=names)
        return {h.name: (h.engine_argv, h.env, h.docker_argv) for h in plan.hosts}

    views = [h for name in replica.hosts for h in inventory.hosts if h.name == name]
    env_given = frozenset(parse_assignment(e, "--env")[0] for e in envs)
    return gather_status(inventory, views, profile, pool=pool, expected_for=expected_for, env_given=env_given)


def gather_replica_status(inventory, loaded, *, pool, sets=(), envs=()) -> ReplicaStatusReport:
    profile = loaded.profile
    replicas, _ = split_replicas(profile, inventory.hosts, None, sets)
    head = next(h for h in inventory.hosts if h.name == replicas[0].head)
    endpoint = R.endpoint(head.address, profile.router.port)
    api_key = api_key_for(profile)
    states = []
    for replica in replicas:
        status = _replica_status(inventory, profile, replica, pool, sets, envs)
        url = status.deployment.endpoint if status.deployment else None
        states.append(ReplicaState(replica, status, url))
    workers, router_state = _router_workers(endpoint, api_key)
    report = ReplicaStatusReport(profile, endpoint, router_state, states)
    for state in states:
        state.router_view = router_view(workers, state.endpoint)
        for problem in state.status.problems:
            report.problems.append(f"{state.replica.name} ({', '.join(state.replica.hosts)}): {problem}")
    if workers is None:
        report.problems.append(f"router {endpoint}: {router_state} (`sparkctl serve --profile {profile.name}` "
                               "starts it; the replicas answer on their own endpoints meanwhile)")
    probe = probe_endpoint(endpoint, profile.serving.served_model_name, timeout_s=5.0, api_key=api_key)
    report.health = probe.to_json()
    if not probe.ok and workers is not None:
        report.problems.append(f"{endpoint}: not serving through the router ({probe.stage}: {probe.detail})")
    down = [s for s in states if not s.serving]
    if down:
        names = ", ".join(str(s.replica.index + 1) for s in down)
        given = "".join(f" --set {shlex.quote(s)}" for s in sets)
        report.fix = (f"sparkctl serve --profile {profile.name}{given} --replica {names}  (restarts only "
                      f"{'that replica' if len(down) == 1 else 'those replicas'}; the others keep serving"
                      " through the router)")
    return report
