"""``sparkctl bench``: parse, call ``sparkctl.ops.bench``, print the seeds' table (or one JSON document)."""

from __future__ import annotations

from typing import Optional

import typer

from sparkctl.cli.context import ENV_OPTION, JSON_OPTION, SET_OPTION, state
from sparkctl.errors import EXIT_FAILED


def bench(
    ctx: typer.Context,
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="The served profile (endpoint from its deployment; SLO targets from its slo section)."),
    concurrency: str = typer.Option("1,2,4,8", "--concurrency", "-c", help="Comma-separated concurrency levels."),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, max=10000,
                                           help="Requests per level (default 2 x C, at least 4; never fewer than C)."),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1, max=1_000_000, help="Output tokens per request."),
    prompt_tokens: int = typer.Option(256, "--prompt-tokens", min=1, max=10_000_000, help="Prompt length per request, in tokens (about)."),
    warmup: int = typer.Option(1, "--warmup", min=0, max=100, help="Unmeasured requests before the first level."),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="Send chat_template_kwargs.thinking (default: the server's default)."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Make every request produce exactly --max-tokens tokens."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", min=1, help="Seconds one request may take, stream included."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Base URL (http://HOST:PORT) instead of the profile's deployment."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to request (default: the deployment's served name)."),
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="SSH connect timeout per host, seconds."),
    json_flag: bool = JSON_OPTION,
) -> None:
    """Measure TTFT, ITL, TPS, latency and RPS at each concurrency, and the SLO capacity (Max C).

    Streams real chat completions to the head's OpenAI endpoint; prints the seeds' table, p50/p90
    and the largest concurrency meeting the profile's slo (TTFT <= ttft_ms, TPS >= tokens_per_s).
    """
    from sparkctl.errors import ConfigError
    from sparkctl.ops.bench import BenchSettings, find_endpoint, parse_concurrency, run_bench

    st = state(ctx)
    out = st.output(json_flag)
    levels = parse_concurrency(concurrency)
    if profile is None and endpoint is None:
        raise ConfigError("name the deployment: --profile P (or --endpoint URL)", field="--profile")
    slo_ttft, slo_tps, loaded, api_key = 1000.0, 20.0, None, None
    if profile is not None:
        from sparkctl.config.apikey import api_key_for
        from sparkctl.config.profile import load_profile

        loaded = load_profile(profile, sets=sets, envs=envs).profile
        slo_ttft, slo_tps = loaded.slo.ttft_ms, loaded.slo.tokens_per_s
        api_key = api_key_for(loaded)
    if endpoint is None:
        from sparkctl.remote.pool import ConnectionPool

        with ConnectionPool(connect_timeout=connect_timeout) as pool:
            endpoint, found_model = find_endpoint(st.inventory(), loaded, pool=pool)
        model = model or found_model
    settings = BenchSettings(levels, requests, max_tokens, prompt_tokens, warmup, ignore_eos, thinking, request_timeout)
    say = lambda m: out.console.print(m, soft_wrap=True, markup=False, highlight=False)  # noqa: E731
    say(f"benchmarking {endpoint} at C={','.join(map(str, levels))}")
    report = run_bench(endpoint.rstrip("/"), model, settings, slo_ttft_ms=slo_ttft, slo_tps=slo_tps, say=say,
                       profile=profile, api_key=api_key)
    out.result(report.to_json(), report.human())
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add ``bench`` to the top-level app (idempotent)."""
    if not any(c.name == "bench" for c in app.registered_commands):
        app.command("bench")(bench)


def _main() -> None:  # pragma: no cover - used by the tests until cli/main.py registers us
    from sparkctl.cli import main

    register(main.app)
    main.run()


if __name__ == "__main__":
    _main()
