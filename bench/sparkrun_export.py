"""Run sparkrun 0.4.2's own dry run on the recipe `sparkctl render` exports, and compare the
containers it would start with sparkctl's own `docker run` for the same profile.

sparkrun needs Python >= 3.12 in its own venv (never a sparkctl dependency):

    python3.12 -m venv /tmp/sparkrun-venv && /tmp/sparkrun-venv/bin/pip install sparkrun==0.4.2
    python3 bench/sparkrun_export.py --profile tp4 [--profile tp8-300k ...] [--sparkrun-python /tmp/sparkrun-venv/bin/python]

The dry run prints only "Would execute on HOST (N lines)"; the driver below runs sparkrun's CLI
in-process and records those scripts (nothing is executed, nothing leaves the machine: see
OFFLINE_SSH_CONFIG), then prints, per profile and item, what sparkctl runs and whether
sparkrun's scripts carry it. Several profiles share one sparkrun process (its start-up is most
of a dry run's cost). Exit 0 when every item of every profile matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Runs inside sparkrun's venv: sparkrun's CLI with its script runner recording instead of executing,
# once per argv list of the JSON file argv[2]; the scripts of each run go to argv[1], in order.
DRIVER = r"""
import json, sys
import sparkrun.orchestration.ssh as ssh
recorded = []
original = ssh.run_remote_script
def record(host, script, *args, **kwargs):
    if kwargs.get("dry_run"):
        recorded.append({"host": host, "script": script})
    return original(host, script, *args, **kwargs)
ssh.run_remote_script = record
for name, module in list(sys.modules.items()):
    if name.startswith("sparkrun") and getattr(module, "run_remote_script", None) is original:
        module.run_remote_script = record
from sparkrun.cli import main
out, runs = sys.argv[1], json.load(open(sys.argv[2]))
results = []
for argv in runs:
    recorded.clear()
    sys.argv = ["sparkrun"] + argv
    try:
        main()
    except SystemExit as exit:
        code = exit.code
    else:
        code = 0
    results.append({"code": code, "scripts": list(recorded)})
