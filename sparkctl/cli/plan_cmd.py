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
    result = plan_memory(load_profile(profile, sets=sets, envs=envs).profile)
    out.result(result.to_json(), format_plan(result))
    if not result.fits:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
