#!/usr/bin/env python3
"""What building the sandbox chain, and loading its image, costs the Docker engine: an older
revision's Dockerfiles against this checkout's, side by side (ratios: these machines are noisy).

Each run starts a throwaway dockerd (its own data root, exec root and socket) inside a cpuacct
cgroup of its own, so the engine's CPU -- dockerd, its containerd, shims, runc and the re-execs
that apply layers -- is read from the cgroup, not guessed. A run builds the chain from nothing
(``sparkctl --json build --image <tree>/images/sandbox --variant engram-mem``, the revision's own
code and templates), then ``docker save``s the final image and ``docker load``s it into a second
fresh engine (what every host pays for a full send). Sides alternate (old, new, new, old, ...).

Printed per side: builder steps (``Step N/M`` lines), image layers (``RootFS.Layers`` of the final
tag), median build wall seconds and engine CPU seconds, the sparkctl client's CPU, and the load's
engine CPU; then new/old ratios.

    python bench/chain_build.py [--old REV] [--new REV] [--rounds 3] [--json]

``--old`` defaults to the last revision whose layers carried their labels as ``--label`` flags.
Needs root (dockerd) and cgroup v1 cpuacct or cgroup v2 (else engine CPU reads as unknown).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from throwaway_dockerd import ThrowawayDockerd  # noqa: E402
OLD_DEFAULT = "32ccffa"  # before the labels became one LABEL instruction and the overlays one step per kind
FINAL = "sparkctl-sandbox:engram-mem"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
UNIFIED = Path("/sys/fs/cgroup/unified")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class EngineCgroup:
    """A cgroup of its own for one dockerd and everything it starts; reads their CPU seconds."""

    def __init__(self, name: str):
        self.path = None
        for root, usage in ((CPUACCT, "cpuacct.usage"), (UNIFIED, "cpu.stat")):
            if (root / usage).exists() or (root / "cgroup.procs").exists():
                try:
                    (root / name).mkdir()
                except OSError:
                    continue
                self.path, self.usage = root / name, usage
                break

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        text = (self.path / self.usage).read_text()
        if self.usage == "cpuacct.usage":
            return int(text) / 1e9
        fields = dict(line.split() for line in text.splitlines())
        return int(fields["usage_usec"]) / 1e6 if "usage_usec" in fields else None

    def join_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run from inside the cgroup (joined before exec, so no child escapes it)."""
        if self.path is None:
            return argv
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *argv]

    def remove(self) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


class Engine(ThrowawayDockerd):
    """A throwaway dockerd (tests/throwaway_dockerd.py) in a cgroup of its own."""

    def __init__(self, tag: str):
        cgroup = EngineCgroup(f"sparkctl-chainbench-{os.getpid()}-{tag}")
        super().__init__(prefix="sparkctl-chainbench-", launch=cgroup.join_argv)
        self.cgroup = cgroup

    def start(self, timeout: float = 120) -> "Engine":
        super().start(timeout)
        return self

    def docker(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "-H", self.url, *args], capture_output=True, check=check, **kwargs)

    def stop(self, grace: float = 60) -> None:
        super().stop(grace)
        self.cgroup.remove()


