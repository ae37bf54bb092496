"""``report.html``: a benchmark result as a page a person reads, in one self-contained file.

Built from the result document alone (``result.json``), so a kept result renders the same later.
In order: the summary (the figures one looks for first), the tables the terminal prints (the
source reports' table, percentiles, SLO verdicts per level, open-loop and long-prompt levels), the
engine's own counters (speculative decoding, prefix cache), the charts with captions, and what
was run against what. Laid out for a 1280 px window: nothing is wider than the page, wide tables
scroll inside their own box.
"""

from __future__ import annotations

import base64
import html
import json
from typing import Optional

_e = html.escape

CAPTIONS = {
    "ttft.png": "Time to first token per concurrency: mean, with the p50-p90 band; the dashed line is the SLO target.",
    "itl.png": "Inter-token latency per concurrency: per token (mean and p50-p90) and per streamed chunk.",
    "tps.png": "Tokens per second seen by one stream, per concurrency; the dashed line is the SLO floor.",
    "throughput.png": "The whole level, per concurrency: output tokens per second of all streams together, and completed requests per second.",
    "rate.png": "Open loop (Poisson arrivals): time to first token against the request rate asked.",
    "long_prompt.png": "Long prompts: time to first token (the prefill of the whole prompt) against prompt length.",
}

CSS = """
*{box-sizing:border-box}body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2430;
background:#f5f6f8;margin:0}main{max-width:1200px;margin:0 auto;padding:24px 32px 48px}
header h1{font-size:26px;margin:0 0 4px}header p{margin:0;color:#5b6472}
h2{font-size:19px;margin:32px 0 10px;padding-bottom:4px;border-bottom:2px solid #dfe3ea}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin-top:18px}
.card{background:#fff;border:1px solid #dfe3ea;border-radius:8px;padding:12px 14px}
.card .k{font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:#5b6472}
.card .v{font-size:24px;font-weight:600;margin-top:2px}.card .n{font-size:12px;color:#5b6472}
.box{background:#fff;border:1px solid #dfe3ea;border-radius:8px;overflow-x:auto;margin:8px 0}
table{border-collapse:collapse;width:100%;font-size:14px;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;text-align:right;border-bottom:1px solid #eef0f4;white-space:nowrap}
th{background:#f0f2f6;font-weight:600;white-space:normal;vertical-align:bottom}th:first-child,td:first-child{text-align:left}
.note{color:#5b6472;font-size:13px;margin:4px 0 0}
.ok{color:#0a7d33;font-weight:600}.miss{color:#b42318;font-weight:600}
.figs{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:16px}
figure{margin:0;background:#fff;border:1px solid #dfe3ea;border-radius:8px;padding:10px}
figure img{width:100%;height:auto;display:block}figcaption{font-size:13px;color:#38404d;margin-top:6px}
dl{display:grid;grid-template-columns:200px 1fr;gap:4px 16px;margin:0;padding:12px 14px}
dt{color:#5b6472}dd{margin:0;overflow-wrap:anywhere}pre{margin:0;padding:12px;font-size:12px;overflow:auto;max-height:360px}
"""


def _num(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}" if not float(value).is_integer() or digits else f"{value:,.0f}"
    return str(value)


def _stat(level: dict, name: str, stat: str = "mean") -> Optional[float]:
    value = level.get(name)
    return value.get(stat) if isinstance(value, dict) else None


