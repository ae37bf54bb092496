"""A benchmark that outlives its run: the result folder (JSON, CSV, charts, HTML) and the comparison of runs.

``bench --out DIR`` writes, each file atomically (a reader sees a whole file or none):

* ``result.json``: the whole report (settings, the endpoint's /health engine_config, the deployment's
  profile / image / image ID, sparkctl's version) with every request's timings and token counts;
* ``table.csv``: the source reports' table, one row per level, plus p50/p90 and the aggregate rates;
* ``ttft.png``, ``itl.png``, ``tps.png``, ``throughput.png``: against concurrency (``bench_charts``);
* ``report.html``: the table and the charts in one self-contained file.

``bench compare A B ...`` reads those folders (or result.json files) and compares every run with the first.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from typing import Optional

from sparkctl.errors import ConfigError
from sparkctl.fileio import atomic_write

RESULT_FILE = "result.json"
CSV_FILE = "table.csv"
MAX_RESULT_BYTES = 256 * 1024 * 1024

CSV_COLUMNS = [
    ("kind", None), ("label", None), ("concurrency", None), ("rate", None), ("prompt_tokens_asked", None),
    ("ttft_ms", "mean"), ("itl_ms", "mean"), ("tps", "mean"), ("latency_s", "mean"), ("rps", "mean"),
    ("ttft_ms", "p50"), ("ttft_ms", "p90"), ("itl_ms", "p50"), ("itl_ms", "p90"), ("chunk_itl_ms", "mean"),
    ("tps", "p50"), ("tps", "p90"), ("latency_s", "p50"), ("latency_s", "p90"),
    ("throughput_rps", None), ("output_tokens_per_s", None), ("completed", None), ("failed", None),
    ("short_outputs", None),
]
CSV_HEADER = {("ttft_ms", "mean"): "TTFT (ms)", ("itl_ms", "mean"): "ITL (ms)", ("tps", "mean"): "TPS (tok/s)",
              ("latency_s", "mean"): "Latency (s)", ("rps", "mean"): "Throughput (RPS)"}


def table_csv(doc: dict) -> str:
    """Every level of a result document as CSV: the source reports' five columns (means) first, then the rest."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([CSV_HEADER.get((name, stat), name if stat is None else f"{name}_{stat}")
                     for name, stat in CSV_COLUMNS])
    for level in doc.get("levels", []):
        row = []
        for name, stat in CSV_COLUMNS:
            value = level.get(name)
            if stat is not None:
                value = None if value is None else value.get(stat)
            row.append("" if value is None else value)
        writer.writerow(row)
    return buffer.getvalue()


