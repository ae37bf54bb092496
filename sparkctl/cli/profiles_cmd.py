"""``sparkctl profiles``: the profiles this installation knows."""

from __future__ import annotations

import typer

from sparkctl.cli.context import JSON_OPTION, state

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


def profiles(ctx: typer.Context, json_flag: bool = JSON_OPTION) -> None:
    """List the profiles (recipes/*.yaml) with engine, TP size, context and Engram mode."""
    from sparkctl.config.profile import available_profiles, load_profile

    st = state(ctx)
    out = st.output(json_flag)
    rows = []
    for name in available_profiles():
        if name.startswith("_"):
            continue
        loaded = load_profile(name)
        p = loaded.profile
        rows.append(
            {
                "name": name,
                "description": p.description,
                "engine": p.engine,
                "engine_version": p.engine_version,
                "tensor_parallel": p.tensor_parallel,
                "max_model_len": p.max_model_len,
                "gpu_memory_utilization": p.gpu_memory_utilization,
                "engram": p.engram.mode,
                "image": p.image.tag,
                "extends": loaded.chain[1:],
                "path": loaded.path,
            }
        )
    lines = [f"{'NAME':<16}{'ENGINE':<18}{'TP':>3}  {'CONTEXT':>8}  {'GMU':>4}  {'ENGRAM':<7}IMAGE"]
    for r in rows:
        lines.append(
            f"{r['name']:<16}{r['engine'] + ' ' + r['engine_version']:<18}{r['tensor_parallel']:>3}  "
            f"{r['max_model_len']:>8}  {r['gpu_memory_utilization']:>4}  {r['engram']:<7}{r['image']}"
        )
    out.result({"profiles": rows}, "\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("profiles")(profiles)