def checkout(rev: str, into: Path) -> Path:
    """The revision's tree (code, templates, images) in ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "sparkctl", "templates", "images"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into)
    return into


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(tree: Path, cache: Path) -> dict:
    """Build the chain from nothing on a fresh engine, then load its image into another fresh one."""
    build_engine = Engine("build")
    try:
        build_engine.start()  # inside the try: a start cut short (Ctrl-C, its timeout) still stops what it began
        env = dict(os.environ, DOCKER_HOST=build_engine.url, PYTHONPATH=str(tree), XDG_CACHE_HOME=str(cache),
                   COLUMNS="200")
        cpu0, client0, started = build_engine.cgroup.seconds(), _children_cpu(), time.monotonic()
        result = subprocess.run([sys.executable, "-m", "sparkctl", "--json", "build", "--image", str(tree / "images" / "sandbox"),
                                 "--variant", "engram-mem"], env=env, capture_output=True, text=True, timeout=1800,
                                cwd=tree)  # not this checkout: `python -m` puts the working directory first on sys.path
        wall, cpu1, client1 = time.monotonic() - started, build_engine.cgroup.seconds(), _children_cpu()
        if result.returncode != 0:
            raise RuntimeError(f"build from {tree} failed: {result.stderr[-2000:]}")
        steps = len(re.findall(r"\| Step \d+/\d+ :", result.stderr))
        layers = json.loads(build_engine.docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", FINAL).stdout)
        archive = Path(build_engine.root) / "final.tar"
        build_engine.docker("save", "-o", str(archive), FINAL)
        load_engine = Engine("load")
        try:
            load_engine.start()
            load0, load_started = load_engine.cgroup.seconds(), time.monotonic()
            load_engine.docker("load", "-i", str(archive))
            load_wall, load1 = time.monotonic() - load_started, load_engine.cgroup.seconds()
        finally:
            load_engine.stop()
    finally:
        build_engine.stop()
    engine_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    load_cpu = None if load0 is None or load1 is None else load1 - load0
    return {"steps": steps, "layers": len(layers), "build_s": wall, "engine_cpu_s": engine_cpu,
            "client_cpu_s": client1 - client0, "load_s": load_wall, "load_engine_cpu_s": load_cpu}


def median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default=OLD_DEFAULT, help="the revision to compare against (default %(default)s)")
    parser.add_argument("--new", default=None, help="a revision instead of this checkout's files")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side (default 3)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    if os.geteuid() != 0:
        say("error: a throwaway dockerd needs root")
        return 2
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):  # a kill or hang-up still runs the finally blocks
        signal.signal(stop_signal, lambda number, frame: sys.exit(128 + number))
    work = Path(tempfile.mkdtemp(prefix="sparkctl-chainbench-trees-"))
    try:
        trees = {"old": checkout(args.old, work / "old"), "new": checkout(args.new, work / "new") if args.new else REPO}
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for index in range(args.rounds):
            for side in (("old", "new") if index % 2 == 0 else ("new", "old")):
                run = one_run(trees[side], work / f"cache-{side}")
                runs[side].append(run)
                say(f"round {index + 1} {side}: {run}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {side: {"steps": r[0]["steps"], "layers": r[0]["layers"],
                      **{key: median(r, key) for key in ("build_s", "engine_cpu_s", "client_cpu_s", "load_s", "load_engine_cpu_s")}}
               for side, r in runs.items()}
    ratios = {key: (summary["new"][key] / summary["old"][key]) if summary["old"][key] and summary["new"][key] is not None else None
              for key in ("steps", "layers", "build_s", "engine_cpu_s", "client_cpu_s", "load_s", "load_engine_cpu_s")}
    doc = {"old": args.old, "rounds": args.rounds, "median": summary, "new_over_old": ratios, "runs": runs}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"sandbox chain + engram-mem, from nothing, {args.rounds} run(s) a side, alternating; medians")
    print(f"{'':24}{'old ' + args.old:>16}{'new':>12}{'new/old':>10}")
    for key, label in (("steps", "builder steps"), ("layers", "image layers"), ("build_s", "build wall s"),
                       ("engine_cpu_s", "build engine CPU s"), ("client_cpu_s", "sparkctl client CPU s"),
                       ("load_s", "docker load wall s"), ("load_engine_cpu_s", "load engine CPU s")):
        old, new, ratio = summary["old"][key], summary["new"][key], ratios[key]
        show = (lambda v: "n/a" if v is None else (f"{v:.0f}" if key in ("steps", "layers") else f"{v:.2f}"))
        print(f"{label:<24}{show(old):>16}{show(new):>12}{'n/a' if ratio is None else f'{ratio:.2f}':>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
