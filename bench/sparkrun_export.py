"""Run sparkrun 0.4.2's own dry run on the recipe `sparkctl render` exports, and compare the
containers it would start with sparkctl's own `docker run` for the same profile.

sparkrun needs Python >= 3.12 in its own venv (never a sparkctl dependency):

    python3.12 -m venv /tmp/sparkrun-venv && /tmp/sparkrun-venv/bin/pip install sparkrun==0.4.2
    python3 bench/sparkrun_export.py --profile tp4 [--sparkrun-python /tmp/sparkrun-venv/bin/python]

The dry run prints only "Would execute on HOST (N lines)"; the driver below runs sparkrun's CLI
in-process and records those scripts (nothing is executed, nothing leaves the machine), then
prints, per item, what sparkctl runs and whether sparkrun's scripts carry it. Exit 0 when every
item matches, 1 otherwise.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Runs inside sparkrun's venv: sparkrun's CLI with its script runner recording instead of executing.
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
out = sys.argv[1]
sys.argv = ["sparkrun"] + sys.argv[2:]
try:
    main()
except SystemExit as exit:
    code = exit.code
else:
    code = 0
json.dump({"code": code, "scripts": recorded}, open(out, "w"))
"""


def sparkctl_render(profile: str, out: Path, inventory: str) -> dict:
    env = {**os.environ, "SPARKCTL_INVENTORY": inventory}
    proc = subprocess.run([sys.executable, "-m", "sparkctl", "render", "-p", profile, "--out", str(out), "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        sys.exit(f"sparkctl render failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def sparkrun_dry_run(python: str, recipe: Path, hosts: list[str], init_port: int, home: str) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        argv = [python, "-c", DRIVER, result.name, "run", str(recipe), "--hosts", ",".join(hosts),
                "--init-port", str(init_port), "--dry-run"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "HOME": home})
        data = json.loads(Path(result.name).read_text() or "{}") if Path(result.name).stat().st_size else {}
    if not data or data.get("code") not in (0, None):
        sys.exit(f"sparkrun dry run failed (exit {data.get('code')}): {proc.stderr.strip()[-2000:]}")
    return data["scripts"]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tp4")
    parser.add_argument("--inventory", default=str(REPO / "inventory.example.yaml"))
    parser.add_argument("--sparkrun-python", default="/tmp/sparkrun-venv/bin/python")
    args = parser.parse_args()
    if not Path(args.sparkrun_python).exists():
        print(f"skip: no sparkrun venv at {args.sparkrun_python} (see this script's docstring)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "render"
        rendered = sparkctl_render(args.profile, out, args.inventory)
        if not (out / "recipe.yaml").exists() or "hosts" not in rendered:
            # one host renders no recipe; replicas render one per replica folder
            print(f"skip: {args.profile} exports no single sparkrun recipe (one host, or one per replica)")
            return 0
        hosts = [h["name"] for h in rendered["hosts"]]
        from sparkctl.config.inventory import load_inventory

        inventory = {h.name: h for h in load_inventory(args.inventory).hosts}
        addresses = [inventory[name].address for name in hosts]
        from sparkctl.config.profile import load_profile

        port = load_profile(args.profile).profile.distributed.master_port
        scripts = sparkrun_dry_run(args.sparkrun_python, out / "recipe.yaml", addresses, port, str(Path(tmp) / "home"))
    runs = docker_runs(scripts)
    text = decoded_text(scripts)
    head_run = runs.get(addresses[0], "")
    ok = True
    print(f"sparkrun dry run of {args.profile}: {len(scripts)} script(s), docker run on {len(runs)} host(s)")
    for what, words in expectations(rendered):
        flag, value = words
        present = any(f"{flag}{sep}{quoted}" in head_run for sep in (" ", "=") for quoted in (value, shlex.quote(value)))
        ok &= present
        print(f"  {'ok  ' if present else 'MISS'} {what}")
    present, what = gpu_check(rendered, head_run)
    ok &= present
    print(f"  {'ok  ' if present else 'MISS'} {what}")
    serve = rendered["hosts"][0]["engine_argv"]
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
    ok &= every
    print(f"  {'ok  ' if every else 'MISS'} every engine option of sparkctl's head command is in sparkrun's serve script")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
