"""A benchmark that outlives its run: the result folder (JSON, CSV, charts, HTML) and the comparison of runs.

``bench --out DIR`` writes, each file atomically (a reader sees a whole file or none):

* ``result.json``: the whole report (settings, the engine_config a single-box engine's /health carries (null for vLLM and
  SGLang, whose /health has no body), the deployment's
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
import math
import os
from dataclasses import dataclass, field
from typing import Optional

from sparkctl.errors import ConfigError
from sparkctl.fileio import UserFileError, atomic_write, read_user_file
from sparkctl.ops.bench import _aligned
from sparkctl.ops.bench_charts import html_report, run_charts
from sparkctl.resources import PACKAGE_DIR

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
# Every header says what it is, and whether it is per stream (one request's view, the source
# reports' columns) or aggregate (the whole level: completed requests or tokens over its wall time).
CSV_HEADER = {
    ("concurrency", None): "Concurrency", ("rate", None): "Rate asked (req/s)",
    ("prompt_tokens_asked", None): "Prompt tokens asked",
    ("ttft_ms", "mean"): "TTFT (ms)", ("itl_ms", "mean"): "ITL (ms)", ("tps", "mean"): "TPS per stream (tok/s)",
    ("latency_s", "mean"): "Latency (s)", ("rps", "mean"): "Throughput per stream (RPS)",
    ("ttft_ms", "p50"): "TTFT p50 (ms)", ("ttft_ms", "p90"): "TTFT p90 (ms)",
    ("itl_ms", "p50"): "ITL p50 (ms)", ("itl_ms", "p90"): "ITL p90 (ms)", ("chunk_itl_ms", "mean"): "ITL per chunk (ms)",
    ("tps", "p50"): "TPS per stream p50 (tok/s)", ("tps", "p90"): "TPS per stream p90 (tok/s)",
    ("latency_s", "p50"): "Latency p50 (s)", ("latency_s", "p90"): "Latency p90 (s)",
    ("throughput_rps", None): "Throughput aggregate (RPS)", ("output_tokens_per_s", None): "Output aggregate (tok/s)",
    ("completed", None): "Completed", ("failed", None): "Failed", ("short_outputs", None): "Short outputs",
}


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
        pngs = run_charts(doc)
        for name, data in pngs.items():
            put(name, data)
        put("report.html", html_report(doc, pngs))
    return written


REFERENCE_PREFIX = "ref:"


def reference_names() -> list[str]:
    return sorted(p.stem for p in (PACKAGE_DIR / "references").glob("*.json"))


def reference_file(name: str) -> str:
    """``ref:NAME``: a published table shipped with sparkctl (sparkctl/references/NAME.json)."""
    if name not in reference_names():
        raise ConfigError(f"no published table {REFERENCE_PREFIX}{name}; known: "
                          + ", ".join(REFERENCE_PREFIX + n for n in reference_names()), field="RUNS")
    return str(PACKAGE_DIR / "references" / f"{name}.json")


def load_result(path: str) -> dict:
    """A result document from a result folder or a result.json (also a ``bench --json`` output), or
    ``ref:NAME``, a source report's measured table in the same shape (``sparkctl/references``)."""
    if path.startswith(REFERENCE_PREFIX):
        path = reference_file(path[len(REFERENCE_PREFIX):])
    file = os.path.join(path, RESULT_FILE) if os.path.isdir(path) else path
    try:
        doc = json.loads(read_user_file(file, MAX_RESULT_BYTES).decode("utf-8"))
    except UserFileError as err:
        raise ConfigError(f"{file} {err}: not a bench result")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no bench result there (expected a folder written by `bench --out` or a {RESULT_FILE})")
    except (OSError, ValueError) as err:  # ValueError: bad JSON or UTF-8, an integer past Python's digit limit
        raise ConfigError(f"{file}: not a bench result ({' '.join(str(err).split())[:120]})")
    except RecursionError:
        raise ConfigError(f"{file}: not a bench result (nested too deeply)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("levels"), list):
        raise ConfigError(f"{file}: not a bench result (no levels)")
    for index, level in enumerate(doc["levels"]):
        problem = _level_problem(level)
        if problem:
            raise ConfigError(f"{file}: levels[{index}]{problem}: not a bench result")
    reference = doc.get("reference")
    if reference is not None and not (isinstance(reference, dict) and all(
            value is None or (isinstance(value, str) and value.isprintable()) for value in reference.values())):
        raise ConfigError(f"{file}: reference is not an object of one-line printable texts: not a bench result")
    return doc


def _is_number(value) -> bool:
    """A JSON number that is a finite float too (an integer of 400 digits overflowed the mean)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _level_problem(level) -> Optional[str]:
    """What in one level of a result file compare and its chart cannot read (a sort of 'a' against 1
    was an "unexpected TypeError"), or a label that would print a terminal escape or a second line."""
    if not isinstance(level, dict):
        return " is not an object"
    for key in ("kind", "label"):
        text = level.get(key)
        if text is not None and (not isinstance(text, str) or not text.isprintable()):
            return f".{key} is not one line of printable text"
    for key in ("concurrency", "rate", "prompt_tokens_asked"):
        if level.get(key) is not None and not _is_number(level[key]):
            return f".{key} is not a number"
    if level.get("kind", "concurrency") == "concurrency" and not _is_number(level.get("concurrency")):
        return ".concurrency is missing (a concurrency level is drawn against it)"
    for key in [key for key, _, _ in COMPARED] + ["prompt_tokens"]:
        stat = level.get(key)
        if stat is None or _is_number(stat):
            continue
        if not isinstance(stat, dict):
            return f".{key} is neither a number nor statistics"
        odd = next((name for name, value in stat.items() if value is not None and not _is_number(value)), None)
        if odd is not None:
            return f".{key}.{odd} is not a number"
    return None


# ---------------------------------------------------------------------------------------------- compare

# (key in a level, label, True when larger is better). The last two are what the published tables
# give besides the five columns: a level's aggregate decode rate and a long prompt's prefill rate.
COMPARED = [("ttft_ms", "TTFT (ms)", False), ("itl_ms", "ITL (ms)", False), ("tps", "TPS (tok/s)", True),
            ("latency_s", "Latency (s)", False), ("rps", "Throughput (RPS)", True),
            ("output_tokens_per_s", "Aggregate (tok/s)", True), ("prefill_tok_s", "Prefill (tok/s)", True)]


def _mean(level: dict, key: str) -> Optional[float]:
    stat = level.get(key)
    if isinstance(stat, (int, float)) and not isinstance(stat, bool):
        return float(stat)
    if isinstance(stat, dict):
        return stat.get("mean")
    if key == "prefill_tok_s" and level.get("kind") == "long_prompt":
        # A run's prefill rate: the prompt over the time to its first token (as `bench` prints it).
        ttft, prompt = _mean(level, "ttft_ms"), _mean(level, "prompt_tokens") or level.get("prompt_tokens_asked")
        return round(prompt / (ttft / 1000.0), 1) if ttft and prompt else None
    return None


def percent_of(baseline: Optional[float], value: Optional[float]) -> Optional[float]:
    """``value`` as a percentage of ``baseline`` (what a run reaches of a published figure)."""
    if baseline is None or value is None or baseline == 0:
        return None
    return 100.0 * value / baseline


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
    reference: Optional[dict] = None  # the baseline is a published table: its source and conditions

    @property
    def ok(self) -> bool:
        return not self.regressions

    def to_json(self) -> dict:
        doc = {"ok": self.ok, "runs": self.names, "threshold_pct": self.threshold_pct,
               "levels": self.rows, "regressions": [r.to_json() for r in self.regressions]}
        if self.reference is not None:
            doc["reference"] = self.reference
        return doc


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
    reference = docs[0].get("reference") if isinstance(docs[0].get("reference"), dict) else None
    comparison = Comparison(names, [], threshold_pct, reference=reference)
    for label in labels:
        row: dict = {"level": label}
        for key, _, higher_better in COMPARED:
            values = [_mean(levels[label], key) if label in levels else None for levels in by_run]
            row[key] = values
            if reference is not None:  # each run as a percentage of what the report measured
                row.setdefault("percent_of_reference", {})[key] = [
                    None if p is None else round(p, 1) for p in (percent_of(values[0], v) for v in values[1:])]
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
    ref = comparison.reference is not None
    how = "of the report" if ref else "change"
    rows = [["Level", "Metric", comparison.names[0]] + [f"{name} ({how})" for name in comparison.names[1:]]]
    for row in comparison.rows:
        for key, title, _ in COMPARED:
            values = row[key]
            if all(v is None for v in values):
                continue  # a metric no run has at this level (prefill at C=4, aggregate in an old result)
            cells = [row["level"], title, "-" if values[0] is None else f"{values[0]:.2f}"]
            for value in values[1:]:
                if ref:
                    pct = percent_of(values[0], value)
                    note = "n/a" if pct is None else f"{pct:.1f}%"
                else:
                    change = change_pct(values[0], value)
                    note = "n/a" if change is None else f"{change:+.1f}%"
                cells.append("-" if value is None else f"{value:.2f} ({note})")
            rows.append(cells)
    lines = []
    if ref:
        lines += [f"{comparison.names[0]}: {comparison.reference.get('source', 'a published table')}",
                  f"  measured: {comparison.reference.get('conditions', 'as the report states')}", ""]
    lines.append(_aligned(rows))
    if comparison.threshold_pct is not None:
        lines.append("")
        if comparison.regressions:
            lines.append(f"worse than {comparison.names[0]} by more than {comparison.threshold_pct:g} %:")
            lines += [f"  {r.run} {r.level} {r.metric}: {r.baseline:.2f} -> {r.value:.2f} ({r.worse_pct:.1f} % worse)"
                      for r in comparison.regressions]
        else:
            lines.append(f"no run is worse than {comparison.names[0]} by more than {comparison.threshold_pct:g} %")
    return "\n".join(lines)
