"""report.html is a page a person reads: a summary, the terminal's tables with human headers, the
SLO verdicts, the engine's speculative-decoding and prefix-cache counters, captioned charts, and
it fits a 1280 px window (laid out by headless Chromium)."""

from __future__ import annotations

import re

import pytest

import sparkctl.ops.bench as B
from sparkctl.ops import browser_check
from sparkctl.ops.bench_charts import html_report, run_charts
from sparkctl.ops.bench_html import CAPTIONS
from test_bench_units import TP4_REPORT

ENGINE = {"engine": "vllm", "spec_accept_length": 2.41, "prefix_cache_hit_rate": 0.125, "prompt_tokens_per_s": 900.0,
          "generation_tokens_per_s": 61.0, "preemptions": 0.0}


def _doc() -> dict:
    for level in TP4_REPORT:
        level.engine = dict(ENGINE)
    report = B.BenchReport(
        endpoint="http://10.0.0.1:8000", model="deepseek-ai/DeepSeek-V4.1-Flash", settings=B.BenchSettings(concurrency=[1, 2, 4, 8], requests=4),
        levels=TP4_REPORT, slo=B.slo_capacity(TP4_REPORT, 1000, 20), profile="tp4", when="2026-01-01T00:00:00Z",
        engine=dict(ENGINE))
    return report.to_json(True)


@pytest.fixture(scope="module")
def page() -> str:
    doc = _doc()
    return html_report(doc, run_charts(doc))


def _headers(page: str) -> list[str]:
    return re.findall(r"<th>([^<]*)</th>", page)


def test_the_page_has_every_section_the_terminal_prints(page):
    for heading in ("Results per concurrency", "SLO verdicts", "Speculative decoding and prefix cache", "Charts"):
        assert f"<h2>{heading}</h2>" in page
    assert "Max C = 2" in page and page.count('class="miss"') == 4  # C=4 and C=8 miss TPS (and the verdict)
    assert "2.41" in page and "12.5 %" in page  # the engine's accepted length and prefix-cache hit rate
    headers = _headers(page)
    assert "TPS per stream (tok/s)" in headers and "Throughput aggregate (RPS)" in headers
    assert not [h for h in headers if "_" in h], headers  # no raw CSV names


def test_charts_have_captions_not_file_names(page):
    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", page)
    assert len(captions) == 4 and all(caption in CAPTIONS.values() for caption in captions)
    assert not [c for c in captions if c.endswith(".png")]


@pytest.mark.integration
def test_the_page_fits_1280_px_in_chromium(page):
    if browser_check.chromium() is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it)")
    layout = browser_check.measure(page, width=1280)
    assert layout.scroll_width <= 1280, layout
    assert layout.images == 4 and layout.broken_images == 0, layout
    # The check can fail: the same page with one unbreakable 3000 px line is measured wider.
    wide = browser_check.measure(page.replace("<main>", '<main><div style="width:3000px">x</div>'), width=1280)
    assert wide.scroll_width > 1280, wide
