#!/usr/bin/env python3
"""CPU seconds per Python start, without and with the byte code sparkctl ships (sparkctl/bytecode.py).

Side by side in one run, rounds interleaved (the machine's load hits both the same way):

* a stand-in engine start to its first ``/health``: the stand-in rootfs made twice (with and
  without pycs), each unpacked into a folder and its own interpreter run from there (no chroot: it
  finds its standard library beside itself), ``vllm serve MODEL`` on a small checkpoint; the CPU
  of the process when /health first answers. ``PYTHONDONTWRITEBYTECODE=1``: a container starts
  from a fresh layer each time, so a cache one start writes is never seen by the next (a container
  without the pycs also spends the CPU of writing them: the "before" figure here is a floor);
* a surface probe (``sparkctl.images.surface.PROBE``, what ``docker run --entrypoint python3 IMAGE
  -c PROBE`` runs) in the same two folders;
* the router image's probe and launcher imports (only when the router's packages are already in
  the cache, ``~/.cache/sparkctl/sglang-router-*``: nothing is downloaded);
* the Engram host program (``python3 engram.pyz probe``) with this machine's python3 (a sandbox
  host's), and the imports of the image relay's and the model agent's zips;
* a bare ``python3 -c pass`` for scale.

    python bench/python_starts.py [--rounds 5] [--json]

Prints CPU seconds per start (mean over the rounds), the after/before ratio, and the sizes
(rootfs tar, zips) and CPU of making the rootfs, before and after (after: its pyc set made in an
empty cache, then made again with the set kept). Ratios are what to compare
between machines, not the absolute figures.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkctl.engram.checkpoint_maker import make_checkpoint  # noqa: E402
from sparkctl.images.relay import MODULES as RELAY_MODULES, relay_zip  # noqa: E402
from sparkctl.images.surface import PROBE  # noqa: E402
from sparkctl.ops import router_image  # noqa: E402
from sparkctl.ops.engram import HOST_MODULES  # noqa: E402
from sparkctl.resources import cache_dir  # noqa: E402
from sparkctl.ops.model_sync import AGENT_MODULES  # noqa: E402
from sparkctl.standin import rootfs  # noqa: E402

ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
ROUTER_PROBE = "import importlib.metadata as m; print(m.version('sglang-router'))"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime + children_cpu()


def run_cpu(argv: list[str], stdin: bytes | None = None) -> float:
    """CPU seconds of one process run to its end (it must succeed)."""
    before = children_cpu()
    done = subprocess.run(argv, input=stdin, capture_output=True, env=ENV, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {done.stderr.decode(errors='replace').strip()[-300:]}")
    return children_cpu() - before


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def engine_start_cpu(python: str, vllm: str, model: str) -> float:
    """The engine's CPU when its /health first answers (then it is stopped)."""
    port = free_port()
    proc = subprocess.Popen([python, vllm, "serve", model, "--host", "127.0.0.1", "--port", str(port)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the stand-in engine ended: {proc.stderr.read().decode(errors='replace')[-300:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    return process_cpu(proc.pid)
            except OSError:
                time.sleep(0.02)
        raise SystemExit("the stand-in engine never answered /health")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def unpack(tar: str, folder: Path) -> Path:
    folder.mkdir()
    subprocess.run(["tar", "-C", str(folder), "-xf", tar], check=True, timeout=300)
    return folder


def make_rootfs(work: Path, bytecode: bool, sizes: dict) -> tuple[rootfs.RootfsReport, Path]:
    """The rootfs (twice with pycs: their set made, in an empty cache, then kept), unpacked."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(work / "xdg-cache")  # an empty pyc cache: the first make is cold
    try:
        for attempt in ("", "_again") if bytecode else ("",):
            start = self_cpu()
            report = rootfs.write_rootfs_tar(work / f"standin-{bytecode}.tar", bytecode=bytecode)
            sizes[f"rootfs_write_cpu_s{attempt}_{bytecode}"] = self_cpu() - start
    finally:
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME")
        else:
            os.environ["XDG_CACHE_HOME"] = saved
    sizes[f"rootfs_tar_bytes_{bytecode}"] = report.bytes
    return report, unpack(report.path, work / f"root-{bytecode}")


def router_roots(work: Path) -> dict[bool, Path] | None:
    """Both router images unpacked, when the router's packages are in the cache already (else None)."""
    cached = sorted(glob.glob(str(cache_dir() / "sglang-router-*-py*")))
    cached = [c for c in cached if ".partial-" not in c and Path(c, "sglang_router", "__init__.py").is_file()]
    if not cached:
        return None
    version = Path(cached[-1]).name.split("-")[2]
    roots = {}
    for bytecode in (False, True):
        tar = str(work / f"router-{bytecode}.tar")
        router_image.write_router_tar(tar, version, bytecode=bytecode)
        roots[bytecode] = unpack(tar, work / f"router-{bytecode}")
        os.unlink(tar)
    return roots


def zips(work: Path) -> dict[bool, dict[str, Path]]:
    """The agents' zips, without and with pycs."""
    made: dict[bool, dict[str, Path]] = {}
    for bytecode in (False, True):
        made[bytecode] = {}
        for name, modules, main in (("engram", HOST_MODULES, "sparkctl.engram.hostside"),
                                    ("relay", RELAY_MODULES, "sparkctl.images.relay"),
                                    ("model", AGENT_MODULES, "sparkctl.model.agent")):
            path = work / f"{name}-{bytecode}.pyz"
            path.write_bytes(relay_zip(modules, main, bytecode=bytecode))
            made[bytecode][name] = path
    return made


def engram_probe_cpu(python: str, program: Path, work: Path) -> float:
    """One ``python3 engram.pyz probe`` as a host runs it (in its own folder, which it removes)."""
    folder = Path(tempfile.mkdtemp(prefix="sparkctl-engram-bench-", dir=work))
    shutil.copyfile(program, folder / "engram.pyz")
    request = json.dumps({"dest": str(work / "engram"), "names": ["engram-l0-r0of1.bin"]}).encode()
    return run_cpu([python, str(folder / "engram.pyz"), "probe"], stdin=request)


def import_cpu(python: str, program: Path, module: str) -> float:
    return run_cpu([python, "-c", f"import sys; sys.path.insert(0, {str(program)!r}); import {module}"])


def measurements(work: Path, python: str) -> tuple[dict, dict]:
    """name -> {False: callable, True: callable}, and the sizes and making costs."""
    model = str(work / "model")
    make_checkpoint(model, vocab_size=64)
    reports, roots, sizes = {}, {}, {}
    for bytecode in (False, True):
        reports[bytecode], roots[bytecode] = make_rootfs(work, bytecode, sizes)
    agent = zips(work)
    for name in agent[True]:
        sizes[f"{name}_zip_bytes_False"], sizes[f"{name}_zip_bytes_True"] = (
            agent[False][name].stat().st_size, agent[True][name].stat().st_size)

    def image_python(b):
        return str(roots[b]) + reports[b].python

    cases = {
        "stand-in engine start to /health": {b: (lambda b=b: engine_start_cpu(
            image_python(b), str(roots[b]) + "/usr/local/bin/vllm", model)) for b in (False, True)},
        "surface probe (vllm, the stand-in)": {b: (lambda b=b: run_cpu([image_python(b), "-c", PROBE, "vllm", ""]))
                                               for b in (False, True)},
        "engram host program: probe": {b: (lambda b=b: engram_probe_cpu(python, agent[b]["engram"], work))
                                       for b in (False, True)},
        "relay zip: import": {b: (lambda b=b: import_cpu(python, agent[b]["relay"], "sparkctl.images.relay"))
                              for b in (False, True)},
        "model agent zip: import": {b: (lambda b=b: import_cpu(python, agent[b]["model"], "sparkctl.model.agent"))
                                    for b in (False, True)},
    }
    routers = router_roots(work)
    if routers is not None:
        def router_python(b):
            return str(routers[b]) + reports[b].python

        cases["router image probe (sglang-router version)"] = {
            b: (lambda b=b: run_cpu([router_python(b), "-c", ROUTER_PROBE])) for b in (False, True)}
        cases["router image: import the launcher"] = {
            b: (lambda b=b: run_cpu([router_python(b), "-c", "import sglang_router.launch_router"])) for b in (False, True)}
    cases["bare python3 -c pass (scale)"] = {b: (lambda: run_cpu([python, "-c", "pass"])) for b in (False, True)}
    return cases, sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    python = rootfs.default_python()
    with tempfile.TemporaryDirectory(prefix="sparkctl-python-starts-") as folder:
        cases, sizes = measurements(Path(folder), python)
        cpu = {name: {False: [], True: []} for name in cases}
        for _ in range(args.rounds):
            for name, runs in cases.items():
                for bytecode in (False, True):
                    cpu[name][bytecode].append(runs[bytecode]())
    rows = {name: {"before_cpu_s": round(sum(v[False]) / len(v[False]), 4),
                   "after_cpu_s": round(sum(v[True]) / len(v[True]), 4)} for name, v in cpu.items()}
    for row in rows.values():
        row["ratio"] = round(row["after_cpu_s"] / row["before_cpu_s"], 3) if row["before_cpu_s"] else None
    doc = {"rounds": args.rounds, "python": python, "starts": rows,
           "sizes": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in sizes.items()}}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    width = max(len(name) for name in rows)
    print(f"{'CPU-s per start':<{width}}  {'before':>8}  {'after':>8}  {'after/before':>12}")
    for name, row in rows.items():
        print(f"{name:<{width}}  {row['before_cpu_s']:>8.3f}  {row['after_cpu_s']:>8.3f}  {row['ratio'] or 0:>12.2f}")
    print()
    for key, value in doc["sizes"].items():
        print(f"{key.replace('_False', ' (before)').replace('_True', ' (after)')}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