def _table(header: list[str], rows: list[list[str]], note: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    extra = f'<p class="note">{_e(note)}</p>' if note else ""
    return f'<div class="box"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{extra}'


def _closed(doc: dict) -> list[dict]:
    return [lv for lv in doc.get("levels", []) if lv.get("kind", "concurrency") == "concurrency"]


def _card(key: str, value: str, note: str = "") -> str:
    return (f'<div class="card"><div class="k">{_e(key)}</div><div class="v">{_e(value)}</div>'
            f'<div class="n">{_e(note)}</div></div>')


def summary(doc: dict) -> str:
    closed, slo = _closed(doc), doc.get("slo") or {}
    cards = []
    if slo:
        max_c = slo.get("max_concurrency")
        cards.append(_card("SLO capacity", f"Max C = {max_c}" if max_c else "not met",
                           f"TTFT <= {_num(slo.get('ttft_ms'), 0)} ms, TPS >= {_num(slo.get('tokens_per_s'), 0)} tok/s"))
    if closed:
        first, last = closed[0], closed[-1]
        cards.append(_card("TTFT at C=%s" % first.get("concurrency"), f"{_num(_stat(first, 'ttft_ms'), 0)} ms", "mean"))
        cards.append(_card("TPS per stream", f"{_num(_stat(first, 'tps'), 1)} tok/s", f"at C={first.get('concurrency')}, mean"))
        cards.append(_card("Aggregate output", f"{_num(last.get('output_tokens_per_s'), 0)} tok/s",
                           f"at C={last.get('concurrency')}, the whole level"))
    levels = doc.get("levels", [])
    done = sum(lv.get("completed", 0) for lv in levels)
    failed = sum(lv.get("failed", 0) for lv in levels)
    cards.append(_card("Requests", f"{done:,}", f"{failed} failed" if failed else "none failed"))
    engine = doc.get("engine") or {}
    if engine.get("spec_accept_length") is not None:
        cards.append(_card("Spec decode", f"{engine['spec_accept_length']:.2f}", "mean accepted length (run)"))
    if engine.get("prefix_cache_hit_rate") is not None:
        cards.append(_card("Prefix cache", f"{100 * engine['prefix_cache_hit_rate']:.1f} %", "hit rate (run)"))
    return f'<div class="cards">{"".join(cards)}</div>'


def results_tables(doc: dict) -> str:
    closed = _closed(doc)
    if not closed:
        return '<p class="note">No concurrency levels in this run.</p>'
    main = [[str(lv.get("concurrency")), _num(_stat(lv, "ttft_ms")), _num(_stat(lv, "itl_ms")), _num(_stat(lv, "tps")),
             _num(_stat(lv, "latency_s")), _num(_stat(lv, "rps")), _num(lv.get("throughput_rps")),
             _num(lv.get("output_tokens_per_s"), 1)] for lv in closed]
    out = _table(["Concurrency", "TTFT (ms)", "ITL (ms)", "TPS per stream (tok/s)", "Latency (s)",
                  "Throughput per stream (RPS)", "Throughput aggregate (RPS)", "Output aggregate (tok/s)"], main,
                 "Means over the completed requests. Per stream: what one request saw (the source reports' columns); "
                 "aggregate: the whole level's completed requests or tokens over its wall time.")

    def pair(lv, name):
        p50, p90 = _stat(lv, name, "p50"), _stat(lv, name, "p90")
        return "-" if p50 is None else f"{_num(p50)} / {_num(p90)}"

    rows = [[str(lv.get("concurrency")), pair(lv, "ttft_ms"), pair(lv, "itl_ms"), pair(lv, "tps"), pair(lv, "latency_s"),
             f"{lv.get('completed')}/{lv.get('requests')}" + (f" ({lv.get('failed')} failed)" if lv.get("failed") else "")
             + (f" ({lv.get('short_outputs')} short)" if lv.get("short_outputs") else "")] for lv in closed]
    out += _table(["Concurrency", "TTFT p50 / p90 (ms)", "ITL p50 / p90 (ms)", "TPS p50 / p90 (tok/s)",
                   "Latency p50 / p90 (s)", "Requests"], rows)
    return out


def slo_section(doc: dict) -> str:
    slo = doc.get("slo") or {}
    levels = slo.get("levels") or []
    if not levels:
        return '<p class="note">No SLO verdict (no concurrency levels).</p>'

    def mark(ok: bool) -> str:
        return '<span class="ok">ok</span>' if ok else '<span class="miss">miss</span>'

    rows = [[str(lv["concurrency"]), _num(lv.get("ttft_ms")), mark(lv.get("ttft_ok")), _num(lv.get("tps")),
             mark(lv.get("tps_ok")), str(lv.get("failed_requests", 0)), mark(lv.get("ok"))] for lv in levels]
    max_c = slo.get("max_concurrency")
    verdict = (f"Max C = {max_c}: the largest concurrency at which it and every smaller one meet both targets"
               if max_c else "Not met even at the lowest concurrency.")
    return (f"<p><b>{_e(verdict)}</b> (TTFT &le; {_num(slo.get('ttft_ms'), 0)} ms and TPS &ge; "
            f"{_num(slo.get('tokens_per_s'), 0)} tok/s, on the mean, no failed request).</p>"
            + _table(["Concurrency", "TTFT (ms)", "TTFT", "TPS (tok/s)", "TPS", "Failed requests", "Verdict"], rows))


def other_levels(doc: dict) -> str:
    levels = doc.get("levels", [])
    rate = [lv for lv in levels if lv.get("kind") == "rate"]
    long = [lv for lv in levels if lv.get("kind") == "long_prompt"]
    out = ""
    if rate:
        out += "<h2>Open loop (Poisson arrivals)</h2>" + _table(
            ["Rate asked (req/s)", "Completed (req/s, aggregate)", "Most in flight", "TTFT p50 / p90 (ms)", "ITL (ms)",
             "TPS per stream (tok/s)", "Latency p90 (s)", "Requests"],
            [[_num(lv.get("rate")), _num(lv.get("throughput_rps")), str(lv.get("concurrency")),
              f"{_num(_stat(lv, 'ttft_ms', 'p50'))} / {_num(_stat(lv, 'ttft_ms', 'p90'))}", _num(_stat(lv, "itl_ms")),
              _num(_stat(lv, "tps")), _num(_stat(lv, "latency_s", "p90")), f"{lv.get('completed')}/{lv.get('requests')}"]
             for lv in rate])
    if long:
        out += "<h2>Long prompts</h2>" + _table(
            ["Prompt tokens", "TTFT mean (ms)", "TTFT max (ms)", "ITL (ms)", "Requests"],
            [[str(lv.get("prompt_tokens_asked")), _num(_stat(lv, "ttft_ms")), _num(_stat(lv, "ttft_ms", "max")),
              _num(_stat(lv, "itl_ms")), f"{lv.get('completed')}/{lv.get('requests')}"] for lv in long])
    return out


def engine_section(doc: dict) -> str:
    """Speculative decoding and the prefix cache, from the engine's own /metrics per level and run."""
    rows = []
    for lv in doc.get("levels", []) + [{"label": "the whole run", "engine": doc.get("engine")}]:
        e = lv.get("engine") or {}
        if not any(e.get(k) is not None for k in ("spec_accept_length", "prefix_cache_hit_rate", "preemptions")):
            continue
        hit = e.get("prefix_cache_hit_rate")
        rows.append([_e(str(lv.get("label"))), _num(e.get("spec_accept_length")),
                     "-" if hit is None else f"{100 * hit:.1f} %", _num(e.get("preemptions"), 0),
                     _num(e.get("generation_tokens_per_s"), 1)])
    if not rows:
        return ('<p class="note">The engine reported no speculative-decoding or prefix-cache counters for this run '
                "(no /metrics, or neither feature is on).</p>")
    return _table(["Level", "Spec decode: mean accepted length", "Prefix-cache hit rate", "Preemptions",
                   "Engine output (tok/s)"], rows,
                  "Mean accepted length: tokens per decoding step with speculative (DSpark) drafts, 1.0 without. "
                  "Prompts differ per request, so a high prefix-cache hit rate means a shared system prompt.")


def charts_section(charts: dict[str, bytes]) -> str:
    if not charts:
        return '<p class="note">No charts (nothing to plot).</p>'
    figures = []
    for name, data in charts.items():
        caption = CAPTIONS.get(name, name)
        figures.append(f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
                       f"<figcaption>{_e(caption)}</figcaption></figure>")
    return f'<div class="figs">{"".join(figures)}</div>'


def run_facts(doc: dict) -> str:
    settings, deployment = doc.get("settings") or {}, doc.get("deployment") or {}
    facts = [("Endpoint", doc.get("endpoint")), ("Model", doc.get("model")), ("When", doc.get("when")),
             ("Profile", doc.get("profile")), ("Image", deployment.get("image")), ("Image ID", deployment.get("image_id")),
             ("sparkctl", doc.get("sparkctl_version")),
             ("Requests", f"{settings.get('prompt_tokens')} prompt / {settings.get('max_tokens')} output tokens, streamed"
                          + (", ignore_eos" if settings.get("ignore_eos") else ""))]
    facts += [("Skipped", note) for note in doc.get("skipped") or []]
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(str(v))}</dd>" for k, v in facts if v is not None)
    config = (doc.get("server") or {}).get("engine_config")
    if config is None:  # vLLM's and SGLang's /health have no body: there is no configuration to show
        return f'<div class="box"><dl>{items}</dl></div>'
    return (f'<div class="box"><dl>{items}</dl></div><details><summary>The engine\'s configuration (/health)'
            f'</summary><div class="box"><pre>{_e(json.dumps(config, indent=1))}</pre></div></details>')


def render(doc: dict, charts: dict[str, bytes]) -> str:
    title = f"Benchmark: {doc.get('model') or 'default model'}" + (f" on {doc['profile']}" if doc.get("profile") else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title><style>{CSS}</style></head><body><main>
<header><h1>{_e(title)}</h1><p>{_e(str(doc.get('endpoint')))} &middot; {_e(str(doc.get('when')))}</p></header>
{summary(doc)}
<h2>Results per concurrency</h2>
{results_tables(doc)}
<h2>SLO verdicts</h2>
{slo_section(doc)}
{other_levels(doc)}
<h2>Speculative decoding and prefix cache</h2>
{engine_section(doc)}
<h2>Charts</h2>
{charts_section(charts)}
<h2>The run</h2>
{run_facts(doc)}
</main></body></html>
"""
