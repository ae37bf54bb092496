"""``up`` for a profile whose engine runs as a host process (``launcher: native``, the single box).

The launcher's part of up's steps, as ``replica_up`` is the replicas' part: there is no image to
build or copy and no Engram shard to cut (those steps are skipped, saying why); the serve step
looks at the running engine (``native_status``: its process, its health, the environment it was
started with against the one the profile renders now) and, when anything differs, starts it
under up's deploy lock with the same guards, files and health wait as ``sparkctl serve``.
"""

from __future__ import annotations

from sparkctl.ops.native import NativePlan, plan_native
from sparkctl.ops.native_deploy import NativeServeReport, native_status, serve_locked
from sparkctl.ops.steps import Look

NO_IMAGE = "the engine runs as a host process (launcher: native): no image"


def plan(up) -> NativePlan:
    from sparkctl.ops.lock import who_am_i
    from sparkctl.ops.steps import utc_now

    return plan_native(up.loaded, up.inventory, wanted_hosts=up.options.hosts, who=who_am_i(), when=utc_now())


def engine_running(up) -> bool:
    """Whether the profile's engine process runs on its host now."""
    from sparkctl.ops.native_deploy import gather_native

    states = gather_native(up.inventory, up.hosts, up.profile.name, pool=up.pool)
    return any(s.process is not None and s.process.running for s in states)


def look_serve(up):
    from sparkctl.commands.native import engine_env
    from sparkctl.config.profile import load_profile

    def wanted_env(recorded_sets: list[str]) -> dict[str, str]:
        profile = load_profile(up.profile.name, sets=recorded_sets + list(up.options.sets), envs=up.options.envs).profile
        return engine_env(profile)

    given = frozenset(e.partition("=")[0] for e in up.options.envs)
    status = native_status(up.inventory, up.hosts, up.loaded, pool=up.pool, wanted_env=wanted_env, env_given=given)
    if not status.deployed:
        return Look(True, f"{up.profile.name} is not running on {up.native_plan.host}", {"status": status})
    if status.problems or status.drift:
        return Look(True, (status.problems + status.drift)[0], {"status": status})
    return Look(False, f"{up.profile.name} runs as the profile renders now and {status.endpoint} serves it",
                {"status": status})


def look_no_image(up) -> Look:
    """The image steps (build, distribute, Engram shards) do not apply to a host process."""
    return Look(False, NO_IMAGE, {"skip": True})


def never(up, look: Look) -> tuple[str, str]:
    raise AssertionError("a step that never acts was asked to")  # look_no_image never says act


def act_serve(up, look: Look) -> tuple[str, str]:
    up.reporter.note(f"serving: {look.reason}")
    plan = up.native_plan
    report = NativeServeReport(plan)
    serve_locked(plan, report, up.pool.get(up.inventory.ssh_target(up.hosts[0])), up.reporter,
                  up.options.health_timeout_s, None)
    return report.outcome(look.reason)