def check_out_dir(out_dir: str) -> None:
    """Refuse an --out that cannot become the result folder, before the run rather than after it."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"{out_dir} exists and is not a folder", field="--out")
    parent = out_dir if os.path.isdir(out_dir) else (os.path.dirname(os.path.abspath(out_dir)) or ".")
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write in {parent}", field="--out")


def write_results(doc: dict, out_dir: str, *, charts: bool = True) -> list[str]:
    """Write the result folder; the files written, in order. ``doc`` is ``BenchReport.to_json(True)``."""
    check_out_dir(out_dir)
    written = []

    def put(name: str, data) -> None:
        path = os.path.join(out_dir, name)
        try:
            atomic_write(path, data)
        except OSError as err:
            raise ConfigError(f"cannot write {path}: {err.strerror or err}", field="--out") from None
        written.append(path)

    put(RESULT_FILE, json.dumps(doc, indent=1) + "\n")
    put(CSV_FILE, table_csv(doc))
    if charts:
        from sparkctl.ops.bench_charts import html_report, run_charts

        pngs = run_charts(doc)
        for name, data in pngs.items():
            put(name, data)
        put("report.html", html_report(doc, pngs))
    return written


def load_result(path: str) -> dict:
    """A result document from a result folder or a result.json (also a ``bench --json`` output)."""
    file = os.path.join(path, RESULT_FILE) if os.path.isdir(path) else path
    from sparkctl.fileio import UserFileError, read_user_file

    try:
        doc = json.loads(read_user_file(file, MAX_RESULT_BYTES).decode("utf-8"))
    except UserFileError as err:
        raise ConfigError(f"{file} {err}: not a bench result")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no bench result there (expected a folder written by `bench --out` or a {RESULT_FILE})")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{file}: not a bench result ({' '.join(str(err).split())[:120]})")
    if not isinstance(doc, dict) or not isinstance(doc.get("levels"), list):
        raise ConfigError(f"{file}: not a bench result (no levels)")
    return doc


# ---------------------------------------------------------------------------------------------- compare

# (key in a level, label, True when larger is better)
COMPARED = [("ttft_ms", "TTFT (ms)", False), ("itl_ms", "ITL (ms)", False), ("tps", "TPS (tok/s)", True),
            ("latency_s", "Latency (s)", False), ("rps", "Throughput (RPS)", True)]


def _mean(level: dict, key: str) -> Optional[float]:
    stat = level.get(key)
    return stat.get("mean") if isinstance(stat, dict) else None


@dataclass
class Regression:
    run: str
    level: str
    metric: str
    baseline: float
    value: float
    worse_pct: float

    def to_json(self) -> dict:
        return {"run": self.run, "level": self.level, "metric": self.metric, "baseline": self.baseline,
                "value": self.value, "worse_pct": round(self.worse_pct, 2)}


@dataclass
class Comparison:
    names: list[str]
    rows: list[dict]  # per level label: {"level", metric: [values per run]}
    threshold_pct: Optional[float]
    regressions: list[Regression] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.regressions

    def to_json(self) -> dict:
        return {"ok": self.ok, "runs": self.names, "threshold_pct": self.threshold_pct,
                "levels": self.rows, "regressions": [r.to_json() for r in self.regressions]}


def change_pct(baseline: Optional[float], value: Optional[float]) -> Optional[float]:
    if baseline is None or value is None or baseline == 0:
        return None
    return 100.0 * (value - baseline) / baseline


def compare_runs(docs: list[dict], names: list[str], threshold_pct: Optional[float] = None) -> Comparison:
    """Every run against the first, level by level (levels matched by label: C=4, rate=2/s, prompt=32768).
    A regression is a change in the worse direction beyond ``threshold_pct`` percent."""
    labels: list[str] = []
    by_run = []
    for doc in docs:
        levels = {lv.get("label") or f"C={lv.get('concurrency')}": lv for lv in doc["levels"]}
        by_run.append(levels)
        labels += [label for label in levels if label not in labels]
    comparison = Comparison(names, [], threshold_pct)
    for label in labels:
        row: dict = {"level": label}
        for key, _, higher_better in COMPARED:
            values = [_mean(levels[label], key) if label in levels else None for levels in by_run]
            row[key] = values
            base = values[0]
            for name, value in zip(names[1:], values[1:]):
                change = change_pct(base, value)
                if change is None or threshold_pct is None:
                    continue
                worse = -change if higher_better else change
                if worse > threshold_pct:
                    comparison.regressions.append(Regression(name, label, key, base, value, worse))
        comparison.rows.append(row)
    return comparison


def format_comparison(comparison: Comparison) -> str:
    """One row per level and metric, one column per run; every run after the first shows its change."""
    from sparkctl.ops.bench import _aligned

    rows = [["Level", "Metric", comparison.names[0]] + [f"{name} (change)" for name in comparison.names[1:]]]
    for row in comparison.rows:
        for key, title, _ in COMPARED:
            values = row[key]
            cells = [row["level"], title, "-" if values[0] is None else f"{values[0]:.2f}"]
            for value in values[1:]:
                change = change_pct(values[0], value)
                cells.append("-" if value is None else f"{value:.2f} ({'n/a' if change is None else f'{change:+.1f}%'})")
            rows.append(cells)
    lines = [_aligned(rows)]
    if comparison.threshold_pct is not None:
        lines.append("")
        if comparison.regressions:
            lines.append(f"worse than {comparison.names[0]} by more than {comparison.threshold_pct:g} %:")
            lines += [f"  {r.run} {r.level} {r.metric}: {r.baseline:.2f} -> {r.value:.2f} ({r.worse_pct:.1f} % worse)"
                      for r in comparison.regressions]
        else:
            lines.append(f"no run is worse than {comparison.names[0]} by more than {comparison.threshold_pct:g} %")
    return "\n".join(lines)
