#!/usr/bin/env python3
"""CPU seconds a test tier spends, per test file: each file run alone in a cgroup of its own.

Wall time says little on a shared machine; the CPU a run takes does not depend on who else runs.
Each file (or, with --whole, the tier as scripts/test.sh runs it) runs in a fresh cgroup v1 cpuacct
group, which every process it starts inherits. A private dockerd the tests start is in it too, but
the containers that dockerd runs would go to its default cgroup parent (shared with every other
engine on the machine): a ``dockerd`` put first on the PATH adds ``--cgroup-parent`` below the
run's group, so their CPU (build steps, containers) is counted as well.

Printed: one row a file, most CPU first: CPU seconds (user, system), wall seconds, pytest's
closing line; then the sum. --per-test N: also the N test phases (setup, call, teardown) that cost
most -- the group's CPU while the phase ran, so an engine a module fixture keeps running counts in
whichever phase it is busy.

    python bench/tier_cpu.py [-m "integration and not sandbox"] [FILE ...] [--whole] [--per-test N] [--json]

Without FILE: every test file with a test the mark expression selects. Needs root (cgroups).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child_run import run_to_end

REPO = Path(__file__).resolve().parent.parent
CGROUPS = Path("/sys/fs/cgroup")
CPUACCT = CGROUPS / "cpuacct"
MARK = "integration and not sandbox"
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def selected_files(mark: str) -> list[str]:
    """The test files with at least one test ``mark`` selects (pytest's own collection)."""
    listing = subprocess.run([*PYTEST, "--collect-only", "-q", "-m", mark], cwd=REPO, capture_output=True, text=True)
    # (-q twice: one line a file, "tests/test_x.py: N")
    files = {line.split(":")[0] for line in listing.stdout.splitlines() if re.match(r"\S+\.py(::|: \d)", line)}
    return sorted(files)


def dockerd_wrapper(folder: Path) -> None:
    """A ``dockerd`` that puts its containers below the run's cgroup (SPARKCTL_TIERCPU_CGROUP)."""
    real = next((Path(d) / "dockerd" for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin") if (Path(d) / "dockerd").exists()),
                Path("/usr/bin/dockerd"))
    wrapper = folder / "dockerd"
    wrapper.write_text(f'#!/bin/sh\nexec {real} --cgroup-parent "$SPARKCTL_TIERCPU_CGROUP/containers" "$@"\n')
    wrapper.chmod(0o755)


def remove_group(name: str) -> None:
    """The run's group and what dockerd made below it, in every hierarchy (leaves first)."""
    for hierarchy in CGROUPS.iterdir():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            _kill_members(folder)  # what an interrupted run left (a group with a process in it cannot go)
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                say(f"warning: could not remove the cgroup {folder}")


def _kill_members(folder: Path) -> None:
    try:
        members = [int(pid) for pid in (folder / "cgroup.procs").read_text().split()]
    except OSError:
        return
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def read_usage(group: Path) -> tuple[float, float, float]:
    """(total, user, system) CPU seconds of the group and everything below it."""
    total = int((group / "cpuacct.usage").read_text()) / 1e9
    ticks = dict(line.split() for line in (group / "cpuacct.stat").read_text().splitlines())
    hz = os.sysconf("SC_CLK_TCK")
    return total, int(ticks["user"]) / hz, int(ticks["system"]) / hz


# --per-test: this module is also a pytest plugin (``-p tier_cpu``) that adds a JSON line per test
# phase to SPARKCTL_TIERCPU_TESTS with the CPU the run's group spent in it (the engine and the
# containers the phase kept busy included; with one file in the group, nothing else counts).
def _group_seconds() -> float:
    return int((CPUACCT / os.environ["SPARKCTL_TIERCPU_CGROUP"].lstrip("/") / "cpuacct.usage").read_text()) / 1e9


def _phase(item, when: str):
    before = _group_seconds()
    yield
    with open(os.environ["SPARKCTL_TIERCPU_TESTS"], "a") as out:
        out.write(json.dumps({"test": item.nodeid, "phase": when, "cpu_s": round(_group_seconds() - before, 2)}) + "\n")


def _hook(when: str):
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def hook(item, *args):
        yield from _phase(item, when)
    return hook


if os.environ.get("SPARKCTL_TIERCPU_TESTS"):
    pytest_runtest_setup, pytest_runtest_call, pytest_runtest_teardown = (_hook(w) for w in ("setup", "call", "teardown"))


def run_in_group(label: str, argv: list[str], wrappers: Path, per_test: Path | None = None) -> dict:
    """``argv`` run inside a fresh cpuacct group; its CPU and wall seconds and closing line."""
    name = f"sparkctl-tiercpu-{os.getpid()}-{label.replace('/', '_')}"
    group = CPUACCT / name
    group.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as scripts/test.sh runs
    env.update(PATH=f"{wrappers}:{os.environ.get('PATH', '')}", SPARKCTL_TIERCPU_CGROUP=f"/{name}")
    if per_test is not None:
        env.update(SPARKCTL_TIERCPU_TESTS=str(per_test), PYTHONPATH=f"{REPO / 'bench'}:{env.get('PYTHONPATH', '')}")
        argv = [*argv, "-p", "tier_cpu"]
    started = time.monotonic()
    try:
        # joined before exec: nothing it starts is outside the group
        result = run_to_end(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv], cwd=REPO, env=env)
        wall = time.monotonic() - started
        total, user, system = read_usage(group)
    finally:
        remove_group(name)
    closing = next((line.strip("= ") for line in reversed(result.stdout.splitlines()) if re.search(r" in [0-9.]+s", line)), "")
    if result.returncode not in (0, 5):
        say(result.stdout[-3000:] + result.stderr[-2000:])
    return {"file": label, "cpu_s": round(total, 1), "user_s": round(user, 1), "sys_s": round(system, 1),
            "wall_s": round(wall, 1), "exit": result.returncode, "result": closing}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files (default: every file the mark selects from)")
    parser.add_argument("-m", dest="mark", default=MARK, help="the tier's mark expression (default %(default)r)")
    parser.add_argument("--whole", action="store_true", help="also the tier as a whole, as scripts/test.sh runs it")
    parser.add_argument("--per-test", type=int, default=0, metavar="N", help="also the N test phases that cost most")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    if os.geteuid() != 0 or not (CPUACCT / "cpuacct.usage").exists():
        say("error: needs root and cgroup v1 cpuacct (/sys/fs/cgroup/cpuacct)")
        return 2
    # Started in the background of a shell without job control, this process ignores SIGINT, and so
    # would every test process (a test that sends one, e.g. tests/test_test_script_stop.py, fails):
    # its default is given back (a handler, unlike "ignored", is not inherited across exec).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    files = args.files or selected_files(args.mark)
    # byte code written once beforehand (scripts/test.sh lets Python keep it): no file pays the compile
    subprocess.run([sys.executable, "-m", "compileall", "-q", "sparkctl", "tests", "bench"], cwd=REPO, capture_output=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sparkctl-tiercpu-") as wrappers:
        dockerd_wrapper(Path(wrappers))
        phases_file = Path(wrappers) / "phases.jsonl" if args.per_test else None
        for file in files:
            rows.append(run_in_group(file, [*PYTEST, "-m", args.mark, file], Path(wrappers), phases_file))
            say(f"{rows[-1]['cpu_s']:8.1f} CPU-s {rows[-1]['wall_s']:7.1f} s  {file}  {rows[-1]['result']}")
        whole = None
        if args.whole:  # scripts/test.sh's integration tier: a process per core, a file kept in one
            whole = run_in_group("whole", [*PYTEST, "-m", args.mark, "-n", "auto", "--dist", "loadfile"], Path(wrappers))
        phases = [json.loads(line) for line in phases_file.read_text().splitlines()] if phases_file and phases_file.exists() else []
    rows.sort(key=lambda row: -row["cpu_s"])
    phases = sorted(phases, key=lambda p: -p["cpu_s"])[:args.per_test]
    doc = {"mark": args.mark, "files": rows, "sum_cpu_s": round(sum(r["cpu_s"] for r in rows), 1), "whole": whole,
           "phases": phases}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{'CPU s':>8} {'user':>7} {'sys':>7} {'wall s':>7}  file / result")
    for row in rows:
        print(f"{row['cpu_s']:8.1f} {row['user_s']:7.1f} {row['sys_s']:7.1f} {row['wall_s']:7.1f}  {row['file']}  {row['result']}")
    print(f"{doc['sum_cpu_s']:8.1f} {'':7} {'':7} {'':7}  sum of the files, each run alone")
    if whole:
        print(f"{whole['cpu_s']:8.1f} {whole['user_s']:7.1f} {whole['sys_s']:7.1f} {whole['wall_s']:7.1f}  the tier as a whole "
              f"(-n auto --dist loadfile)  {whole['result']}")
    for phase in phases:
        print(f"{phase['cpu_s']:8.1f}  {phase['phase']:<8}  {phase['test']}")
    return 0 if all(r["exit"] in (0, 5) for r in rows) and (whole is None or whole["exit"] in (0, 5)) else 1


if __name__ == "__main__":
    sys.exit(main())
