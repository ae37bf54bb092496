"""bench's kept results: CSV, PNG charts, HTML, compare and its gate; open-loop arrivals and the new options."""

from __future__ import annotations

import csv
import io
import json
import statistics

import pytest

from sparkctl.errors import ConfigError
from sparkctl.ops import bench as B
from sparkctl.ops import bench_results as R
from test_bench_units import TP4_REPORT, level, result

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def report(levels, *, ttft_ms=1000, tps=20) -> B.BenchReport:
    settings = B.BenchSettings([lv.concurrency for lv in levels if lv.kind == "concurrency"], 4)
    rep = B.BenchReport("http://h:8000", "dsv41", settings, levels, B.slo_capacity(levels, ttft_ms, tps),
                        {"models": ["dsv41"], "max_model_len": 4096, "engine_config": {"max_num_seqs": 4}}, "tp4",
                        "2026-11-30T00:00:00Z", deployment={"profile": "tp4", "image": "img:tag", "image_id": "sha256:ab"},
                        version="0.1.0")
    return rep


def scaled(levels, factor):
    """The same levels with every request's times multiplied by ``factor`` (slower when > 1)."""
    return [level(lv.concurrency, 1000 * lv.results[0].ttft_s * factor, 1000 * lv.results[0].itl_s * factor)
            for lv in levels]


def test_result_document_keeps_every_request():
    doc = report(TP4_REPORT).to_json(with_requests=True)
    assert doc["deployment"]["image_id"] == "sha256:ab" and doc["sparkctl_version"] == "0.1.0"
    assert doc["server"]["engine_config"] == {"max_num_seqs": 4}
    first = doc["levels"][0]["requests_detail"]
    assert len(first) == 4 and first[0]["ttft_s"] == pytest.approx(0.27163) and first[0]["output_tokens"] == 130
    assert first[0]["itl_s"] == pytest.approx(0.03239) and first[0]["chunk_itl_s"] == pytest.approx(0.03239)
    assert "requests_detail" not in report(TP4_REPORT).to_json()["levels"][0]  # --json stays small


def test_csv_is_the_seeds_table():
    rows = list(csv.DictReader(io.StringIO(R.table_csv(report(TP4_REPORT).to_json()))))
    assert [r["Concurrency"] for r in rows] == ["1", "2", "4", "8"]
    assert float(rows[0]["TTFT (ms)"]) == pytest.approx(271.63) and float(rows[3]["ITL (ms)"]) == pytest.approx(110.28)
    assert float(rows[0]["TPS per stream (tok/s)"]) == pytest.approx(29.2, abs=0.1)
    assert float(rows[0]["Throughput per stream (RPS)"]) == pytest.approx(0.22, abs=0.01)
    assert rows[0]["label"] == "C=1" and rows[0]["Failed"] == "0"
    # Per stream and aggregate are told apart in every rate's header (no bare `throughput_rps`).
    assert "Throughput aggregate (RPS)" in rows[0] and "Output aggregate (tok/s)" in rows[0]
    assert not [name for name in rows[0] if "_" in name], list(rows[0])


