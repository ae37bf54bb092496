#!/usr/bin/env python3
"""How many python3 processes each sparkctl verb starts on the hosts, and their CPU: this checkout against another commit.

sparkctl asks the hosts some questions with their own python3 (the room and checkpoint probes, the
Engram and model agents, the deploy lock...). Each start costs a host ~20 ms of CPU before it does
anything, more with every module it imports, and the test suite's sandbox tier runs these verbs
hundreds of times. As in ``bench/docker_calls.py``, a counting ``python3`` goes into each sandbox
host's own /usr/local/bin (first on the host's PATH; this machine's /usr/local is not touched): it
runs /usr/bin/python3 as its child (measurement only: the process tree differs from a real run),
then logs what was run (the script's name for a known ``-c`` program, else its first words) and
the child's CPU time. It is removed at the end.

A scenario of verbs runs from each tree (the other commit checked out into a temporary ``git
worktree``), each tree on a fresh sandbox of its own, so both start from the same state:
make-checkpoint, doctor, setup --dry-run, up (the full converge: Engram shards, serve, smoke),
status, logs, top --once, smoke, pack-engram --verify, model sync (a folder on the first host), stop,
serve, stop, up --dry-run. Counts do not depend on the machine's load; CPU seconds do a little
(ticks of 10 ms per process).

    python bench/host_python_calls.py [--base REV] [--hosts 3] [--set KEY=VALUE ...] [--json]
    python bench/host_python_calls.py [--base REV] [--json] --pytest [-x] tests/FILE.py ...

``--pytest`` counts the test files' instead, per test and per kind: pytest runs with this module as a
plugin, which puts the counting python3 into every sandbox the test process brings up.

Root is needed (each tree brings up its own sandbox, removed afterwards). Goal: one python3 per
host per question a verb really has, started as cheaply as it can be.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from child_run import run_to_end
from host_wrappers import HostWrappers

REPO = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # as pytest's plugin (--pytest) the tree under test is the one imported
    sys.path.insert(0, str(REPO))

LOG_NAME = ".python3-calls.log"
# The counting python3: the real one as its child, then one tab-separated line: the child's user and
# system CPU (the second line of `times`: the shell's children), the md5 of the program after -c (if any), the first words.
WRAPPER = r"""#!/bin/sh
/usr/bin/python3 "$@"
rc=$?
t=$(mktemp)
times > "$t"  # not in a pipe: a subshell's `times` would not see this shell's children
cpu=$(tail -n 1 "$t")
rm -f "$t"
script=
prev=
for arg in "$@"; do
  if [ "$prev" = -c ]; then script=$(printf '%s' "$arg" | md5sum | cut -c1-32); break; fi
  prev=$arg
done
words=$(printf '%s ' "$@" | tr '\n\t' '  ' | cut -c1-160)
printf '%s\t%s\t%s\n' "$cpu" "$script" "$words" >> /usr/local/bin/""" + LOG_NAME + r"""
exit $rc
"""

# What each tree runs, in order ("{model}", "{first}": the model dir and the first host).
SCENARIO = (
    ("doctor",),
    ("setup", "--dry-run"),
    ("up",),
    ("status",),
    ("logs",),
    ("top", "--once"),
    ("smoke",),
    ("pack-engram", "--verify"),
    ("model", "sync", "--source", "{model}", "--from", "{first}"),
    ("stop", "--yes"),
    ("serve",),
    ("stop", "--yes"),
    ("up", "--dry-run"),
)
NO_PROFILE = {"setup"}  # verbs of the inventory alone


def _seconds(word: str) -> float:
    """`times`'s "0m0.120000s" -> 0.12."""
    minutes, _, rest = word.rstrip("s").partition("m")
    return int(minutes or 0) * 60 + float(rest or 0)


def known_scripts(tree: Path) -> dict[str, str]:
    """md5 -> "module.NAME" for the module-level python programs (``*_SCRIPT``, ``*_PROGRAM``) of ``tree``."""
    program = r"""
import hashlib, importlib, json, pkgutil, sparkctl
found = {}
for info in pkgutil.walk_packages(sparkctl.__path__, "sparkctl."):
    if ".standin" in info.name or ".sandbox" in info.name or info.name.endswith("__main__"):
        continue
    try:
        module = importlib.import_module(info.name)
    except BaseException:
        continue
    for key, value in vars(module).items():
        if key.isupper() and isinstance(value, str) and "\n" in value and "import" in value:
            found[hashlib.md5(value.encode()).hexdigest()] = info.name.rsplit(".", 1)[-1] + "." + key
print(json.dumps(found))
"""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", program], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else {}


