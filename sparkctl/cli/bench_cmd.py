"""``sparkctl bench`` (measure; ``--out DIR`` keeps the result) and ``sparkctl bench compare A B ...``."""

from __future__ import annotations

from typing import Optional

import typer

from sparkctl.cli.answer import finish
from sparkctl.cli.context import JSON_OPTION, state
from sparkctl.cli.option_groups import GROUP, with_option_groups
from sparkctl.cli.served import API_KEY_ENV_OPTION, ServedLookup, key_from_env, require_deployment
from sparkctl.cli.timeouts import request_timeout_option
from sparkctl.errors import ConfigError

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).

bench_app = typer.Typer(help="Benchmark the served endpoint; compare kept results.", no_args_is_help=False)

DEFAULT_CONCURRENCY = "1,2,4,8"
NO_SLO = (1000.0, 20.0)  # TTFT ms, tokens/s: the SLO judged when --endpoint names no profile


@bench_app.callback(invoke_without_command=True)
@with_option_groups
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
    lookup: ServedLookup = GROUP,
    api_key_env: Optional[str] = API_KEY_ENV_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Measure TTFT, ITL, TPS, latency and RPS at each concurrency, and the SLO capacity (Max C).

    Streams real chat completions to the head's OpenAI endpoint; prints the source reports' table, p50/p90
    and the largest concurrency meeting the profile's slo (TTFT <= ttft_ms, TPS >= tokens_per_s).
    """
    if ctx.invoked_subcommand is not None:
        return
    from sparkctl.ops.bench import BenchSettings, run_bench

    st = state(ctx)
    out_ = st.output(json_flag)
    levels, rates, longs = _levels(concurrency, rate, long_prompts)
    require_deployment(profile, endpoint)
    if out is not None:
        from sparkctl.ops.bench_results import check_out_dir

        check_out_dir(out)
    loaded, api_key = lookup.profile(profile, api_key=key_from_env(api_key_env))
    deployment = None
    if endpoint is None:
        endpoint, found_model, deployment = lookup.find(st.inventory(), loaded)
        model = model or found_model
    settings = BenchSettings(levels, requests, max_tokens, prompt_tokens, warmup, ignore_eos, thinking, request_timeout,
                             rates=rates, rate_requests=rate_requests, long_prompts=longs, long_requests=long_requests,
                             seed=seed)
    reporter = out_.reporter  # each level a step: its size when it starts, its figures when done
    reporter.note(f"benchmarking {endpoint} at {_levels_text(levels, rates, longs)}")
    slo_ttft, slo_tps = (loaded.slo.ttft_ms, loaded.slo.tokens_per_s) if loaded is not None else NO_SLO
    report = run_bench(endpoint.rstrip("/"), model, settings, slo_ttft_ms=slo_ttft, slo_tps=slo_tps, reporter=reporter,
                       profile=profile, deployment=deployment, api_key=api_key)
    if out is not None:
        _keep(report, out, reporter)
    finish(out_, report.to_json(), report.human(), report.ok)


def _levels(concurrency: str | None, rate: str | None, long_prompts: str | None):
    """The closed-loop concurrencies, open-loop rates and long-prompt lengths asked for. Without
    --concurrency: 1,2,4,8, unless only --rate or --long-prompts is given."""
    from sparkctl.ops.bench import parse_concurrency, parse_prompt_lengths, parse_rates

    rates = parse_rates(rate) if rate else []
    longs = parse_prompt_lengths(long_prompts) if long_prompts else []
    if concurrency is None:
        concurrency = "" if rates or longs else DEFAULT_CONCURRENCY
    return (parse_concurrency(concurrency) if concurrency else []), rates, longs


def _levels_text(levels, rates, longs) -> str:
    """``C=1,2 rate=0.5/s prompt=32768``: what the run measures, for the first line it says."""
    what = [f"C={','.join(map(str, levels))}"] if levels else []
    what += [f"rate={','.join(f'{r:g}' for r in rates)}/s"] if rates else []
    what += [f"prompt={','.join(map(str, longs))}"] if longs else []
    return " ".join(what)


def _keep(report, out_dir: str, reporter) -> None:
    """--out: the result folder (every request, the table, the charts, the page), and what went in it."""
    from sparkctl.ops.bench_results import write_results

    written = write_results(report.to_json(with_requests=True), out_dir)
    reporter.note(f"kept the result in {out_dir}: " + ", ".join(p.rsplit("/", 1)[-1] for p in written))


@bench_app.command("compare")
def compare(
    ctx: typer.Context,
    runs: list[str] = typer.Argument(..., help="Result folders written by `bench --out` (or their result.json); the first is the baseline."),
    threshold: Optional[float] = typer.Option(None, "--threshold", min=0, max=1e6, help="Exit 1 when a run is worse than the first by more than this many percent on a level's TTFT, ITL, TPS, latency or RPS."),
    chart: Optional[str] = typer.Option(None, "--chart", help="Write a PNG overlaying the runs against concurrency."),
    json_flag: bool = JSON_OPTION,
) -> None:
    """Compare kept benchmark results: the tables side by side with the change of every cell."""
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
    finish(out, comparison.to_json(), format_comparison(comparison), comparison.ok)


def register(app: typer.Typer) -> None:
    """Add ``bench`` to the top-level app (idempotent)."""
    if not any(g.name == "bench" for g in app.registered_groups):
        app.add_typer(bench_app, name="bench")
