"""sparkctl bench beside guidellm 0.8.1 against one endpoint, in one run: the per-metric ratios.

Both tools stream chat completions of the same shape (--prompt-tokens prompt / --max-tokens output
tokens, ignore_eos, closed loop at C = 1, 2, 4, 8) to the same endpoint, in interleaved rounds
(round 1: sparkctl then guidellm, round 2: guidellm then sparkctl, ...), so a machine that gets
busier or quieter during the run moves both. Per level it prints each tool's figure (the mean
over rounds) and sparkctl / guidellm for TTFT p50, ITL, per-stream TPS, latency and the aggregate
request rate.

guidellm is not a dependency of sparkctl: install it in a venv of its own (it brings torch),

    python3 -m venv /tmp/guidellm-venv && /tmp/guidellm-venv/bin/pip install guidellm==0.8.1

then, with a served endpoint (e.g. the sandbox's: `sparkctl status --profile sandbox`):

    .venv/bin/python bench/guidellm_side_by_side.py --endpoint http://10.231.0.11:8000 \\
        [--model deepseek-v4.1-flash] [--concurrency 1,2,4,8] [--rounds 3] [--guidellm /tmp/guidellm-venv/bin/guidellm]

guidellm builds its synthetic prompts with a Hugging Face tokenizer and cannot download one
here, so the script writes a small word-level tokenizer (guidellm's own lorem word list, split
on words and punctuation as the stand-in engine counts tokens) and points guidellm at it. A
prompt of N tokens is then about N tokens to the stand-in too; against a real engine the two
tools' prompts differ in content, not in the measured shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

METRICS = [  # key, label, True when the figure is a rate (higher is better)
    ("ttft_p50_ms", "TTFT p50 (ms)"), ("itl_ms", "ITL (ms)"), ("tps", "TPS per stream"),
    ("latency_s", "latency (s)"), ("rps", "aggregate RPS"),
]

MAKE_TOKENIZER = r"""
import json, sys
from faker.providers.lorem.en_US import Provider
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
out = sys.argv[1]
vocab = {"[UNK]": 0}
for word in sorted({w.lower() for w in Provider.word_list}) + list(".,;:!?'-") + [str(d) for d in range(10)]:
    vocab.setdefault(word, len(vocab))
tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tokenizer.normalizer = normalizers.Lowercase()
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.save(out + "/tokenizer.json")
with open(out + "/tokenizer_config.json", "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 10**7}, f)
"""


def sparkctl_round(endpoint: str, model: str, levels: list[int], requests: int, prompt_tokens: int,
                   max_tokens: int, first_index: int) -> dict[int, dict]:
    from sparkctl.ops.bench import run_level

    out = {}
    for c in levels:
        n = max(requests, c)
        level = run_level(endpoint, model=model, concurrency=c, requests=n, max_tokens=max_tokens,
                          prompt_tokens=prompt_tokens, first_index=first_index)
        first_index += n
        if level.failed:
            raise SystemExit(f"sparkctl C={c}: {len(level.failed)} request(s) failed: {level.failed[0].error}")
        out[c] = {"ttft_p50_ms": level.stat("ttft_ms")["p50"], "itl_ms": level.mean("itl_ms"), "tps": level.mean("tps"),
                  "latency_s": level.mean("latency_s"), "rps": len(level.completed) / level.wall_s}
    return out


def guidellm_round(guidellm: str, endpoint: str, model: str, levels: list[int], requests: int, prompt_tokens: int,
                   max_tokens: int, tokenizer_dir: str, work: str, seed: int) -> dict[int, dict]:
    """One guidellm process runs every level (its startup, torch included, is not timed)."""
    out_path = os.path.join(work, f"guidellm-{seed}.json")
    scenario = {
        "metadata": {"name": "sparkctl-side-by-side"},
        "spec": {
            "backend": {"kind": "openai_http", "target": endpoint, "model": model,
                        "request_format": "/v1/chat/completions"},
            "profile": {"kind": "concurrent", "streams": levels[0]},
            "tokenizer": {"kind": "hf_auto", "model": tokenizer_dir},
            "data": [{"kind": "synthetic_text", "prompt_tokens": prompt_tokens, "output_tokens": max_tokens}],
            "seed": {"kind": "static", "value": seed},
            "outputs": [{"kind": "json", "path": out_path}],
        },
        "benchmarks": [{"profile.streams": c} for c in levels],  # one sub-benchmark per level
    }
    scenario["spec"]["constraints"] = [{"kind": "max_requests", "count": requests}]
    path = os.path.join(work, f"scenario-{seed}.json")
    Path(path).write_text(json.dumps(scenario))
    proc = subprocess.run([guidellm, "run", "-c", path, "--disable-console-interactive"], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"guidellm failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    doc = json.loads(Path(out_path).read_text())
    out = {}
    for benchmark in doc["benchmarks"]:
        c = benchmark["config"]["strategy"]["streams"]
        records = benchmark["requests"]["successful"]
        m = benchmark["metrics"]
        out[c] = {"ttft_p50_ms": m["time_to_first_token_ms"]["successful"]["median"],
                  "itl_ms": statistics.mean(r["inter_token_latency_ms"] for r in records),
                  "tps": statistics.mean(r["output_tokens_per_second"] for r in records),
                  "latency_s": m["request_latency"]["successful"]["mean"],
                  "rps": m["requests_per_second"]["successful"]["mean"],
                  "completed": len(records), "output_tokens": statistics.mean(r["output_tokens"] for r in records),
                  "prompt_tokens": statistics.mean(r["prompt_tokens"] for r in records)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model", default=None, help="default: the endpoint's first model")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=8,
                        help="per level, the same at every level (guidellm's request budget is per run)")
    parser.add_argument("--guidellm", default="/tmp/guidellm-venv/bin/guidellm")
    args = parser.parse_args()

    guidellm = args.guidellm
    if not os.access(guidellm, os.X_OK):
        print(f"no guidellm at {guidellm}; install it apart from sparkctl:\n"
              "  python3 -m venv /tmp/guidellm-venv && /tmp/guidellm-venv/bin/pip install guidellm==0.8.1",
              file=sys.stderr)
        return 2
    import httpx

    from sparkctl.ops.bench import parse_concurrency, run_level

    endpoint = args.endpoint.rstrip("/")
    model = args.model or httpx.get(endpoint + "/v1/models", timeout=10).json()["data"][0]["id"]
    levels = parse_concurrency(args.concurrency)
    requests = max(args.requests, max(levels))  # never fewer requests than streams
    with tempfile.TemporaryDirectory() as work:
        tokenizer_dir = os.path.join(work, "tokenizer")
        os.makedirs(tokenizer_dir)
        python = os.path.join(os.path.dirname(guidellm), "python")
        subprocess.run([python, "-c", MAKE_TOKENIZER, tokenizer_dir], check=True)
        run_level(endpoint, model=model, concurrency=1, requests=1, max_tokens=16, prompt_tokens=args.prompt_tokens,
                  first_index=10**6)  # warm-up, unmeasured
        rounds: dict[str, list[dict]] = {"sparkctl": [], "guidellm": []}
        started = time.monotonic()
        for r in range(args.rounds):
            order = ["sparkctl", "guidellm"] if r % 2 == 0 else ["guidellm", "sparkctl"]
            for tool in order:
                print(f"round {r + 1}/{args.rounds}: {tool}", file=sys.stderr)
                if tool == "sparkctl":
                    rounds[tool].append(sparkctl_round(endpoint, model, levels, requests, args.prompt_tokens,
                                                       args.max_tokens, first_index=r * 10000))
                else:
                    rounds[tool].append(guidellm_round(guidellm, endpoint, model, levels, requests,
                                                       args.prompt_tokens, args.max_tokens, tokenizer_dir, work, seed=r))
    g_first = rounds["guidellm"][0]
    print(f"{endpoint} ({model}): {args.prompt_tokens} prompt / {args.max_tokens} output tokens, {args.rounds} "
          f"interleaved rounds, {time.monotonic() - started:.0f} s; guidellm's requests carried "
          f"{statistics.mean(v['prompt_tokens'] for v in g_first.values()):.0f} prompt / "
          f"{statistics.mean(v['output_tokens'] for v in g_first.values()):.0f} output tokens")
    print(f"{'C':>2}  {'metric':<15} {'sparkctl':>10} {'guidellm':>10} {'ratio':>7}")
    worst = 0.0
    for c in levels:
        for key, label in METRICS:
            s = statistics.mean(rd[c][key] for rd in rounds["sparkctl"])
            g = statistics.mean(rd[c][key] for rd in rounds["guidellm"])
            ratio = s / g if g else float("nan")
            worst = max(worst, abs(ratio - 1))
            print(f"{c:>2}  {label:<15} {s:>10.2f} {g:>10.2f} {ratio:>7.3f}")
    print(f"largest difference: {100 * worst:.1f} %  (ratio = sparkctl / guidellm, means over rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
