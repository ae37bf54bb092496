#!/usr/bin/env python3
"""How many docker CLI processes each sparkctl verb starts on the hosts: this checkout against another commit.

Every docker process on a host costs CPU there (the CLI's start, ~40 ms, plus the engine's work and
the shell around it), and the test suite's sandbox tier runs these verbs hundreds of times. Each
sandbox host has its own folder bound over /usr/local/bin, which comes before /usr/bin on the
host's PATH: a counting ``docker`` put there (it logs its argv, then runs /usr/bin/docker) counts that
host's calls only and leaves this machine's docker alone. It is removed at the end.

Each verb runs once from each tree (the other commit checked out into a temporary ``git worktree``),
against the same sandbox, and the calls each run made are counted per host and per docker
subcommand. Counts do not depend on the machine's load, so one round is enough.

    python bench/docker_calls.py [--base REV] [--inventory INVENTORY] [--profile sandbox] [--json]
    python bench/docker_calls.py --from-logs FOLDER [--json]

``--from-logs`` ranks what a test run counted instead (SPARKCTL_TEST_DOCKER_CALLS=FOLDER, see
tests/docker_counting.py): the calls by docker subcommand, by the sparkctl verb or test that made
them and by who ran docker on the host (a command over SSH, a shell script, a shipped agent such as
the relay, the test itself).

Without --inventory it brings up its own 4-host sandbox (root needed) and removes it afterwards.
Goal: no verb asks a host more often than before, the container listing and the engine's info in
as few calls as they can be.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from host_wrappers import HostWrappers

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# What the tests start most that asks the hosts' docker; `--dry-run`: nothing changes on the hosts.
VERBS = (
    ("status",),
    ("doctor",),
    ("logs",),
    ("stop", "--dry-run"),
    ("up", "--dry-run"),
    ("setup", "--dry-run"),
    ("top", "--once"),
)
# (`serve --dry-run` asks the hosts nothing: its plan is made from the profile alone.)
NO_PROFILE = {"setup"}  # verbs of the inventory alone: no --profile, no --set
LOG_NAME = ".docker-calls.log"
# The counting docker: one line per call (its first two words), then the real one.
# (bash's exec -a: the real docker keeps the name "docker", as a process list shows it without the wrapper)
WRAPPER = f"""#!/bin/bash
printf '%s %s\\n' "${{1:-}}" "${{2:-}}" >> /usr/local/bin/{LOG_NAME}
exec -a docker /usr/bin/docker "$@"
"""


class Counting(HostWrappers):
    """The counting docker in every host's /usr/local/bin (removed on exit)."""

    def __init__(self, bin_dirs: dict[str, str]):
        super().__init__(bin_dirs, "docker", WRAPPER, LOG_NAME)

    def read(self) -> dict[str, Counter]:
        """host -> Counter of "subcommand next-word" lines since the last reset."""
        return {host: Counter(_command(line) for line in lines) for host, lines in self.lines().items()}


def _command(line: str) -> str:
    """"image inspect", "ps -a", "inspect" (an ID or a name after the subcommand is left out)."""
    first, _, second = line.strip().partition(" ")
    keep = second.startswith("-") or first in ("image", "container", "system", "network", "volume")
    return f"{first} {second}" if keep and second else first