def kind(script_md5: str, words: str, known: dict[str, str]) -> str:
    """What a python3 run was: a known program's name, ``AGENT OP`` for a zip, or its first words."""
    if script_md5:
        return known.get(script_md5, "-c " + script_md5[:8])
    parts = words.split()
    while parts and parts[0].startswith("-") and parts[0] not in ("-m", "-"):
        parts.pop(0)  # interpreter options (-I, -S, -u ...)
    if parts and parts[0].endswith(".pyz"):
        return " ".join([Path(parts[0]).name, *parts[1:2]])
    return " ".join(parts[:2])[:60]


class Counting(HostWrappers):
    """The counting python3 in every host's /usr/local/bin (removed on exit)."""

    def __init__(self, bin_dirs: dict[str, str]):
        super().__init__(bin_dirs, "python3", WRAPPER, LOG_NAME)

    def read(self, known: dict[str, str]) -> dict:
        """{"total", "cpu", "per_host": {host: n}, "by_kind": {kind: [n, cpu]}} since the last reset."""
        per_host: dict[str, int] = {}
        by_kind: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for host, lines in self.lines().items():
            per_host[host] = len(lines)
            for line in lines:
                cpu, script, words = (line.split("\t") + ["", ""])[:3]
                seconds = sum(_seconds(word) for word in cpu.split())
                entry = by_kind[kind(script, words, known)]
                entry[0] += 1
                entry[1] = round(entry[1] + seconds, 2)
        ordered = dict(sorted(by_kind.items(), key=lambda item: -item[1][1]))
        return {"total": sum(per_host.values()), "cpu": round(sum(v[1] for v in ordered.values()), 2),
                "per_host": per_host, "by_kind": ordered}


def sandbox_up(name: str, hosts: int):
    from sparkctl.sandbox import cluster

    return cluster.up_on_free_subnets(name, hosts, cluster.subnet_pairs(251, 200))


