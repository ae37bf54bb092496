"""``sparkctl plan``: the per-rank memory budget of a profile; exit 1 when it does not fit."""

from __future__ import annotations

import typer

from sparkctl.cli.context import ENV_OPTION, JSON_OPTION, PROFILE_OPTION, SET_OPTION, state
from sparkctl.errors import EXIT_FAILED

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


def plan(
    ctx: typer.Context,
    profile: str = PROFILE_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    compare: bool = typer.Option(False, "--compare", help="Every layout the inventory's hosts allow (TP8, 2 x TP4, "
                                                            "TP4 + TP3 ...): memory plan, measured throughput, what each suits."),
    json_flag: bool = JSON_OPTION,
) -> None:
    """Per-rank memory: weights, Engram, NCCL buffers, CUDA graphs, autotune spike, KV cache -> tokens.

    With `replicas: N` the plan is one replica's (each rank of each replica holds the same)."""
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
    if compare:
        from sparkctl.ops.layouts import compare_layouts, format_compare

        hosts = len(st.inventory().hosts)
        layouts = compare_layouts(loaded, hosts)
        out.result({"profile": loaded.name, "hosts": hosts,
                    "layouts": [lay.to_json(loaded.max_num_seqs) for lay in layouts]},
                   format_compare(loaded.name, hosts, layouts, loaded.max_num_seqs))
        return
    result = plan_memory(loaded)
    out.result(result.to_json(), format_plan(result))
    if not result.fits:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
