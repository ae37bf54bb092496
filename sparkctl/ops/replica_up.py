"""The ``up`` steps that differ for ``replicas: N``: Engram shards and serve, replica by replica.

* **engram**: each replica cuts its own shards (its ranks are 0..TP-1 on its own hosts).
* **serve** looks at every replica as its own deployment (down, drifted, other hosts) and at the
  router (container, options, image, its worker list); it restarts only the replicas that need it,
  one at a time out of the router (``--parallel``: at once), then makes the router serve all.
* **smoke** asks the router: the endpoint applications use.
"""

from __future__ import annotations

from sparkctl.ops.replica_serve import ReplicaSetPlan


def look_engram(up):
    from sparkctl.ops import engram as ops
    from sparkctl.ops.steps import Look, StepFailed

    if up.profile.engram.mode != "disk":
        return Look(False, f"Engram is kept in memory (engram.mode={up.profile.engram.mode}): no shards", {"skip": True})
    plans, parts, shards, todo_count = [], [], 0, 0
    for replica in up.replica_plan.replicas:
        plan, _, problems = ops.plan_pack_on_hosts(up.profile, up.inventory, list(replica.hosts), None, up.pool)
        if problems:
            raise StepFailed(f"{replica.name}: " + "; ".join(problems.values()))
        actions = ops.shard_actions(plan, up.inventory, pool=up.pool)
        todo = {host: [a for a in acts if a.action != ops.SKIP] for host, acts in actions.items()}
        shards += sum(len(acts) for acts in actions.values())
        if any(todo.values()):
            plans.append(plan)
            todo_count += sum(map(len, todo.values()))
            parts += [f"{replica.name} {host}: {len(acts)}" for host, acts in todo.items() if acts]
    if not plans:
        return Look(False, f"{shards} shard(s) present and verified on the {len(up.replica_plan.replicas)} replicas")
    return Look(True, f"cut {todo_count} of {shards} shard(s): " + "; ".join(parts), {"plans": plans})


def act_engram(up, look):
    from sparkctl.ops.engram_pack import pack
    from sparkctl.ops.steps import CHANGED

    for plan in look.detail["plans"]:
        pack(plan, up.inventory, on_hosts=True, out=up.out, pool=up.pool).outcome()  # a failed host raises
    return CHANGED, look.reason


def _replica_needs(up, plan: ReplicaSetPlan) -> list[tuple[int, str]]:
    """(replica index, why it must restart) for each replica not running as the profile renders now."""
    from sparkctl.ops.replica_status import _replica_status

    needs = []
    for replica, serve in zip(plan.replicas, plan.serves):
        status = _replica_status(up.inventory, up.profile, replica, up.pool, up.options.sets, up.options.envs)
        deployment = status.deployment
        wanted = [h.name for h in serve.hosts]
        if deployment is None:
            needs.append((replica.index, f"{replica.name} is not deployed"))
        elif deployment.hosts != wanted:
            needs.append((replica.index, f"{replica.name} runs on {', '.join(deployment.hosts)}, "
                                         f"the profile wants {', '.join(wanted)}"))
        elif status.problems or status.drift:
            needs.append((replica.index, f"{replica.name}: {(status.problems + status.drift)[0]}"))
    return needs


def _router_needs(up, plan: ReplicaSetPlan) -> list[str]:
    from sparkctl.config.apikey import api_key_for
    from sparkctl.ops.replica_status import _router_workers
    from sparkctl.ops.router import look_router

    head = next(h for h in up.inventory.hosts if h.name == plan.router_host)
    look = look_router(up.pool.get(up.inventory.ssh_target(head)), up.profile, api_key_for(up.profile))
    if not look.as_wanted:
        return [f"router: {'; '.join(look.reasons)}"]
    workers, state = _router_workers(plan.router_endpoint, api_key_for(up.profile))
    if workers is None:
        return [f"router: {state}"]
    listed = {w["url"]: w for w in workers}
    wanted = [s.endpoint for s in plan.serves]
    missing = [u for u in wanted if u not in listed or listed[u]["model_id"] != plan.served_model_name]
    extra = [u for u in listed if u not in wanted]
    return ([f"router lacks {', '.join(missing)}"] if missing else []) + \
           ([f"router sends to {', '.join(extra)} (not a replica)"] if extra else [])


def look_serve(up):
    from sparkctl.ops.steps import Look

    plan = up.replica_plan
    needs = _replica_needs(up, plan)
    router = _router_needs(up, plan)
    if not needs and not router:
        return Look(False, f"{len(plan.replicas)} replicas run as the profile renders now; the router "
                           f"{plan.router_endpoint} sends to all of them")
    reasons = [why for _, why in needs] + router
    return Look(True, "; ".join(reasons), {"restart": [index for index, _ in needs]})


def act_serve(up, look):
    from sparkctl.ops.replica_serve import serve_replicas_locked

    up.reporter.note(f"serving: {look.reason}")
    report = serve_replicas_locked(up.replica_plan, up.inventory, pool=up.pool, reporter=up.reporter,
                                   restart=look.detail["restart"], parallel=up.options.parallel,
                                   timeout_s=up.options.health_timeout_s)
    up.replica_report = report
    return report.outcome(look.reason)
