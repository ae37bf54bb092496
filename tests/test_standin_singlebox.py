"""The stand-in single-box engine as a real process on 127.0.0.1: /health engine_config, x_engine_stats,
the three thinking switches with the README's effort mapping, reasoning_content, one request at a time."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

import httpx
import pytest

from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.standin.simulate import ApiError
from sparkctl.standin.singlebox import thinking_for
from test_standin_support import Proc, free_port, wait_http

pytestmark = pytest.mark.integration  # the single-box stand-in served as a process

ARGV = [sys.executable, "-m", "sparkctl.standin", "singlebox", "--engine", "v41"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("box") / "model"
    make_checkpoint(str(path), vocab_size=64)
    return str(path)


@pytest.fixture
def box(model, tmp_path):
    started = []

    def start(**env):
        port = free_port()
        full = {"MODEL_DIR": model, "HOST": "127.0.0.1", "PORT": str(port), "SERVED_MODEL_NAME": "dsv41",
                "MAX_SEQ": "4096", "SPEC": "1", "EXPERT_FORMAT": "cb3", "PRUNE_KEEP": "0.39", "ARENA_GB": "87",
                "SPARKCTL_STANDIN_ITL_MS": "1", **env}
        proc = Proc(ARGV, tmp_path / f"box{len(started)}.log", env=full)
        started.append(proc)
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc, timeout=60)
        return f"http://127.0.0.1:{port}", proc

    yield start
    for proc in started:
        proc.stop()


def chat(url, **body):
    doc = {"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 64, **body}
    return httpx.post(f"{url}/v1/chat/completions", json=doc, timeout=60)


def test_health_carries_engine_config(box):
    url, _ = box()
    doc = httpx.get(f"{url}/health", timeout=10).json()
    config = doc["engine_config"]
    assert (config["arena_gb"], config["arena_slots"], config["resident_experts_pct"]) == (87.0, 6000, 39.1)
    assert config["max_seq"] == 4096 and config["spec"] is True and config["kernel"] == "triton-fp4"
    assert config["default_thinking"] == "off"


def test_fp4_arena_slots_and_streamed_gb_per_request(box):
    url, _ = box(EXPERT_FORMAT="fp4", ARENA_GB="73.8", PRUNE_KEEP="")
    reply = chat(url, max_tokens=10, ignore_eos=True).json()
    stats = reply["x_engine_stats"]
    assert stats["arena_slots"] == 3925 and stats["resident_experts_pct"] == 25.6
    assert stats["hit_rate"] == pytest.approx(0.83, abs=0.01)
    # README: ~0.92 GB streamed per generated token at this resident set
    assert stats["nvme_gb"] == pytest.approx(10 * 0.92, rel=0.05)
    assert stats["completion_tokens"] == 10 and stats["acceptance_length"] > 1


def test_thinking_off_by_default_and_each_switch_turns_it_on(box):
    url, _ = box()
    plain = chat(url).json()
    assert plain["choices"][0]["message"]["reasoning_content"] is None
    assert plain["x_engine_stats"]["thinking"] is False
    for switch in ({"chat_template_kwargs": {"thinking": True}}, {"enable_thinking": True},
                   {"reasoning_effort": "high"}):
        reply = chat(url, **switch).json()
        message = reply["choices"][0]["message"]
        assert message["reasoning_content"], switch
        assert "</think>" not in message["content"] and "</think>" not in message["reasoning_content"]
        assert reply["x_engine_stats"]["thinking"] is True
    assert chat(url, reasoning_effort="high").json()["x_engine_stats"]["effort"] == 75
    low = chat(url, reasoning_effort="low").json()
    assert low["choices"][0]["message"]["reasoning_content"] is None and low["x_engine_stats"]["effort"] == 50


def test_default_thinking_on_and_first_switch_wins(box):
    url, _ = box(DEFAULT_THINKING="on", DEFAULT_EFFORT="90")
    on = chat(url).json()
    assert on["choices"][0]["message"]["reasoning_content"] and on["x_engine_stats"]["effort"] == 90
    off = chat(url, chat_template_kwargs={"thinking": False}, reasoning_effort="max").json()
    assert off["choices"][0]["message"]["reasoning_content"] is None


def test_streaming_sends_reasoning_content_and_stats_on_the_last_chunk(box):
    url, _ = box()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True,
            "chat_template_kwargs": {"thinking": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        raw = "".join(response.iter_text())
    events = [block[len("data: "):] for block in raw.split("\n\n") if block.strip()]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    kinds = [next(iter(c["choices"][0]["delta"])) for c in chunks]
    assert kinds[0] == "reasoning_content" and "content" in kinds
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning_content")
    assert "x_engine_stats" in chunks[-1] and chunks[-1]["choices"][0]["finish_reason"]
    assert all("x_engine_stats" not in c for c in chunks[:-1])


def test_one_request_at_a_time_second_waits(box):
    # The first request decodes for 4 s (40 steps of 100 ms, sleeps that load only lengthens): time
    # enough, even on a loaded machine, to see the second one queued behind it.
    url, _ = box(SPARKCTL_STANDIN_ITL_MS="100")
    results = {}

    def call(name, tokens):
        begun = time.monotonic()
        reply = chat(url, max_tokens=tokens, ignore_eos=True)
        results[name] = (begun, time.monotonic(), reply.status_code)

    first = threading.Thread(target=call, args=("a", 40))
    first.start()
    deadline = time.monotonic() + 30
    while not httpx.get(f"{url}/health", timeout=5).json()["busy"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = threading.Thread(target=call, args=("b", 2))
    second.start()
    while httpx.get(f"{url}/health", timeout=5).json()["waiting"] != 1:
        assert time.monotonic() < deadline, "the second request never waited"
        time.sleep(0.01)
    first.join(60)
    second.join(60)
    assert results["a"][2] == results["b"][2] == 200
    assert results["b"][1] >= results["a"][1]  # served after the first finished, not refused


def test_bad_switch_values_are_400_naming_the_field():
    with pytest.raises(ApiError) as err:
        thinking_for({"reasoning_effort": "extreme"}, False, 75)
    assert err.value.status == 400 and err.value.param == "reasoning_effort"
    with pytest.raises(ApiError) as err:
        thinking_for({"reasoning_effort": 101}, False, 75)
    assert err.value.param == "reasoning_effort"
    assert thinking_for({"reasoning_effort": 33}, False, 75) == (True, 33)
    assert thinking_for({"reasoning_effort": "none"}, True, 75) == (False, None)
    assert thinking_for({"reasoning_effort": "medium"}, False, 75) == (True, 60)
    assert thinking_for({"reasoning_effort": "xhigh"}, False, 75) == (True, 90)
    assert thinking_for({"enable_thinking": True, "reasoning_effort": "none"}, False, 75) == (True, 75)


def test_missing_checkpoint_and_taken_port_exit_1(box, model, tmp_path):
    missing = Proc(ARGV, tmp_path / "missing.log", env={"MODEL_DIR": str(tmp_path / "nothing"), "PORT": str(free_port())})
    assert missing.wait(30) == 1 and "does not exist" in missing.output
    url, _ = box()
    port = url.rsplit(":", 1)[1]
    taken = Proc(ARGV, tmp_path / "taken.log", env={"MODEL_DIR": model, "HOST": "127.0.0.1", "PORT": port})
    assert taken.wait(30) == 1 and "cannot bind" in taken.output


def test_sigterm_exits_zero(box):
    _, proc = box()
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0 and "received SIGTERM" in proc.output


def test_bench_keeps_engine_config_and_per_request_x_engine_stats(box):
    from sparkctl.ops.bench import BenchSettings, run_bench

    url, _ = box(EXPERT_FORMAT="fp4", ARENA_GB="73.8", PRUNE_KEEP="")
    settings = BenchSettings(concurrency=[1, 2], requests=3, max_tokens=12, prompt_tokens=32, warmup=0)
    report = run_bench(url, "dsv41", settings, slo_ttft_ms=1000, slo_tps=1)
    doc = report.to_json()
    assert doc["server"]["engine_config"]["arena_slots"] == 3925
    for level in doc["levels"]:
        assert len(level["x_engine_stats"]) == level["completed"] == 3
        assert all(s["completion_tokens"] == 12 and s["nvme_gb"] > 0 for s in level["x_engine_stats"])
        assert level["engine_stats"]["hit_rate_mean"] == pytest.approx(0.83, abs=0.01)
    assert "hit rate" in report.human() and "NVMe" in report.human()


def test_smoke_checks_the_three_thinking_switches(box):
    from sparkctl.ops.smoke import run_smoke

    url, _ = box()
    report = run_smoke(url, model="dsv41", engine="single-box", timeout_s=60)
    names = [c.name for c in report.checks]
    assert names == ["models", "chat", "chat_stream", "thinking_default_off", "thinking_kwargs", "thinking_enable",
                     "thinking_effort", "completions"]
    assert report.ok, report.human()
    on_by_default, _ = box(DEFAULT_THINKING="on")
    failed = {c.name: c.detail for c in run_smoke(on_by_default, model="dsv41", engine="single-box").checks if not c.ok}
    assert list(failed) == ["thinking_default_off"] and "without any switch" in failed["thinking_default_off"]


def test_smoke_cli_accepts_the_single_box_engine(box, cli):
    url, _ = box()
    result = cli("--json", "smoke", "--endpoint", url, "--model", "dsv41", "--engine", "single-box")
    assert result.code == 0, result
    assert {c["name"] for c in result.json()["checks"]} >= {"thinking_kwargs", "thinking_enable", "thinking_effort"}
