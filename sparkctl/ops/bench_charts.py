"""Charts of a benchmark result (matplotlib, drawn off-screen) and the self-contained HTML report.

Charts are against concurrency (log2 axis, a tick per tested level) and draw what the table says:
the mean with the p50-p90 band, the SLO targets as dashed lines, the SLO capacity (Max C) as a
vertical line. ITL is drawn twice: per token (what the source reports' tables give) and per chunk (what a
reader sees; longer when speculative decoding sends several tokens per chunk).
"""

from __future__ import annotations

import io
from typing import Optional

from sparkctl.ops.bench_html import render

SLO_STYLE = dict(color="tab:red", linestyle="--", linewidth=1.2)
MAXC_STYLE = dict(color="tab:green", linestyle=":", linewidth=1.5)


def _pyplot():
    # here, not at the top: matplotlib costs most of a second, and only the charts need it
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def _closed(doc: dict) -> list[dict]:
    return sorted((lv for lv in doc.get("levels", []) if lv.get("kind", "concurrency") == "concurrency"),
                  key=lambda lv: lv["concurrency"])


def _series(levels: list[dict], key: str, stat: str) -> list[Optional[float]]:
    """``stat`` of ``key`` per level; a bare number (a published table's cell) is a mean."""
    values = [lv.get(key) for lv in levels]
    return [v.get(stat) if isinstance(v, dict) else v if stat == "mean" and isinstance(v, (int, float)) else None
            for v in values]


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def _concurrency_axes(ax, cs: list[int]) -> None:
    if len(cs) > 1 and min(cs) > 0:
        ax.set_xscale("log", base=2)
    ax.set_xticks(cs)
    ax.set_xticklabels([str(c) for c in cs])
    ax.set_xlabel("concurrency (streams)")
    ax.grid(True, alpha=0.3)


def _mark_max_c(ax, doc: dict) -> None:
    max_c = (doc.get("slo") or {}).get("max_concurrency")
    if max_c:
        ax.axvline(max_c, **MAXC_STYLE, label=f"Max C = {max_c}")


def _band_chart(doc: dict, key: str, title: str, ylabel: str, slo_value: Optional[float], slo_label: str,
                extra: Optional[tuple[str, str]] = None) -> bytes:
    plt = _pyplot()
    levels = _closed(doc)
    cs = [lv["concurrency"] for lv in levels]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    mean, p50, p90 = (_series(levels, key, s) for s in ("mean", "p50", "p90"))
    ax.plot(cs, mean, marker="o", color="tab:blue", label="mean")
    if all(v is not None for v in p50 + p90):
        ax.fill_between(cs, p50, p90, color="tab:blue", alpha=0.15, label="p50-p90")
    if extra is not None:
        extra_key, extra_label = extra
        ax.plot(cs, _series(levels, extra_key, "mean"), marker="s", color="tab:orange", linestyle="--",
                markerfacecolor="none", markersize=9, label=extra_label)  # hollow: the mean shows through
    if slo_value is not None:
        ax.axhline(slo_value, **SLO_STYLE, label=slo_label)
    _mark_max_c(ax, doc)
    _concurrency_axes(ax, cs)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _png(fig)


def _throughput_chart(doc: dict) -> bytes:
    plt = _pyplot()
    levels = _closed(doc)
    cs = [lv["concurrency"] for lv in levels]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(cs, [lv.get("output_tokens_per_s") for lv in levels], marker="o", color="tab:purple",
            label="output tokens/s (all streams)")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.plot(cs, [lv.get("throughput_rps") for lv in levels], marker="s", color="tab:gray", linestyle="--",
               markerfacecolor="none", markersize=9, label="requests/s")
    ax.set_zorder(right.get_zorder() + 1)  # the tokens/s line in front (at a fixed output length the two coincide)
    ax.patch.set_visible(False)
    right.set_ylabel("completed requests/s")
    right.set_ylim(bottom=0)
    _mark_max_c(ax, doc)
    _concurrency_axes(ax, cs)
    ax.set_title("Aggregate throughput")
    handles = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="upper left")
    return _png(fig)


