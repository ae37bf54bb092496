"""How long the Ray head takes to stop when SIGTERM comes during `ray start`: the line rendered
before (`bash -c "ray start ... && exec vllm serve ..."`) against this checkout's, side by side.

Each line runs as a container runs it: PID 1 of a PID namespace of its own (`unshare --pid`, root),
where a signal without a handler is dropped, with a `ray` that is still starting (it never ends on
its own). It gets SIGTERM from outside the namespace, as `docker stop` sends it, and SIGKILL
--grace seconds later (docker stop's --time; sparkctl stop passes 30, docker's default is 10).
Prints each run's seconds from SIGTERM to the end and the ratio of the medians.

With --inventory (a sandbox's, `sparkctl sandbox up --hosts 1`): real `docker stop` on its first
host instead, timed on the host, the container an image of static busybox (`/bin/bash` runs busybox
sh, as in the stand-in image) whose `ray` is still starting.

    sudo python bench/ray_head_stop.py [--grace 10] [--runs 3] [--shell "busybox sh"]
    sudo python bench/ray_head_stop.py --inventory SANDBOX/inventory.yaml [--grace 10] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkctl.commands.vllm import ray_head_line  # noqa: E402

START = ["ray", "start", "--head", "--port=6379"]
SERVE = ["vllm", "serve", "/model", "--distributed-executor-backend", "ray", "--tensor-parallel-size", "2"]
LINES = {"before": " ".join(START) + " && exec " + " ".join(SERVE), "now": ray_head_line(START, SERVE)}


def stop_seconds(shell: list[str], line: str, grace_s: float, folder: Path) -> float:
    """Seconds from SIGTERM to the line's end (SIGKILL after ``grace_s``, as docker stop does)."""
    mark = folder / "started"
    mark.unlink(missing_ok=True)
    env = dict(os.environ, PATH=f"{folder}:{os.environ['PATH']}", MARK=str(mark))
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *shell, line], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while not mark.exists():
        time.sleep(0.01)
    pid_1 = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    sent = time.monotonic()
    os.kill(pid_1, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.kill(pid_1, signal.SIGKILL)
        proc.wait()
    return time.monotonic() - sent


IMAGE = "sparkctl-bench-rayhead:1"
STILL_STARTING = "#!/bin/sh\nexec sleep 600\n"  # `ray start` (and `vllm serve`) that have not finished


def _ssh(inventory: str) -> list[str]:
    """ssh to the inventory's first host as sparkctl reaches it (its user, key and known_hosts)."""
    import yaml

    doc = yaml.safe_load(Path(inventory).read_text())
    ssh = {**(doc.get("defaults") or {}).get("ssh", {}), **doc["hosts"][0].get("ssh", {})}
    return ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={doc['known_hosts']}", "-i",
            ssh["identity_file"], "-p", str(ssh.get("port", 22)), f"{ssh['user']}@{doc['hosts'][0]['address']}"]


def _busybox_image(ssh: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        bin_dir = Path(folder) / "bin"
        bin_dir.mkdir()
        shutil.copy(shutil.which("busybox"), bin_dir / "busybox")
        for name in ("sh", "sleep", "kill"):
            (bin_dir / name).symlink_to("busybox")
        for name, text in (("bash", '#!/bin/sh\nexec /bin/sh "$@"\n'), ("ray", STILL_STARTING), ("vllm", STILL_STARTING)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        tar = subprocess.Popen(["tar", "-C", folder, "-c", "."], stdout=subprocess.PIPE)
        subprocess.run([*ssh, shlex.join(["docker", "import", "-", IMAGE])], stdin=tar.stdout, check=True,
                       capture_output=True)
        tar.wait()


def docker_stop_seconds(ssh: list[str], line: str, grace_s: float) -> float:
    """`docker stop` of a head container running ``line`` while `ray start` runs, timed on the host."""
    def remote(*argv: str) -> str:
        return subprocess.run([*ssh, shlex.join(argv)], capture_output=True, text=True, check=True).stdout

    remote("docker", "rm", "-f", "sparkctl-bench-rayhead")
    remote("docker", "run", "-d", "--name", "sparkctl-bench-rayhead", "--network", "host", IMAGE, "bash", "-c", line)
    while remote("docker", "inspect", "-f", "{{.State.Status}}", "sparkctl-bench-rayhead").strip() != "running":
        time.sleep(0.1)
    timed = f's=$(date +%s.%N); docker stop --time {grace_s:g} sparkctl-bench-rayhead >/dev/null; echo "$s $(date +%s.%N)"'
    started, ended = map(float, remote("sh", "-c", timed).split())
    remote("docker", "rm", "-f", "sparkctl-bench-rayhead")
    return ended - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL (docker stop --time)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shell", default="busybox sh", choices=["busybox sh", "bash"])
    parser.add_argument("--inventory", help="a sandbox's inventory: real docker stop on its first host")
    args = parser.parse_args()
    shell = args.shell.split() + ["-c"]
    runs: dict[str, list[float]] = {"before": [], "now": []}
    if args.inventory:
        ssh = _ssh(args.inventory)
        _busybox_image(ssh)
        for _ in range(args.runs):
            for name, line in LINES.items():
                runs[name].append(docker_stop_seconds(ssh, line, args.grace))
        args.shell = "docker stop on a sandbox host, busybox sh"
    else:
        with tempfile.TemporaryDirectory() as folder:
            ray = Path(folder) / "ray"
            ray.write_text('#!/bin/sh\necho started > "$MARK"\nexec sleep 600\n')  # still starting
            ray.chmod(0o755)
            for _ in range(args.runs):  # alternate, so a change of load hits both
                for name, line in LINES.items():
                    runs[name].append(stop_seconds(shell, line, args.grace, Path(folder)))
    for name, values in runs.items():
        print(f"{name:>6}: " + "  ".join(f"{v:.2f}" for v in values) + f"   median {statistics.median(values):.2f} s")
    ratio = statistics.median(runs["before"]) / statistics.median(runs["now"])
    print(f"stop during ray start ({args.shell}, grace {args.grace:g} s): now is {ratio:.0f}x faster than before "
          f"(median over {args.runs} runs each; load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
