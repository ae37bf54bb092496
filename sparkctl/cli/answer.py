"""How a verb speaks: progress lines on stderr, plain tables, the plan of a dry run, and the one
result with its exit code. Every verb answers the same way, so it is written once here."""

from __future__ import annotations

import typer

from sparkctl.errors import EXIT_FAILED


def line(out, message: str) -> None:
    """One unwrapped line on stderr (CI logs are grepped; rich would wrap at 80 columns)."""
    out.console.print(message, soft_wrap=True, markup=False, highlight=False)


def table(rows: list[tuple]) -> str:
    """``rows`` (the first is the header) as left-aligned columns two spaces apart."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def finish(out, doc, human: str, ok: bool) -> None:
    """The command's one result (``doc`` with --json, else ``human``); exit 1 when it is not ``ok``."""
    out.result(doc, human)
    if not ok:
        raise typer.Exit(EXIT_FAILED)


def plan_answers(out, plan, format_plan, dry_run: bool) -> bool:
    """Say the plan's notes; with --dry-run the plan itself is the answer. True when it was (stop there)."""
    for note in plan.notes:
        line(out, f"note: {note}")
    if dry_run:
        out.result(plan.to_json(), format_plan(plan))
    return dry_run


def with_health_progress(out, endpoint: str, pool_factory, execute):
    """``execute(pool, on_health_attempt)`` on this command's connections, each health attempt told to
    the run's reporter (a live line on a terminal, a line every 15 s in a log, a JSON line each with
    SPARKCTL_EVENTS=json) and the wait ended whatever happens."""
    reporter = out.reporter

    def attempt(elapsed: float, probe) -> None:
        reporter.waiting(endpoint, f"{probe.stage}: {probe.detail}", elapsed, ok=probe.ok)

    with pool_factory() as pool:
        try:
            return execute(pool, attempt)
        finally:
            reporter.waited(endpoint)