json.dump(results, open(out, "w"))
"""

# sparkrun's scheduler asks every host for its containers over ssh even in a dry run (the answer
# only tells it which GPUs are taken), and it clones its recipe registries from GitHub. The
# example inventory's hosts are not reachable from here: each ssh waited out its 10 s
# ConnectTimeout. ProxyCommand=false makes OpenSSH fail at once the same way (exit 255, no
# answer), so the scripts recorded are the same, and git refuses every protocol: nothing leaves
# the machine.
OFFLINE_SSH_CONFIG = 'ssh:\n  options: ["-o", "ProxyCommand=false"]\n'
OFFLINE_ENV = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.allow", "GIT_CONFIG_VALUE_0": "never",
               "SPARKRUN_NO_TELEMETRY": "1"}


@dataclass
class Export:
    """One profile rendered by sparkctl: its `render --json` document and what sparkrun is run with."""

    profile: str
    rendered: dict
    recipe: Path
    addresses: list[str]  # management addresses in rank order
    port: int  # distributed.master_port: sparkrun's --init-port


def sparkctl_render(profile: str, out: Path, inventory) -> Export | str:
    """The profile rendered in this process (the document `render --json` prints), or why it
    exports no single recipe: one host renders none, replicas render one per replica folder."""
    from sparkctl.config.profile import load_profile
    from sparkctl.ops.render import render

    loaded = load_profile(profile).profile
    if loaded.replicas > 1:
        return f"{profile} exports no single sparkrun recipe (one host, or one per replica)"
    plan, written = render(inventory, profile, out_dir=str(out))
    if not (out / "recipe.yaml").exists():
        return f"{profile} exports no single sparkrun recipe (one host, or one per replica)"
    rendered = plan.to_json(written)
    addresses = {h.name: h.address for h in inventory.hosts}
    return Export(profile, rendered, out / "recipe.yaml", [addresses[h["name"]] for h in rendered["hosts"]],
                  loaded.distributed.master_port)


def offline_home(home: str) -> dict[str, str]:
    """A HOME for sparkrun that reaches no host and no registry; the environment to run it with."""
    config = Path(home) / ".config" / "sparkrun" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(OFFLINE_SSH_CONFIG)
    return {**os.environ, **OFFLINE_ENV, "HOME": home}


def sparkrun_dry_runs(python: str, exports: list[Export], tmp: Path) -> list[list[dict]]:
    """The scripts sparkrun would run for each export, in order: one sparkrun process for all."""
    runs = [["run", str(e.recipe), "--hosts", ",".join(e.addresses), "--init-port", str(e.port), "--dry-run"]
            for e in exports]
    (tmp / "runs.json").write_text(json.dumps(runs))
    result = tmp / "result.json"
    proc = subprocess.run([python, "-c", DRIVER, str(result), str(tmp / "runs.json")], capture_output=True, text=True,
                          timeout=600, env=offline_home(str(tmp / "home")))
    data = json.loads(result.read_text()) if result.exists() and result.stat().st_size else []
    if len(data) != len(runs):
        sys.exit(f"sparkrun dry run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    for export, one in zip(exports, data):
        if one.get("code") not in (0, None):
            sys.exit(f"sparkrun dry run of {export.profile} failed (exit {one.get('code')}): {proc.stderr.strip()[-2000:]}")
    return [one["scripts"] for one in data]


def docker_runs(scripts: list[dict]) -> dict[str, str]:
    """host -> the `docker run` line of sparkrun's launch script for it (shell text: sparkrun adds
    some options through `$(...)`, e.g. the RDMA device only where the host has one)."""
    found: dict[str, str] = {}
    for item in scripts:
        for line in item["script"].splitlines():
            if "docker run " in line:
                found.setdefault(item["host"], line[line.index("docker run "):])
    return found


def decoded_text(scripts: list[dict]) -> str:
    """Every script, plus the base64 payloads sparkrun wraps its serve commands in, decoded."""
    import base64
    import re

    parts = []
    for item in scripts:
        parts.append(item["script"])
        for blob in re.findall(r"'([A-Za-z0-9+/]{40,}={0,2})'", item["script"]):
            try:
                parts.append(base64.b64decode(blob).decode("utf-8", "replace"))
            except ValueError:
                pass
    return "\n".join(parts)


def expectations(rendered: dict) -> list[tuple[str, list[str]]]:
    """(what, words that must appear in sparkrun's docker run) from sparkctl's head docker argv."""
    argv = rendered["hosts"][0]["docker_argv"]
    items = []
    pairs = {"--memory": "memory", "--ulimit": "ulimit", "--cap-add": "capability", "--device": "device", "-v": "mount",
             "--network": "network", "--ipc": "ipc", "--restart": "restart policy"}
    for i, word in enumerate(argv[:-1]):
        if word in pairs:
            value = argv[i + 1]
            if word == "-v" and value.endswith(":/root/.cache/huggingface"):
                continue  # sparkrun mounts its own HF cache (said in the recipe)
            items.append((f"{pairs[word]} {value}", [word, value]))
    return items


GPU_REQUEST = re.compile(r"(?:--gpus[ =](\S+)|--device[ =]'?nvidia\.com/gpu=([^\s']+))")


def gpu_check(rendered: dict, head_run: str) -> tuple[bool, str]:
    """sparkctl's --gpus against sparkrun's GPU request (ExecutorConfig.gpus / accelerator_vendor).

    sparkrun's scheduler assigns each rank `--gpus device=N` (or the CDI `--device nvidia.com/gpu=N`):
    on a Spark, with its one GPU, that is what `--gpus all` gives. No --gpus must mean no request."""
    argv = rendered["hosts"][0]["docker_argv"]
    wanted = argv[argv.index("--gpus") + 1] if "--gpus" in argv else None
    found = [a or b for a, b in GPU_REQUEST.findall(head_run)]
    if wanted is None:
        return not found, f"gpus: none requested (sparkrun: {', '.join(found) or 'none'})"
    return bool(found), f"gpus {wanted} (sparkrun: {', '.join(found) or 'none'})"


def compare(export: Export, scripts: list[dict]) -> bool:
    """Print, item by item, whether sparkrun's scripts carry sparkctl's container and command."""
    rendered, port = export.rendered, export.port
    runs = docker_runs(scripts)
    text = decoded_text(scripts)
    head_run = runs.get(export.addresses[0], "")
    ok = True
    print(f"sparkrun dry run of {export.profile}: {len(scripts)} script(s), docker run on {len(runs)} host(s)")
    for what, words in expectations(rendered):
        flag, value = words
        present = any(f"{flag}{sep}{quoted}" in head_run for sep in (" ", "=") for quoted in (value, shlex.quote(value)))
        ok &= present
        print(f"  {'ok  ' if present else 'MISS'} {what}")
    present, what = gpu_check(rendered, head_run)
    ok &= present
    print(f"  {'ok  ' if present else 'MISS'} {what}")
    every = serve_options_present(rendered["hosts"][0]["engine_argv"], text, port)
    print(f"  {'ok  ' if every else 'MISS'} every engine option of sparkctl's head command is in sparkrun's serve script")
    return ok and every


def serve_options_present(serve: list[str], text: str, port: int) -> bool:
    """Every option of sparkctl's head engine command (and its program words) in sparkrun's scripts;
    a line for the rendezvous port and for each option missing."""
    every = True
    for i, word in enumerate(serve):
        if word.startswith("--") and word not in ("--nnodes", "--node-rank", "--master-addr", "--headless"):
            value = serve[i + 1] if i + 1 < len(serve) and not serve[i + 1].startswith("--") else None
            if word == "--dist-init-addr":
                # sparkrun puts its own view of the head's address; the port is its --init-port
                present = re.search(rf"--dist-init-addr \S+:{port}\b", text) is not None
                print(f"  {'ok  ' if present else 'MISS'} rendezvous port {port} (--dist-init-addr HEAD:{port})")
                every &= present
                continue
            needle = f"{word} {shlex.quote(value)}" if value is not None else word
            present = needle in text or (value is not None and f"{word} {value}" in text)
            every &= present
            if word == "--master-port":
                print(f"  {'ok  ' if present else 'MISS'} rendezvous port {port} (--master-port)")
            elif not present:
                print(f"  MISS serve option {needle}")
    positional = serve[:next((i for i, w in enumerate(serve) if w.startswith("--")), len(serve))]
    head_line = " ".join(shlex.quote(w) for w in positional)
    if head_line not in text:  # e.g. `vllm serve /model`: the checkpoint path the engine reads
        every = False
        print(f"  MISS serve command {head_line}")
    return every


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", help="a profile to check (repeat for several; default tp4)")
    parser.add_argument("--inventory", default=str(REPO / "inventory.example.yaml"))
    parser.add_argument("--sparkrun-python", default="/tmp/sparkrun-venv/bin/python")
    args = parser.parse_args()
    if not Path(args.sparkrun_python).exists():
        print(f"skip: no sparkrun venv at {args.sparkrun_python} (see this script's docstring)")
        return 0
    sys.path.insert(0, str(REPO))  # sparkctl from this checkout, also when it is not installed
    from sparkctl.config.inventory import load_inventory

    inventory = load_inventory(args.inventory)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        exports = []
        for profile in args.profile or ["tp4"]:
            export = sparkctl_render(profile, Path(tmp) / "render" / profile, inventory)
            if isinstance(export, str):
                print(f"skip: {export}")
            else:
                exports.append(export)
        all_scripts = sparkrun_dry_runs(args.sparkrun_python, exports, Path(tmp)) if exports else []
        for export, scripts in zip(exports, all_scripts):
            ok &= compare(export, scripts)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