def run_cli(tree: Path, argv: list[str], inventory: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100", "SPARKCTL_INVENTORY": inventory}
    return subprocess.run([sys.executable, "-m", "sparkctl", *argv], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=timeout)


def scenario(tree: Path, name: str, hosts: int, profile: str, extra: list[str]) -> dict:
    """Bring up a sandbox, run the scenario from ``tree`` with the counting python3, take it down."""
    from sparkctl.sandbox import cluster

    info = sandbox_up(name, hosts)
    try:
        inventory = info.inventory
        made = run_cli(tree, ["sandbox", "make-checkpoint", "--sandbox", name], inventory)
        if made.returncode != 0:
            raise SystemExit(f"error: make-checkpoint failed: {made.stderr.strip()[-300:]}")
        layout = cluster.load(name)
        first = layout.hosts[0].name
        model = _model_dir(tree, inventory)
        known = known_scripts(tree)
        result: dict = {}
        with Counting({h.name: h.bin_dir for h in layout.hosts}) as counting:
            for step in SCENARIO:
                argv = [word.format(model=model, first=first) for word in step]
                options = [] if argv[0] in NO_PROFILE else ["--profile", profile, *extra]
                counting.reset()
                proc = run_cli(tree, [*argv, *options], inventory)
                result[" ".join(step[:2]) if step[0] == "model" else " ".join(step)] = {
                    "exit_code": proc.returncode, **counting.read(known)}
        return result
    finally:
        cluster.down(name)


def _model_dir(tree: Path, inventory: str) -> str:
    """The inventory's paths.model_dir (where make-checkpoint wrote the checkpoint)."""
    import yaml

    paths = (yaml.safe_load(Path(inventory).read_text()) or {}).get("paths") or {}
    return paths.get("model_dir") or "/mnt/nvme/models/DeepSeek-V4.1-Flash"


def print_table(summary: dict) -> None:
    names = summary["trees"]
    print(f"python3 processes started on the hosts per verb ({summary['hosts']} hosts, profile {summary['profile']}):")
    print(f"  {'verb':<22}" + "".join(f"{n + ' n':>10}{n + ' CPU s':>12}" for n in names))
    totals = {n: [0, 0.0] for n in names}
    for verb in summary["verbs"][names[0]]:
        cells = ""
        for n in names:
            row = summary["verbs"][n].get(verb, {"total": 0, "cpu": 0.0, "exit_code": "-"})
            totals[n][0] += row["total"]
            totals[n][1] += row["cpu"]
            cells += f"{row['total']:>10}{row['cpu']:>12.2f}"
        codes = " ".join(f"{n}: exit {summary['verbs'][n][verb]['exit_code']}" for n in names
                         if summary["verbs"][n].get(verb, {}).get("exit_code"))
        print(f"  {verb:<22}{cells}" + (f"   ({codes})" if codes else ""))
    print(f"  {'all':<22}" + "".join(f"{totals[n][0]:>10}{totals[n][1]:>12.2f}" for n in names))
    for n in names:
        print(f"  by kind, {n} (count x CPU s):")
        for verb, row in summary["verbs"][n].items():
            parts = ", ".join(f"{k} x{v[0]} {v[1]:.2f}s" for k, v in row["by_kind"].items())
            print(f"    {verb:<22}{parts}")


# ------------------------------------------------------------------ the test files (as a pytest plugin)
# `--pytest ARGS`: pytest runs with this module as a plugin (-p host_python_calls), which puts the
# counting python3 into every sandbox a test process brings up (cluster.up) and reads it after each
# test and before the sandbox goes down (cluster.down); each process writes what it counted to
# $HOST_PYTHON_CALLS_OUT/<pid>.json.

_LIVE: dict[str, Counting] = {}  # sandbox name -> its counting wrappers
_COUNTED = {key: defaultdict(lambda: [0, 0.0]) for key in ("by_kind", "by_test", "test_kinds")}
_CURRENT = ["(outside a test)"]


def _collect() -> None:
    """Add what every live sandbox's hosts ran since the last look to the current test's account."""
    for counting in _LIVE.values():
        got = counting.read(_KNOWN)
        counting.reset()
        test = _COUNTED["by_test"][_CURRENT[0]]
        test[0] += got["total"]
        test[1] = round(test[1] + got["cpu"], 2)
        for name, (n, cpu) in got["by_kind"].items():
            for entry in (_COUNTED["by_kind"][name], _COUNTED["test_kinds"][f"{_CURRENT[0]} {name}"]):
                entry[0] += n
                entry[1] = round(entry[1] + cpu, 2)


_KNOWN: dict[str, str] = {}


def pytest_configure(config) -> None:
    if not os.environ.get("HOST_PYTHON_CALLS_OUT"):
        return
    from sparkctl.sandbox import cluster

    _KNOWN.update(known_scripts(Path(os.environ.get("HOST_PYTHON_CALLS_TREE", REPO))))
    real_up, real_down = cluster.up, cluster.down

    def counted_up(name=cluster.L.DEFAULT_NAME, *args, **kwargs):
        layout = real_up(name, *args, **kwargs)
        if name not in _LIVE:
            _LIVE[name] = Counting({h.name: h.bin_dir for h in layout.hosts}).__enter__()
        return layout

    def counted_down(name=cluster.L.DEFAULT_NAME, *args, **kwargs):
        counting = _LIVE.pop(name, None)
        if counting is not None:
            _LIVE[name] = counting
            _collect()
            del _LIVE[name]
            counting.__exit__()
        return real_down(name, *args, **kwargs)

    cluster.up, cluster.down = counted_up, counted_down


def pytest_runtest_logstart(nodeid, location) -> None:
    _CURRENT[0] = nodeid


def pytest_runtest_logfinish(nodeid, location) -> None:
    if os.environ.get("HOST_PYTHON_CALLS_OUT"):
        _collect()


def pytest_unconfigure(config) -> None:
    out = os.environ.get("HOST_PYTHON_CALLS_OUT")
    if not out:
        return
    _collect()
    for counting in _LIVE.values():
        counting.__exit__()
    Path(out, f"{os.getpid()}.json").write_text(json.dumps(_COUNTED))


def run_pytest(tree: Path, pytest_args: list[str]) -> dict:
    """The test files ``pytest_args`` run from ``tree`` with the counting plugin: per kind, per test."""
    out = tempfile.mkdtemp(prefix="sparkctl-python-calls-pytest-")
    env = {**os.environ, "PYTHONPATH": f"{tree}:{Path(__file__).resolve().parent}", "HOST_PYTHON_CALLS_OUT": out,
           "HOST_PYTHON_CALLS_TREE": str(tree)}
    proc = run_to_end([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "host_python_calls",
                       *pytest_args], cwd=tree, env=env)
    merged: dict[str, dict] = {key: defaultdict(lambda: [0, 0.0]) for key in ("by_kind", "by_test", "test_kinds")}
    for part in Path(out).glob("*.json"):
        doc = json.loads(part.read_text())
        for key, into in merged.items():
            for name, (n, cpu) in doc[key].items():
                into[name][0] += n
                into[name][1] = round(into[name][1] + cpu, 2)
    by_kind, by_test = merged["by_kind"], merged["by_test"]
    shutil.rmtree(out, ignore_errors=True)
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    return {"exit_code": proc.returncode, "summary": tail,
            "total": sum(v[0] for v in by_kind.values()), "cpu": round(sum(v[1] for v in by_kind.values()), 2),
            "by_kind": dict(sorted(by_kind.items(), key=lambda item: -item[1][1])),
            "by_test": dict(sorted(by_test.items(), key=lambda item: -item[1][1])),
            "test_kinds": dict(sorted(merged["test_kinds"].items()))}


def print_pytest(summary: dict) -> None:
    for name, doc in summary["pytest"].items():
        print(f"python3 on the hosts during pytest {' '.join(summary['pytest_args'])} ({name}): "
              f"{doc['total']} processes, {doc['cpu']:.2f} CPU s (pytest exit {doc['exit_code']}: {doc['summary']})")
        for kind_name, (n, cpu) in doc["by_kind"].items():
            print(f"    {kind_name:<40}{n:>6}{cpu:>10.2f}")
        print("  the tests that ran most:")
        for test, (n, cpu) in list(doc["by_test"].items())[:12]:
            print(f"    {test[-70:]:<72}{n:>6}{cpu:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3, help="hosts of each sandbox (default 3, as the tests')")
    parser.add_argument("--profile", default="sandbox")
    parser.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                        help="passed to every verb of the profile (default: tensor_parallel=HOSTS)")
    parser.add_argument("--base", help="the commit to compare with (default: count this checkout only)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pytest", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="instead of the verbs: run pytest with ARGS (test files, -x ...) and count per test")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("error: the sandboxes need root")
    if args.base and shutil.which("git") is None:
        raise SystemExit("error: --base needs git")
    sets = args.set if args.set is not None else [f"tensor_parallel={args.hosts}"]
    extra = [item for pair in sets for item in ("--set", pair)]
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):  # a kill still removes the wrappers and the sandbox
        signal.signal(stop_signal, lambda number, frame: sys.exit(128 + number))
    root = tempfile.mkdtemp(prefix="sparkctl-python-calls-")
    os.environ["SPARKCTL_SANDBOX_ROOT"] = root
    trees = {"this": REPO}
    verbs: dict = {}
    try:
        if args.base:
            base_tree = Path(root) / "base-tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base_tree), args.base], check=True)
            trees = {"base": base_tree, "this": REPO}
        for name, tree in trees.items():
            if args.pytest is not None:
                verbs[name] = run_pytest(tree, args.pytest)
            else:
                verbs[name] = scenario(tree, f"benchpy{name[:1]}", args.hosts, args.profile, extra)
    finally:
        if args.base:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(Path(root) / "base-tree")], check=False)
        shutil.rmtree(root, ignore_errors=True)
    if args.pytest is not None:
        summary = {"base": args.base, "trees": list(trees), "pytest_args": args.pytest, "pytest": verbs}
    else:
        summary = {"base": args.base, "profile": args.profile, "hosts": args.hosts, "set": sets, "trees": list(trees),
                   "verbs": verbs}
    if args.json:
        print(json.dumps(summary, indent=2))
    elif args.pytest is not None:
        print_pytest(summary)
    else:
        print_table(summary)


if __name__ == "__main__":
    main()
