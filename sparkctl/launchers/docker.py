"""The docker launcher: every engine in containers, one per host (or replicas behind a router).

Its operations are ``ops/serve``, ``ops/status``, ``ops/logs`` and ``ops/stop`` (the replicas':
``ops/replica_*``); ``up``'s image and serve steps are ``ops/docker_up`` (``ops/replica_up`` with
replicas); its verbs are printed by ``cli/containers_cmd``.
"""

from __future__ import annotations

from sparkctl.launchers.base import Launcher, UpServe
from sparkctl.ops.replica_serve import build_replica_plans
from sparkctl.ops.serve import build_plan
from sparkctl.ops.status import gather_states
from sparkctl.ops.steps import Step
from sparkctl.ops.stop import plan_stop

# What the Engram shards' look sees: each host's engram dir and its checkpoint copy, which only setup
# (the folders) and the checkpoint step change; a new image (build, distribute) leaves its shards' findings
# valid, not its free space (an image loaded on the same disk uses it): the pack reads df again.
ENGRAM_SEES = ("setup", "checkpoint")


class Docker(Launcher):
    name = "docker"
    runs_containers = True
    cli_module = "sparkctl.cli.containers_cmd"

    def plan_up(self, up) -> UpServe:
        options = up.options
        if up.profile.replicas > 1:  # every replica served, the router in front (ops/replica_up.py)
            up.replica_plan = build_replica_plans(up.inventory, up.profile.name, sets=options.sets, envs=options.envs,
                                                  wanted_hosts=options.hosts)
            up.serve_plan = up.replica_plan.serves[0]
            hosts = [name for replica in up.replica_plan.replicas for name in replica.hosts]
            return UpServe(up.serve_plan, hosts, up.replica_plan.router_endpoint, up.serve_plan.served_model_name)
        up.serve_plan = build_plan(up.inventory, up.profile.name, sets=options.sets, envs=options.envs,
                                   wanted_hosts=options.hosts)
        return UpServe(up.serve_plan, [p.name for p in up.serve_plan.hosts], up.serve_plan.endpoint,
                       up.serve_plan.served_model_name)

    def up_steps(self, up) -> tuple[list[Step], Step]:
        # here, not at the top: up's steps pull in the image, engram and checkpoint machinery (jinja2,
        # the metrics parser, the agents; half of what `status` would import), and only `up` runs them
        from sparkctl.ops import docker_up, replica_up

        engram = Step("engram", docker_up.look_engram, docker_up.act_engram, sees=ENGRAM_SEES)
        serve = Step("serve", docker_up.look_serve, docker_up.act_serve)
        if up.replica_plan is not None:
            engram = Step("engram", replica_up.look_engram, replica_up.act_engram, sees=ENGRAM_SEES)
            serve = Step("serve", replica_up.look_serve, replica_up.act_serve)
        return [Step("build", docker_up.look_build, docker_up.act_build),
                Step("distribute", docker_up.look_distribute, docker_up.act_distribute), engram], serve

    def engine_running(self, up) -> bool:
        # whether a container runs, no more: the image is not asked about (one docker less a host)
        states = gather_states(up.inventory, up.hosts, up.profile.name, pool=up.pool, images=False)
        return any(s.container is not None and s.container.running for s in states)

    def plan_stop(self, inventory, hosts, loaded, *, pool, max_workers: int = 16) -> dict:
        return plan_stop(inventory, hosts, loaded, pool=pool, max_workers=max_workers)


LAUNCHER = Docker()
