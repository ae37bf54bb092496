"""``sparkctl bench`` (measure; ``--out DIR`` keeps the result) and ``sparkctl bench compare A B ...``."""

from __future__ import annotations

from typing import Optional

import typer

from sparkctl.cli.context import ENV_OPTION, JSON_OPTION, SET_OPTION, state
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION, request_timeout_option
from sparkctl.errors import EXIT_FAILED

bench_app = typer.Typer(help="Benchmark the served endpoint; compare kept results.", no_args_is_help=False)

DEFAULT_CONCURRENCY = "1,2,4,8"


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="The served profile (endpoint from its deployment; SLO targets from its slo section)."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c", help="Comma-separated concurrency levels (default 1,2,4,8; none when only --rate or --long-prompts is given)."),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, max=10000,
                                           help="Requests per level (default 2 x C, at least 4; never fewer than C)."),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1, max=1_000_000, help="Output tokens per request."),
    prompt_tokens: int = typer.Option(256, "--prompt-tokens", min=1, max=10_000_000, help="Prompt length per request, in tokens (about)."),
    warmup: int = typer.Option(1, "--warmup", min=0, max=100, help="Unmeasured requests before the first level."),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="Send chat_template_kwargs.thinking (default: the server's default)."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Make every request produce exactly --max-tokens tokens."),
    request_timeout: float = request_timeout_option(600.0),
    rate: Optional[str] = typer.Option(None, "--rate", help="Open-loop levels: requests/s, comma-separated (Poisson arrivals)."),
    rate_requests: int = typer.Option(20, "--rate-requests", min=1, max=10000, help="Requests per --rate level."),
    long_prompts: Optional[str] = typer.Option(None, "--long-prompts", help="Long-prompt levels in tokens, e.g. 32k,128k,512k (those beyond the served context are skipped)."),
    long_requests: int = typer.Option(2, "--long-requests", min=1, max=100, help="Requests per long-prompt level, one at a time."),
    seed: int = typer.Option(0, "--seed", help="Seed of the open-loop arrival times."),
    out: Optional[str] = typer.Option(None, "--out", help="Folder to keep the result in: result.json (every request), table.csv, PNG charts, report.html."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Base URL (http://HOST:PORT) instead of the profile's deployment."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to request (default: the deployment's served name)."),
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    connect_timeout: float = CONNECT_TIMEOUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Measure TTFT, ITL, TPS, latency and RPS at each concurrency, and the SLO capacity (Max C).

    Streams real chat completions to the head's OpenAI endpoint; prints the source reports' table, p50/p90
    and the largest concurrency meeting the profile's slo (TTFT <= ttft_ms, TPS >= tokens_per_s).
    """
    if ctx.invoked_subcommand is not None:
        return
    from sparkctl.errors import ConfigError
    from sparkctl.ops.bench import (BenchSettings, find_target, parse_concurrency, parse_prompt_lengths, parse_rates,
                                    run_bench)

    st = state(ctx)
    out_ = st.output(json_flag)
    rates = parse_rates(rate) if rate else []
    longs = parse_prompt_lengths(long_prompts) if long_prompts else []
    if concurrency is None:
        concurrency = "" if rates or longs else DEFAULT_CONCURRENCY
    levels = parse_concurrency(concurrency) if concurrency else []
    if profile is None and endpoint is None:
        raise ConfigError("name the deployment: --profile P (or --endpoint URL)", field="--profile")
    if out is not None:
        from sparkctl.ops.bench_results import check_out_dir

        check_out_dir(out)
    slo_ttft, slo_tps, loaded, deployment, api_key = 1000.0, 20.0, None, None, None
    if profile is not None:
        from sparkctl.config.apikey import api_key_for
        from sparkctl.config.profile import load_profile

        loaded = load_profile(profile, sets=sets, envs=envs).profile
        slo_ttft, slo_tps = loaded.slo.ttft_ms, loaded.slo.tokens_per_s
        api_key = api_key_for(loaded)
    if endpoint is None:
        from sparkctl.cli.context import connections

        with connections(connect_timeout) as pool:
            endpoint, found_model, deployment = find_target(st.inventory(), loaded, pool=pool)
        model = model or found_model
    settings = BenchSettings(levels, requests, max_tokens, prompt_tokens, warmup, ignore_eos, thinking, request_timeout,
                             rates=rates, rate_requests=rate_requests, long_prompts=longs, long_requests=long_requests,
                             seed=seed)
    say = lambda m: out_.console.print(m, soft_wrap=True, markup=False, highlight=False)  # noqa: E731
    what = [f"C={','.join(map(str, levels))}"] if levels else []
    what += [f"rate={','.join(f'{r:g}' for r in rates)}/s"] if rates else []
    what += [f"prompt={','.join(map(str, longs))}"] if longs else []
    say(f"benchmarking {endpoint} at {' '.join(what)}")
    report = run_bench(endpoint.rstrip("/"), model, settings, slo_ttft_ms=slo_ttft, slo_tps=slo_tps, say=say,
                       profile=profile, deployment=deployment, api_key=api_key)
    if out is not None:
        from sparkctl.ops.bench_results import write_results

        written = write_results(report.to_json(with_requests=True), out)
        say(f"kept the result in {out}: " + ", ".join(p.rsplit("/", 1)[-1] for p in written))
    out_.result(report.to_json(), report.human())
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


@bench_app.command("compare")
def compare(
    ctx: typer.Context,
    runs: list[str] = typer.Argument(..., help="Result folders written by `bench --out` (or their result.json); the first is the baseline."),
    threshold: Optional[float] = typer.Option(None, "--threshold", min=0, max=1e6, help="Exit 1 when a run is worse than the first by more than this many percent on a level's TTFT, ITL, TPS, latency or RPS."),
    chart: Optional[str] = typer.Option(None, "--chart", help="Write a PNG overlaying the runs against concurrency."),
    json_flag: bool = JSON_OPTION,
) -> None:
    """Compare kept benchmark results: the tables side by side with the change of every cell."""
    from sparkctl.errors import ConfigError
    from sparkctl.ops.bench_results import compare_runs, format_comparison, load_result

    out = state(ctx).output(json_flag)
    if len(runs) < 2:
        raise ConfigError("compare needs at least two results", field="RUNS")
    docs = [load_result(path) for path in runs]
    names = [path.rstrip("/") for path in runs]
    comparison = compare_runs(docs, names, threshold)
    if chart is not None:
        from sparkctl.fileio import atomic_write
        from sparkctl.ops.bench_charts import compare_chart

        try:
            atomic_write(chart, compare_chart(docs, names))
        except OSError as err:
            raise ConfigError(f"cannot write {chart}: {err.strerror or err}", field="--chart") from None
        out.info(f"wrote {chart}")
    out.result(comparison.to_json(), format_comparison(comparison))
    if not comparison.ok:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add ``bench`` to the top-level app (idempotent)."""
    if not any(g.name == "bench" for g in app.registered_groups):
        app.add_typer(bench_app, name="bench")