def run_verb(tree: Path, argv: tuple[str, ...], inventory: str, profile: str, extra: list[str]) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100", "SPARKCTL_INVENTORY": inventory}
    options = [] if argv[0] in NO_PROFILE else ["--profile", profile, *extra]
    proc = subprocess.run([sys.executable, "-m", "sparkctl", *argv, *options], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode


def count(trees: dict[str, Path], counting: Counting, inventory: str, profile: str, extra: list[str]) -> dict:
    result: dict = {}
    for argv in VERBS:
        verb = " ".join(argv)
        result[verb] = {}
        for name, tree in trees.items():
            counting.reset()
            code = run_verb(tree, argv, inventory, profile, extra)
            per_host = counting.read()
            calls = sum((c for c in per_host.values()), Counter())
            result[verb][name] = {"exit_code": code, "total": sum(calls.values()),
                                  "per_host": {h: sum(c.values()) for h, c in per_host.items()},
                                  "by_command": dict(calls.most_common())}
    return result


def sandbox_bin_dirs(inventory: str) -> dict[str, str]:
    """The hosts' /usr/local/bin folders, from the sandbox whose inventory this is."""
    from sparkctl.sandbox import cluster

    state = Path(inventory).resolve().parent
    os.environ["SPARKCTL_SANDBOX_ROOT"] = str(state.parent)
    layout = cluster.load(state.name)
    return {host.name: host.bin_dir for host in layout.hosts}


def own_sandbox(hosts: int):
    from sparkctl.sandbox import cluster

    root = tempfile.mkdtemp(prefix="sparkctl-docker-calls-")
    os.environ["SPARKCTL_SANDBOX_ROOT"] = root
    info = cluster.up_on_free_subnets("benchdocker", hosts, cluster.subnet_pairs(251, 200))
    return info, root


def print_table(summary: dict) -> None:
    names = summary["trees"]
    print(f"docker CLI processes started on the hosts per verb ({summary['hosts']} hosts, profile {summary['profile']}):")
    print(f"  {'verb':<16}" + "".join(f"{n:>10}" for n in names) + "   per host (" + names[-1] + ")")
    for verb, per_tree in summary["verbs"].items():
        cells = "".join(f"{per_tree[n]['total']:>10}" for n in names)
        codes = " ".join(f"exit {per_tree[n]['exit_code']}" for n in names if per_tree[n]["exit_code"])
        hosts = ", ".join(f"{h} {c}" for h, c in per_tree[names[-1]]["per_host"].items())
        print(f"  {verb:<16}{cells}   {hosts}" + (f"   ({codes})" if codes else ""))
    for name in names:
        print(f"  by docker subcommand, {name}:")
        for verb, per_tree in summary["verbs"].items():
            parts = ", ".join(f"{k.strip()} x{v}" for k, v in per_tree[name]["by_command"].items())
            print(f"    {verb:<16}{parts}")


def _short_command(args: str) -> str:
    """docker's subcommand, with the --format (shortened) that tells one question from another."""
    words = args.split(" ")
    take = 2 if words[0] in ("image", "container", "system", "network", "volume") and len(words) > 1 else 1
    head = " ".join(words[:take])
    if "--format" in words:
        form = " ".join(words[words.index("--format") + 1:])[:28]
        return f"{head} --format {form}"
    return head + (" -a" if "-a" in words[take:] else "") + (" -q" if "-aq" in words or "-q" in words else "")


# --from-logs: a test run's records (tests/docker_counting.py), one tab-separated line per call:
# time, "<test node id> :: <CLI call>", the caller's command line, docker's arguments.
def _caller_kind(caller: str) -> str:
    if caller.startswith("sshd"):
        return "over SSH"
    if ".pyz" in caller:  # a shipped agent on a host (the relay's docker save), not this machine's tests
        return "host agent"
    if "pytest" in caller or "python" in caller.split(" ", 1)[0]:
        return "test on this machine"
    return "shell script"


def _script_name(caller: str) -> str:
    """A script's own name where it gives itself one (`sh -c SCRIPT NAME ...`), else its start."""
    words = caller.split()
    named = [w for w in words if w.startswith("sparkctl-")]
    return named[0] if named else caller[:70]


def rank_logs(folder: Path) -> dict:
    counts: dict[str, Counter] = {key: Counter() for key in
                                  ("subcommand", "caller", "verb", "verb_subcommand", "test", "script", "helper")}
    total = 0
    for log in sorted(folder.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) != 4:
                continue
            _, context, caller, args = fields
            test, _, cli = context.partition(" ::")
            kind, command = _caller_kind(caller), _short_command(args)
            verb = next((w for w in cli.split() if not w.startswith("-")), "") if kind != "test on this machine" else ""
            where = verb or ("(test helper)" if kind == "test on this machine" else "(no CLI call yet)")
            total += 1
            counts["subcommand"][command] += 1
            counts["caller"][kind] += 1
            counts["verb"][where] += 1
            counts["verb_subcommand"][f"{where} | {command} | {kind}"] += 1
            counts["test"][test.strip() or "(fixture)"] += 1
            if kind == "shell script":
                counts["script"][_script_name(caller)] += 1
            if kind == "test on this machine":
                counts["helper"][f"{test.split('::')[0].strip()} | {command}"] += 1
    return {"total": total, **{key: dict(c.most_common()) for key, c in counts.items()}}


def print_ranking(ranking: dict, top: int = 25) -> None:
    print(f"docker CLI processes on the test clusters' hosts: {ranking['total']}")
    for key, title in (("caller", "by caller"), ("subcommand", "by docker subcommand"), ("verb", "by sparkctl verb"),
                       ("verb_subcommand", "by verb | subcommand | caller"), ("script", "shell scripts"),
                       ("helper", "the tests' own calls, by file"), ("test", "by test")):
        print(f"  {title}:")
        for name, n in list(ranking[key].items())[:top]:
            print(f"    {n:>6}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-logs", type=Path, metavar="FOLDER", help="rank a test run's counted calls (see above)")
    parser.add_argument("--inventory", help="a sandbox's inventory (default: bring up a sandbox of our own)")
    parser.add_argument("--hosts", type=int, default=4, help="hosts of our own sandbox (default 4)")
    parser.add_argument("--profile", default="sandbox")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every verb")
    parser.add_argument("--base", help="the commit to compare with (default: count this checkout only)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.from_logs is not None:
        if not args.from_logs.is_dir():
            raise SystemExit(f"error: --from-logs: {args.from_logs} is not a folder")
        ranking = rank_logs(args.from_logs)
        print(json.dumps(ranking, indent=2)) if args.json else print_ranking(ranking)
        return
    if shutil.which("git") is None and args.base:
        raise SystemExit("error: --base needs git")
    extra = [item for pair in args.set for item in ("--set", pair)]
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):  # a kill or hang-up still removes the wrappers and the sandbox
        signal.signal(stop_signal, lambda number, frame: sys.exit(128 + number))
    own = None
    inventory = args.inventory
    if inventory is None:
        if os.geteuid() != 0:
            raise SystemExit("error: bringing up a sandbox needs root (or pass --inventory of one)")
        own = own_sandbox(args.hosts)
        inventory = own[0].inventory
    elif not Path(inventory).is_file():
        raise SystemExit(f"error: --inventory: {inventory} is not a file")
    tmp = tempfile.mkdtemp(prefix="sparkctl-docker-calls-tree-")
    trees = {"this": REPO}
    try:
        if args.base:
            base_tree = Path(tmp) / "base"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base_tree), args.base], check=True)
            trees = {"base": base_tree, "this": REPO}
        bin_dirs = sandbox_bin_dirs(inventory)
        with Counting(bin_dirs) as counting:
            verbs = count(trees, counting, inventory, args.profile, extra)
    finally:
        if args.base:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(Path(tmp) / "base")], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        if own is not None:
            from sparkctl.sandbox import cluster

            cluster.down(own[0].name)
            shutil.rmtree(own[1], ignore_errors=True)
    summary = {"base": args.base, "profile": args.profile, "hosts": len(bin_dirs), "trees": list(trees), "verbs": verbs}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)


if __name__ == "__main__":
    main()
