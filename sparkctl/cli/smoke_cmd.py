"""``sparkctl smoke``: parse, call ``sparkctl.ops.smoke``, print the checks (or one JSON document)."""

from __future__ import annotations

from functools import partial
from typing import Optional

import typer

from sparkctl import engines
from sparkctl.cli.answer import line
from sparkctl.cli.context import JSON_OPTION, state
from sparkctl.cli.option_groups import GROUP, with_option_groups
from sparkctl.cli.served import API_KEY_ENV_OPTION, ServedLookup, key_from_env, require_deployment
from sparkctl.cli.timeouts import request_timeout_option
from sparkctl.errors import EXIT_FAILED, ConfigError

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).


@with_option_groups
def smoke(
    ctx: typer.Context,
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="The served profile (endpoint from its deployment, API key from its serving section)."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Base URL (http://HOST:PORT) instead of the profile's deployment."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to request (default: the deployment's served name)."),
    engine: Optional[str] = typer.Option(None, "--engine", help=f"{', '.join(engines.names())}: whose field names and errors to expect "
                                                                     "(default: the profile's)."),
    api_key_env: Optional[str] = API_KEY_ENV_OPTION,
    quick: bool = typer.Option(False, "--quick", help="Only the model list, a chat and a streamed chat (what serve runs)."),
    full: bool = typer.Option(False, "--full", help="Also the sources' validation, one check at a time: one- and four-image "
                              "vision, a JSON-schema answer, a tool round trip, two waves of 8 concurrent chats, and exact "
                              "retrieval of planted records at 32k, 128k and 300k tokens (1M when the profile serves it)."),
    context: Optional[int] = typer.Option(None, "--context", min=1, max=16_777_216, help="The served context in tokens (default: the "
                                          "profile's max_model_len); 1,048,576 or more adds the 1M retrieval."),
    timeout: float = request_timeout_option(60.0),
    lookup: ServedLookup = GROUP,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Check what an application needs: models, chat (plain and streamed), tool calls, thinking, completions, errors.

    Every check is named, timed and reported; exit 1 when any fails, naming it.
    """
    from sparkctl.ops.smoke import run_smoke

    st = state(ctx)
    out = st.output(json_flag)
    require_deployment(profile, endpoint)
    _check_choices(engine, quick, full)
    loaded, api_key = lookup.profile(profile, api_key=key_from_env(api_key_env))
    if loaded is not None:
        engine = engine or loaded.engine
        context = context or loaded.max_model_len
    if endpoint is None:
        endpoint, found_model, _ = lookup.find(st.inventory(), loaded)
        model = model or found_model
    if model is None:
        raise ConfigError("name the model to request: --model NAME (or --profile P)", field="--model")
    say = partial(line, out)
    say(f"smoke-testing {endpoint} ({model}, {engine or 'vllm'})")
    report = run_smoke(endpoint, model=model, api_key=api_key, engine=engine or "vllm", quick=quick, timeout_s=timeout,
                       on_check=lambda c: say(f"  {'ok  ' if c.ok else 'FAIL'} {c.name} ({c.seconds:.2f} s)"),
                       full=full, context=context, behind_router=loaded is not None and loaded.replicas > 1)
    out.result(report.to_json(), report.human())
    if not report.ok:
        if json_flag:
            say("smoke: FAILED: " + ", ".join(f"{c.name} ({c.detail})" for c in report.failed))
        raise typer.Exit(EXIT_FAILED)


def _check_choices(engine: str | None, quick: bool, full: bool) -> None:
    if engine is not None and engine not in engines.names():
        known = engines.names()
        raise ConfigError(f"{engine!r} is not an engine: {', '.join(known[:-1])} or {known[-1]}", field="--engine")
    if quick and full:
        raise ConfigError("--quick and --full ask for opposite things; pick one", field="--full")


def register(app: typer.Typer) -> None:
    """Add ``smoke`` to the top-level app (idempotent)."""
    if not any(c.name == "smoke" for c in app.registered_commands):
        app.command("smoke")(smoke)
