"""``sparkctl plan``: the per-rank memory budget of a profile; exit 1 when it does not fit."""

from __future__ import annotations

import typer

from sparkctl.cli.context import ENV_OPTION, JSON_OPTION, PROFILE_OPTION, SET_OPTION, state
from sparkctl.errors import EXIT_FAILED


def plan(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Per-rank memory: weights, Engram, NCCL buffers, CUDA graphs, autotune spike, KV cache -> tokens."""
    from sparkctl.config.profile import load_profile
    from sparkctl.ops.plan import format_plan, plan_memory

    st = state(ctx)
    out = st.output(json_flag)
    loaded = load_profile(profile, sets=sets, envs=envs).profile
    if loaded.single_box is not None:  # one box: the arena plan of the single-box engine
        from sparkctl.ops.arena_plan import format_arena_plan, plan_arena

        arena = plan_arena(loaded)
        out.result(arena.to_json(), format_arena_plan(arena))
        if not arena.fits:
            raise typer.Exit(EXIT_FAILED)
        return
    result = plan_memory(loaded)
    out.result(result.to_json(), format_plan(result))
    if not result.fits:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