def test_out_folder_has_json_csv_valid_pngs_and_html(tmp_path):
    from matplotlib.image import imread

    doc = report(TP4_REPORT).to_json(with_requests=True)
    written = R.write_results(doc, str(tmp_path / "run"))
    names = sorted(p.rsplit("/", 1)[1] for p in written)
    assert names == ["itl.png", "report.html", "result.json", "table.csv", "throughput.png", "tps.png", "ttft.png"]
    for png in ("ttft.png", "itl.png", "tps.png", "throughput.png"):
        data = (tmp_path / "run" / png).read_bytes()
        assert data.startswith(PNG_MAGIC)
        pixels = imread(str(tmp_path / "run" / png))
        assert pixels.shape[0] > 300 and pixels.shape[1] > 500 and pixels.std() > 0.05  # a drawn chart, not a blank
    html = (tmp_path / "run" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "Max C = 2" in html and "sha256:ab" in html
    assert "src=\"http" not in html  # self-contained
    assert R.load_result(str(tmp_path / "run")) == json.loads((tmp_path / "run" / "result.json").read_text())


def test_charts_mark_the_slo_and_max_c(monkeypatch):
    from sparkctl.ops import bench_charts as C

    doc = report(TP4_REPORT).to_json()
    plt = C._pyplot()
    captured = {}
    # The figures are read, not drawn: turning them into PNGs (the test above checks those) was most
    # of this test's time.
    monkeypatch.setattr(C, "_png", lambda fig: captured.setdefault(fig.axes[0].get_title(), fig) and b"")
    C.run_charts(doc)
    ttft = captured["Time to first token"].axes[0]
    labels = [line.get_label() for line in ttft.get_lines()]
    assert "SLO TTFT <= 1000 ms" in labels and "Max C = 2" in labels
    slo = next(line for line in ttft.get_lines() if line.get_label().startswith("SLO"))
    assert list(slo.get_ydata()) == [1000, 1000]
    tps = captured["Tokens per second per stream"].axes[0]
    assert "SLO TPS >= 20" in [line.get_label() for line in tps.get_lines()]
    itl = captured["Inter-token latency"].axes[0]
    assert "per chunk (mean)" in [line.get_label() for line in itl.get_lines()]
    plt.close("all")


def test_compare_prints_changes_and_gates():
    base, slower = report(TP4_REPORT).to_json(), report(scaled(TP4_REPORT, 1.10)).to_json()
    same = B.BenchReport.to_json(report(TP4_REPORT))
    ok = R.compare_runs([base, same], ["a", "b"], threshold_pct=5)
    assert ok.ok and ok.rows[0]["ttft_ms"] == [pytest.approx(271.63), pytest.approx(271.63)]
    gated = R.compare_runs([base, slower], ["a", "b"], threshold_pct=5)
    assert not gated.ok
    worse = {(r.level, r.metric) for r in gated.regressions}
    assert ("C=1", "ttft_ms") in worse and ("C=8", "itl_ms") in worse and ("C=1", "tps") in worse
    assert all(r.worse_pct == pytest.approx(10, abs=0.6) for r in gated.regressions if r.metric == "ttft_ms")
    assert R.compare_runs([base, slower], ["a", "b"], threshold_pct=15).ok  # within the threshold
    assert R.compare_runs([slower, base], ["a", "b"], threshold_pct=5).ok  # faster is never a regression
    text = R.format_comparison(gated)
    assert "C=1" in text and "+10.0%" in text and "worse than a by more than 5 %" in text


def test_compare_matches_levels_by_label_and_shows_missing_ones():
    base = report(TP4_REPORT[:2]).to_json()
    more = report(TP4_REPORT).to_json()
    comparison = R.compare_runs([base, more], ["a", "b"], threshold_pct=1)
    assert [row["level"] for row in comparison.rows] == ["C=1", "C=2", "C=4", "C=8"]
    assert comparison.rows[2]["ttft_ms"][0] is None and comparison.ok  # nothing to compare against is no regression


def test_load_result_refuses_what_is_not_a_result(tmp_path):
    with pytest.raises(ConfigError, match="no bench result"):
        R.load_result(str(tmp_path / "nothing"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a bench result"):
        R.load_result(str(tmp_path / "bad.json"))
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="no levels"):
        R.load_result(str(tmp_path / "other.json"))


def test_poisson_arrivals_have_the_asked_rate_and_repeat():
    times = B.poisson_arrivals(5.0, 4000, seed=7)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0 and all(g >= 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.2, rel=0.08)  # exponential: sd = mean
    assert B.poisson_arrivals(5.0, 50, seed=7) == times[:50] and B.poisson_arrivals(5.0, 50, seed=8) != times[:50]


def test_rate_and_prompt_length_options():
    assert B.parse_rates("4, 0.5,2") == [0.5, 2.0, 4.0]
    assert B.parse_prompt_lengths("128k,32k,512K,1m,1000") == [1000, 32768, 131072, 524288, 1048576]
    for bad in ("0", "-1", "x", "1,1", "5000"):
        with pytest.raises(ConfigError, match="--rate"):
            B.parse_rates(bad)
    for bad in ("0", "32q", "k", "8m", "1k,1024"):
        with pytest.raises(ConfigError, match="--long-prompts"):
            B.parse_prompt_lengths(bad)


def test_rate_and_long_levels_stay_out_of_the_seeds_table():
    rate = level(3, 100, 10)
    rate.kind, rate.rate = "rate", 2.0
    long = level(1, 5000, 20)
    long.kind, long.prompt_tokens_asked = "long_prompt", 32768
    rep = report(TP4_REPORT[:2] + [rate, long])
    assert len(B.format_table(rep.levels).splitlines()) == 3
    assert rep.slo.max_concurrency == 2 and [lv["concurrency"] for lv in rep.slo.levels] == [1, 2]
    text = rep.human()
    assert "Rate (req/s)" in text and "\n2 " in text and "32768" in text
    row = next(line for line in B.format_long_table(rep.levels).splitlines() if line.startswith("32768"))
    assert row.split()[1] == "5000.00" and row.split()[3] == "20"  # 100 prompt tokens / 5 s


def test_chunk_itl_differs_from_token_itl_with_multi_token_chunks():
    r = B.RequestResult(True, 0.5, 0.05, 0.05, 0.45, 41, None, 9)  # DSpark: 5 tokens per chunk
    assert r.itl_s == pytest.approx(0.01) and r.chunk_itl_s == pytest.approx(0.05)
    lv = B.LevelResult(1, 1, [r], 1.0)
    assert lv.to_json()["chunk_itl_ms"]["mean"] == pytest.approx(50) and lv.to_json()["itl_ms"]["mean"] == pytest.approx(10)
    assert result(0.1, 0.01, 1).chunk_itl_s is None


def test_out_that_cannot_be_a_folder_is_refused_before_the_run(tmp_path):
    from test_standin_support import free_port, sparkctl

    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        R.check_out_dir(str(tmp_path / "file"))
    R.check_out_dir(str(tmp_path / "new" / "deeper"))  # made when written
    # no server on that port: the refusal comes first, so nothing was measured
    result = sparkctl("bench", "--endpoint", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "file"))
    assert result.code == 2 and "file exists and is not a folder" in result.stderr and "Traceback" not in result.stderr
    assert "--out" in result.stderr


def test_engine_counters_are_reported_per_level_and_for_the_run():
    lv = level(1, 100, 10)
    lv.engine = {"spec_accept_length": 2.345, "prefix_cache_hit_rate": 0.5, "preemptions": 3.0}
    quiet = level(2, 100, 10)
    quiet.engine = {"spec_accept_length": None, "prefix_cache_hit_rate": None, "preemptions": 0.0}
    text = B.format_engine([lv, quiet], {"spec_accept_length": 2.2})
    assert "C=1: mean accepted length 2.35, prefix-cache hit rate 50.0 %, 3 preemptions" in text
    assert "C=2" not in text and "the whole run: mean accepted length 2.20" in text
    assert B.format_engine([quiet], None) == ""
