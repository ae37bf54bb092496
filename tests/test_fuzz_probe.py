"""Generated input for the checks the outside tester's pass added: whatever a user or a shared file
holds, the answer is accepted or one ConfigError naming the option or the file, never another error.

- ``--endpoint`` (smoke, bench, top): any text;
- a ``bench compare`` result file: any JSON of levels, and every document accepted is compared and
  printed without an error.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sparkctl.cli.served import check_endpoint
from sparkctl.errors import ConfigError
from sparkctl.ops import bench_results as R

# The example count comes from the loaded profile (tests/conftest.py: 8 in the quick tier, 40 or
# SPARKCTL_FUZZ_EXAMPLES in the full run); the chart property, which draws, takes a quarter of it.
FUZZ = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

URL_PARTS = st.sampled_from(["http://", "https://", "ftp://", "", "[", "]", "::1", ":", "8000", "h", "127.0.0.1",
                             "/", "@", "%", "\n", " ", "?", "#", "-1", "99999", "é", "\x00"])


@FUZZ
@given(st.one_of(st.text(max_size=40), st.lists(URL_PARTS, max_size=8).map("".join)))
def test_any_endpoint_text_is_accepted_or_named(text):
    try:
        check_endpoint(text)
    except ConfigError as err:
        assert err.field == "--endpoint" and "\n" not in str(err)
        return
    assert text.startswith(("http://", "https://")) and text.isprintable()


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=6))
STAT = st.one_of(SCALARS, st.dictionaries(st.sampled_from(["mean", "p50", "p90", "n"]), SCALARS, max_size=4))
KEYS = ["kind", "label", "concurrency", "rate", "prompt_tokens_asked", "prompt_tokens", "ttft_ms", "itl_ms",
        "tps", "latency_s", "rps", "output_tokens_per_s", "prefill_tok_s"]
LEVEL = st.one_of(SCALARS, st.dictionaries(st.sampled_from(KEYS), STAT, max_size=8))
DOC = st.fixed_dictionaries({"levels": st.lists(LEVEL, max_size=4)})


def _compare_or_named(tmp_path, first, second, *, draw_chart: bool) -> None:
    paths = []
    for name, doc in (("a", first), ("b", second)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    try:
        docs = [R.load_result(p) for p in paths]
    except ConfigError as err:
        assert ".json" in str(err) and "\n" not in str(err)
        return
    comparison = R.compare_runs(docs, ["a", "b"], threshold_pct=5.0)
    R.format_comparison(comparison)
    json.dumps(comparison.to_json())
    if draw_chart:
        from sparkctl.ops.bench_charts import compare_chart

        assert compare_chart(docs, ["a", "b"]).startswith(b"\x89PNG")


@FUZZ
@given(DOC, DOC)
def test_any_result_levels_are_compared_or_named(tmp_path, first, second):
    _compare_or_named(tmp_path, first, second, draw_chart=False)


@settings(FUZZ, max_examples=max(settings.default.max_examples // 4, 2))
@given(DOC, DOC)
@example({"levels": [{}]}, {"levels": []})  # a level with no concurrency: the chart's KeyError
def test_any_result_levels_accepted_are_also_charted(tmp_path, first, second):
    """compare --chart draws what compare accepted (a level without its concurrency was a KeyError)."""
    _compare_or_named(tmp_path, first, second, draw_chart=True)
