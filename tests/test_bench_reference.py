"""``bench compare ref:NAME RESULT``: the source reports' measured tables shipped as result files, and
a run shown as a percentage of what the report measured."""

from __future__ import annotations

import json

import pytest

from sparkctl.errors import ConfigError
from sparkctl.ops import bench_results as R
from test_standin_support import sparkctl


def level(doc: dict, label: str) -> dict:
    return next(lv for lv in doc["levels"] if lv["label"] == label)


def test_the_shipped_tables_hold_the_published_figures():
    assert R.reference_names() == ["sglang-line-tp3", "sglang-line-tp4", "sglang-line-tp4-code", "sglang-line-tp4-json",
                                   "sglang-line-tp4-structured", "sglang-tp4-report", "vllm-tp4-report",
                                   "vllm-tp8-1m-report", "vllm-tp8-300k-report"]
    line = R.load_result("ref:sglang-line-tp4")
    assert [level(line, f"C={c}")["output_tokens_per_s"] for c in (1, 2, 4, 8, 16)] == [90.2, 122.0, 164.1, 238.8, 340.9]
    assert [level(line, f"C={c}")["tps"]["mean"] for c in (1, 2, 4, 8, 16)] == [90.2, 62.6, 41.5, 31.0, 22.2]
    assert [level(line, f"prompt={n}")["prefill_tok_s"] for n in (4096, 16384, 32768, 65536, 131072, 262144)] == \
        [3944, 5789, 5855, 5850, 5734, 5286]
    report = R.load_result("ref:sglang-tp4-report")
    assert [level(report, f"C={c}")["output_tokens_per_s"] for c in (1, 2, 4, 8, 16)] == [45.4, 72.9, 103.1, 114.1, 134.2]
    assert level(report, "C=16")["ttft_ms"]["mean"] == 12450
    assert level(report, "prompt=131072")["prefill_tok_s"] == 3251 and level(report, "prompt=131072")["ttft_ms"]["mean"] == 40320
    vllm = R.load_result("ref:vllm-tp4-report")
    assert {k: level(vllm, "C=1")[k]["mean"] for k in ("ttft_ms", "itl_ms", "tps", "latency_s", "rps")} == \
        {"ttft_ms": 271.63, "itl_ms": 32.39, "tps": 29.48, "latency_s": 4.39, "rps": 0.23}
    assert level(R.load_result("ref:vllm-tp8-1m-report"), "C=8")["ttft_ms"]["mean"] == 553.68
    for name in R.reference_names():
        doc = R.load_result(f"ref:{name}")
        assert doc["reference"]["name"] == name and doc["reference"]["source"]


def run_result(tmp_path) -> str:
    """A kept result as `bench --out` writes it (the fields compare reads)."""
    doc = {"levels": [
        {"kind": "concurrency", "label": "C=1", "concurrency": 1, "ttft_ms": {"mean": 250.0}, "tps": {"mean": 45.1},
         "output_tokens_per_s": 45.1},
        {"kind": "concurrency", "label": "C=16", "concurrency": 16, "tps": {"mean": 11.1}, "output_tokens_per_s": 170.45},
        {"kind": "long_prompt", "label": "prompt=32768", "prompt_tokens_asked": 32768,
         "prompt_tokens": {"mean": 32790.0}, "ttft_ms": {"mean": 11200.0}},
    ]}
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    (folder / "result.json").write_text(json.dumps(doc))
    return str(folder)


def test_a_run_is_shown_as_a_percentage_of_the_report(tmp_path):
    result = sparkctl("bench", "compare", "ref:sglang-line-tp4", run_result(tmp_path))
    assert result.code == 0, result
    out = result.stdout
    assert "the SGLang line's source" in out and "(of the report)" in out
    assert "45.10 (50.0%)" in out  # C=1: 45.1 of the report's 90.2 tok/s
    assert "170.45 (50.0%)" in out  # C=16 aggregate: 170.45 of 340.9
    assert "2927.70 (50.0%)" in out  # prefill at 32k: 32790 tokens / 11.2 s of the report's 5855 tok/s
    doc = sparkctl("--json", "bench", "compare", "ref:sglang-line-tp4", run_result(tmp_path)).json()
    c16 = next(r for r in doc["levels"] if r["level"] == "C=16")
    assert c16["percent_of_reference"]["output_tokens_per_s"] == [50.0]
    assert doc["reference"]["name"] == "sglang-line-tp4"
    gated = sparkctl("bench", "compare", "ref:sglang-line-tp4", run_result(tmp_path), "--threshold", "40")
    assert gated.code == 1 and "worse than ref:sglang-line-tp4" in gated.stdout


def test_two_runs_still_show_the_change(tmp_path):
    first = run_result(tmp_path)
    result = sparkctl("bench", "compare", first, first)
    assert result.code == 0 and "(change)" in result.stdout and "+0.0%" in result.stdout and "of the report" not in result.stdout


def test_an_unknown_table_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match="ref:sglang-line-tp4"):
        R.load_result("ref:nope")
    result = sparkctl("bench", "compare", "ref:nope", run_result(tmp_path))
    assert result.code == 2 and "ref:vllm-tp4-report" in result.stderr and "Traceback" not in result.stderr
