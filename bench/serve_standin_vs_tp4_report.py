"""How close the stand-in engine's timing model comes to the TP4 vLLM report §6.1 (4x Spark, vLLM TP4).

Starts one stand-in engine on 127.0.0.1 given only the TP4 vLLM report's C=1 TTFT and ITL, runs sparkctl's
benchmark at C=1,2,4,8 (128 output tokens, as the report's ~130), and prints the measured table next
to the report's (§6.1) with the ratio per cell. No root, no sandbox; about 95 s with the default 8 requests
per level. The concurrency shape (x1.35/x2.05/x3.45 ITL, x1.3/x1.9/x3.1 TTFT) is the stand-in's
default, not fitted here.

    python bench/serve_standin_vs_tp4_report.py [--requests 8] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TP4_REPORT = {  # concurrency: TTFT ms, ITL ms, TPS tok/s, latency s, RPS
    1: (271.63, 32.39, 29.48, 4.39, 0.23),
    2: (395.75, 45.12, 21.32, 6.13, 0.16),
    4: (577.41, 73.86, 13.09, 9.96, 0.10),
    8: (805.89, 110.28, 8.79, 14.81, 0.07),
}


def main() -> int:
    import httpx

    from sparkctl.engram.checkpoint_maker import make_checkpoint
    from rich.console import Console

    from sparkctl.ops.bench import BenchSettings, format_slo, run_bench
    from sparkctl.reporter import Reporter, console_renderer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(f"{tmp}/model", vocab_size=64)
        with __import__("socket").socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "SPARKCTL_STANDIN_TTFT_BASE_MS": "266", "SPARKCTL_STANDIN_ITL_MS": "32.39"}
        engine = subprocess.Popen([sys.executable, "-m", "sparkctl.standin", "vllm", "serve", f"{tmp}/model",
                                   "--served-model-name", "dsv41", "--host", "127.0.0.1", "--port", str(port),
                                   "--max-num-seqs", "8"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 20
            while True:
                try:
                    httpx.get(url + "/health", timeout=1)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            report = run_bench(url, "dsv41", BenchSettings([1, 2, 4, 8], args.requests, args.max_tokens, 256),
                               slo_ttft_ms=1000, slo_tps=20, reporter=Reporter(console_renderer(Console(stderr=True), "plain")))
        finally:
            engine.terminate()
            engine.wait(10)
    names = ("TTFT ms", "ITL ms", "TPS", "latency s", "RPS")
    print(f"{'C':>2}  " + "  ".join(f"{n:>22}" for n in names))
    for level in report.levels:
        table = TP4_REPORT[level.concurrency]
        measured = (level.mean("ttft_ms"), level.mean("itl_ms"), level.mean("tps"), level.mean("latency_s"), level.mean("rps"))
        cells = [f"{m:9.2f} /{s:7.2f} x{m / s:4.2f}" for m, s in zip(measured, table)]
        print(f"{level.concurrency:>2}  " + "  ".join(f"{c:>22}" for c in cells))
    print("(measured / the TP4 vLLM report §6.1, ratio)")
    print(format_slo(report.slo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
