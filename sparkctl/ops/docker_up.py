"""``up``'s steps for the docker launcher: the image (build, distribute, Engram shards) and the serve.

The docker launcher's part of up's steps (``launchers/docker.py`` hands them to ``Up.compose``), as
``native_up`` is the native launcher's and ``replica_up`` the replicas': the image chain built on
the build host when a layer's inputs changed, copied to every host whose tag names another image,
every rank's Engram shards cut on its host, and the containers served when the deployment does
not run as the profile renders now. Each function takes the ``Up`` run it serves.
"""

from __future__ import annotations

import contextlib
from functools import partial

from sparkctl.commands import facts
from sparkctl.images.chain import chain_for_profile
from sparkctl.images.engine import CliEngine
from sparkctl.images.plan import plan_build
from sparkctl.ops import engram
from sparkctl.ops.engram_pack import pack
from sparkctl.ops.build import BuildOptions, run_build, stale_layers
from sparkctl.ops.distribute import DistributeOptions, run_distribute
from sparkctl.ops.render import render
from sparkctl.ops.serve import HostOutcome, ServeReport, serve_locked
from sparkctl.ops.status import gather_status
from sparkctl.ops.steps import Look, StepFailed, ask
from sparkctl.remote.pool import fan_out


def look_build(up) -> Look:
    plan = image_plan(up)
    with build_engine(up) as engine:
        stale = stale_layers(plan, engine)
    if not stale:
        return Look(False, f"{plan.image} on {up.build_host.name} is built from the current inputs")
    return Look(True, f"build {', '.join(stale)} of {plan.image} on {up.build_host.name} (inputs changed or absent)",
                {"stale": stale})


def act_build(up, look: Look) -> tuple[str, str]:
    with build_engine(up) as engine:
        return run_build(image_plan(up), engine, BuildOptions(), up.out).outcome(up.build_host.name)


def look_distribute(up) -> Look:
    tag = up.serve_plan.image
    targets = [up.inventory.ssh_target(h) for h in {up.build_host.name: up.build_host, **{h.name: h for h in up.hosts}}.values()]
    results = fan_out(targets, lambda conn: ask(conn, facts.IMAGE_ID, tag), pool=up.pool)
    unreachable = [f"{r.name}: {r.error}" for r in results if not r.ok]
    if unreachable:
        raise StepFailed("cannot ask for the image on " + "; ".join(unreachable))
    ids = {r.name: r.value for r in results}
    source = ids.get(up.build_host.name)
    behind = [h.name for h in up.hosts if h.name != up.build_host.name and (source is None or ids[h.name] != source)]
    if not behind:
        return Look(False, f"{tag} is {source[7:19]} on every host")
    return Look(True, f"copy {tag} from {up.build_host.name} to {', '.join(behind)} (absent or another image)",
                {"hosts": behind})


def act_distribute(up, look: Look) -> tuple[str, str]:
    options = DistributeOptions(tag=up.serve_plan.image, hosts=look.detail["hosts"], source=up.build_host.name,
                                accept_new_host_keys=up.pool.accept_new_host_keys)
    return run_distribute(up.inventory, options, up.out, pool=up.pool).outcome(up.build_host.name)


def look_engram(up) -> Look:
    if up.profile.engram.mode != "disk":
        return Look(False, f"Engram is kept in memory (engram.mode={up.profile.engram.mode}): no shards", {"skip": True})
    plan, _, problems = engram.plan_pack_on_hosts(up.profile, up.inventory, [h.name for h in up.hosts], None, up.pool)
    if problems:
        raise StepFailed("; ".join(problems.values()))
    actions = engram.shard_actions(plan, up.inventory, pool=up.pool)
    todo = {host: [a for a in acts if a.action != engram.SKIP] for host, acts in actions.items()}
    shards = sum(len(acts) for acts in actions.values())
    if not any(todo.values()):
        return Look(False, f"{shards} shard(s) present and verified on {len(actions)} host(s)")
    parts = [f"{host}: {', '.join(f'{a.shard.name} ({a.reason})' for a in acts)}" for host, acts in todo.items() if acts]
    return Look(True, f"cut {sum(map(len, todo.values()))} of {shards} shard(s) on the hosts: " + "; ".join(parts),
                {"plan": plan})


def act_engram(up, look: Look) -> tuple[str, str]:
    return pack(look.detail["plan"], up.inventory, on_hosts=True, out=up.out, pool=up.pool).outcome()


def look_serve(up) -> Look:
    status = gather_status(up.inventory, up.inventory.hosts, up.profile, pool=up.pool,
                           expected_for=partial(expected_for, up), env_given=frozenset(e.partition("=")[0] for e in up.options.envs))
    deployment = status.deployment
    wanted = [h.name for h in up.serve_plan.hosts]
    if deployment is None:
        return Look(True, f"{up.profile.name} is not deployed", {"status": status})
    if deployment.hosts != wanted:
        return Look(True, f"deployed on {', '.join(deployment.hosts)}, the profile wants {', '.join(wanted)}",
                    {"status": status})
    if status.problems or status.drift:
        return Look(True, (status.problems + status.drift)[0], {"status": status})
    return Look(False, f"{up.profile.name} runs as the profile renders now and {deployment.endpoint} serves it",
                {"status": status})


def expected_for(up, names: list[str], recorded: list[str]):
    """What the profile renders now with this run's --set/--env (not the last serve's)."""
    plan, _ = render(up.inventory, up.profile.name, sets=up.options.sets, envs=up.options.envs,
                     wanted_hosts=names)
    return {h.name: (h.engine_argv, h.env, h.docker_argv) for h in plan.hosts}


def act_serve(up, look: Look) -> tuple[str, str]:
    up.reporter.note(f"serving: {look.reason}")
    plan = up.serve_plan
    report = ServeReport(plan, [HostOutcome(h.name, h.rank) for h in plan.hosts])
    serve_locked(plan, up.inventory, report, pool=up.pool, reporter=up.reporter,
                 timeout_s=up.options.health_timeout_s)
    return report.outcome(look.reason)


def image_plan(up):
    """The image chain's build plan (made once per run); a missing input is its error."""
    if up.image_build_plan is None:
        chain, variant = chain_for_profile(up.profile)
        up.image_build_plan = plan_build(chain, variant, context=up.options.context)
        if up.image_build_plan.missing:
            raise up.image_build_plan.missing_error()
    return up.image_build_plan


def build_engine(up):
    """The build host's Docker engine, over this run's SSH connection."""
    connection = up.pool.get(up.inventory.ssh_target(up.build_host))
    connection.connect()
    return contextlib.nullcontext(CliEngine(connection))