def _long_prompt_chart(levels: list[dict]) -> bytes:
    plt = _pyplot()
    levels = sorted(levels, key=lambda lv: lv["prompt_tokens_asked"])
    xs = [lv["prompt_tokens_asked"] for lv in levels]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(xs, [v / 1000 if v is not None else None for v in _series(levels, "ttft_ms", "mean")], marker="o",
            label="TTFT mean")
    ax.plot(xs, [v / 1000 if v is not None else None for v in _series(levels, "ttft_ms", "max")], marker="^",
            linestyle="--", label="TTFT max")
    if len(xs) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x // 1024}k" if x >= 1024 else str(x) for x in xs])
    return _finish_line_chart(fig, ax, "prompt tokens", "seconds", "Time to first token of long prompts (one at a time)")


def _rate_chart(levels: list[dict], slo_ttft_ms: Optional[float]) -> bytes:
    plt = _pyplot()
    levels = sorted(levels, key=lambda lv: lv["rate"])
    xs = [lv["rate"] for lv in levels]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(xs, _series(levels, "ttft_ms", "p50"), marker="o", label="TTFT p50")
    ax.plot(xs, _series(levels, "ttft_ms", "p90"), marker="^", linestyle="--", label="TTFT p90")
    if slo_ttft_ms:
        ax.axhline(slo_ttft_ms, **SLO_STYLE, label=f"SLO TTFT <= {slo_ttft_ms:g} ms")
    return _finish_line_chart(fig, ax, "offered rate (requests/s, Poisson arrivals)", "ms",
                              "Open loop: TTFT against the offered rate")


def _finish_line_chart(fig, ax, xlabel: str, ylabel: str, title: str) -> bytes:
    """Labels, a y axis from 0, a light grid, the title and legend; the PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _png(fig)


def run_charts(doc: dict) -> dict[str, bytes]:
    """{file name: PNG bytes} for one result document."""
    slo = doc.get("slo") or {}
    charts: dict[str, bytes] = {}
    if _closed(doc):
        charts["ttft.png"] = _band_chart(doc, "ttft_ms", "Time to first token", "ms", slo.get("ttft_ms"),
                                         f"SLO TTFT <= {slo.get('ttft_ms'):g} ms" if slo.get("ttft_ms") else "")
        charts["itl.png"] = _band_chart(doc, "itl_ms", "Inter-token latency", "ms per token", None, "",
                                        extra=("chunk_itl_ms", "per chunk (mean)"))
        charts["tps.png"] = _band_chart(doc, "tps", "Tokens per second per stream", "tok/s", slo.get("tokens_per_s"),
                                        f"SLO TPS >= {slo.get('tokens_per_s'):g}" if slo.get("tokens_per_s") else "")
        charts["throughput.png"] = _throughput_chart(doc)
    rate = [lv for lv in doc.get("levels", []) if lv.get("kind") == "rate"]
    if rate:
        charts["rate.png"] = _rate_chart(rate, slo.get("ttft_ms"))
    long = [lv for lv in doc.get("levels", []) if lv.get("kind") == "long_prompt"]
    if long:
        charts["long_prompt.png"] = _long_prompt_chart(long)
    return charts


def compare_chart(docs: list[dict], names: list[str]) -> bytes:
    """The runs overlaid: TTFT, ITL, per-stream TPS and aggregate tokens/s against concurrency."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [("ttft_ms", "TTFT (ms)"), ("itl_ms", "ITL (ms per token)"), ("tps", "TPS per stream (tok/s)"),
              ("output_tokens_per_s", "aggregate output tokens/s")]
    all_cs: set[int] = set()
    for doc, name in zip(docs, names):
        levels = _closed(doc)
        cs = [lv["concurrency"] for lv in levels]
        all_cs.update(cs)
        for ax, (key, _) in zip(axes.flat, panels):
            ys = [lv.get(key) for lv in levels] if key == "output_tokens_per_s" else _series(levels, key, "mean")
            ax.plot(cs, ys, marker="o", label=name)
    for ax, (_, title) in zip(axes.flat, panels):
        _concurrency_axes(ax, sorted(all_cs))
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def html_report(doc: dict, charts: dict[str, bytes]) -> str:
    """One HTML file a person reads: summary, tables, SLO verdicts, engine counters, captioned charts."""
    return render(doc, charts)
