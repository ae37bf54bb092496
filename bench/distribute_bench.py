#!/usr/bin/env python3
"""Image distribution on the sandbox: one run, ratios (these machines are noisy; compare ratios).

Brings up its own sandbox (``bench``, 4 hosts, a private state root, torn down at the end unless
``--keep``) and a throwaway Docker engine on this machine (the control machine), builds the sandbox
chain there with ``STANDIN_MB`` random bytes in overlay3 (``--standin-mb``, default 256), then:

1. ``sparkctl distribute`` to N = 1, 2, 4 hosts (hosts emptied first) against the naive loop of the
   the TP4 vLLM report (Appendix A.6): ``docker save IMG | ssh HOST docker load``, one host after the other, and against
   the machine's own floor: the same N hosts ``docker load``-ing a local file at the same time (in the
   sandbox all hosts share this machine's CPUs and disk; on real Sparks each has its own).
   Goal: sparkctl at N=4 within 1.3x of N=1.
2. A patch-only redistribution (one patch file changed, only the patch layer rebuilt) against the
   full one: bytes and seconds.
3. The bulk transport: sparkctl to 4 hosts over OpenSSH against paramiko, and the raw channel of
   one host (bench/distribute_transport.py).

    python bench/distribute_bench.py [--standin-mb 256] [--hosts 4] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from throwaway_dockerd import ThrowawayDockerd  # noqa: E402

TAG = "sparkctl-sandbox:latest"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sandbox_up(hosts: int, root: str):
    from sparkctl.sandbox import cluster

    os.environ["SPARKCTL_SANDBOX_ROOT"] = root
    return cluster.up_on_free_subnets("bench", hosts, cluster.subnet_pairs(199, 150))


def empty_hosts(layout, names) -> None:
    import docker

    for host in layout.hosts:
        if host.name not in names:
            continue
        client = docker.DockerClient(base_url=f"unix://{host.docker_socket}")
        for image in client.images.list(all=True):
            for tag in image.tags:
                client.images.remove(tag, force=True)
        client.images.prune(filters={"dangling": False})
        client.close()


def distribute(inventory, names, transport="auto") -> tuple[float, object]:
    from sparkctl.ops.distribute import DistributeOptions, run_distribute
    from sparkctl.output import Output

    started = time.monotonic()
    report = run_distribute(inventory, DistributeOptions(tag=TAG, hosts=list(names), transport=transport, retries=0), Output())
    seconds = time.monotonic() - started
    failed = [h.name for h in report.hosts if h.status == "failed"]
    if failed:
        raise RuntimeError(f"distribution failed on {failed}: {[h.error for h in report.hosts if h.error]}")
    return seconds, report


def naive(inventory, names, engine_url) -> float:
    """The TP4 vLLM report's loop: docker save | ssh HOST docker load, one host after the other."""
    from sparkctl.remote.openssh import Route, client_argv as openssh_argv

    started = time.monotonic()
    for host in inventory.hosts:
        if host.name not in names:
            continue
        target = inventory.ssh_target(host)
        save = subprocess.Popen(["docker", "-H", engine_url, "save", TAG], stdout=subprocess.PIPE)
        load = subprocess.Popen(openssh_argv(Route(host.name, target, target.address), ["docker", "load"]),
                                stdin=save.stdout, stdout=subprocess.DEVNULL)
        save.stdout.close()
        if load.wait() != 0 or save.wait() != 0:
            raise RuntimeError(f"naive copy to {host.name} failed")
    return time.monotonic() - started


def receivers_alone(layout, names, engine_url, work: Path) -> float:
    """The machine's own limit: the same hosts `docker load` the archive from a local file, all at once.

    In the sandbox every host's sshd and dockerd share this machine's CPUs and disk, so N hosts
    loading at once cannot be as fast as one; this is the floor a distribution to N hosts can reach."""
    from concurrent.futures import ThreadPoolExecutor

    from sparkctl.sandbox import cluster

    archive = work / "image.tar"
    if not archive.exists():
        with open(archive, "wb") as out:
            subprocess.run(["docker", "-H", engine_url, "save", TAG], stdout=out, check=True)
    started = time.monotonic()
    with ThreadPoolExecutor(len(names)) as ex:
        done = list(ex.map(lambda n: cluster.exec_in_host(layout, n, ["docker", "load", "-i", str(archive)], timeout=600), names))
    seconds = time.monotonic() - started
    if any(p.returncode for p in done):
        raise RuntimeError("local docker load failed")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--standin-mb", type=int, default=256, help="random MB in overlay3 (the image's bulk)")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="leave the sandbox and engine running")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (the sandbox and a throwaway dockerd)")

    from sparkctl.config.inventory import load_inventory
    from sparkctl.images.chain import load_chain
    from sparkctl.images.engine import DockerPyEngine
    from sparkctl.images.plan import plan_build
    from sparkctl.ops.build import BuildOptions, run_build
    from sparkctl.output import Output
    from sparkctl.sandbox import cluster

    import distribute_transport

    work = Path(tempfile.mkdtemp(prefix="sparkctl-bench-"))
    root = str(work / "state")
    engine = ThrowawayDockerd(prefix="sparkctl-bench-dockerd-").start(timeout=30)
    os.environ["DOCKER_HOST"] = engine.url
    results: dict = {"standin_mb": args.standin_mb, "hosts": args.hosts, "cpus": os.cpu_count()}
    try:
        layout = sandbox_up(args.hosts, root)
        inventory = load_inventory(layout.inventory)
        names = [h.name for h in inventory.hosts]
        chain_dir = work / "sandbox"
        shutil.copytree(REPO / "images" / "sandbox", chain_dir)

        def build() -> None:
            plan = plan_build(load_chain(str(chain_dir)), build_args={"STANDIN_MB": str(args.standin_mb)})
            with DockerPyEngine(engine.url) as docker_engine:
                result = run_build(plan, docker_engine, BuildOptions(), Output())
            if not result.ok:
                raise RuntimeError(f"build failed: {result.errors}")

        say(f"building the sandbox chain with STANDIN_MB={args.standin_mb} ...")
        build()
        counts = [n for n in (1, 2, 4, 8) if n <= args.hosts]
        rows = []
        for n in counts:
            empty_hosts(layout, names[:n])
            naive_s = naive(inventory, names[:n], engine.url)
            empty_hosts(layout, names[:n])
            ours_s, report = distribute(inventory, names[:n])
            sent = sum(h.bytes_sent for h in report.hosts)
            empty_hosts(layout, names[:n])
            floor_s = receivers_alone(layout, names[:n], engine.url, work)
            rows.append({"n": n, "sparkctl_s": round(ours_s, 2), "naive_s": round(naive_s, 2), "local_load_s": round(floor_s, 2),
                         "bytes_sent": sent, "docker_save_bytes": report.source_bytes, "transport": report.transport})
            say(f"N={n}: sparkctl {ours_s:.2f}s, naive loop {naive_s:.2f}s, hosts loading a local file at once {floor_s:.2f}s")
        results["scaling"] = rows
        full_s, full_report = rows[-1]["sparkctl_s"], rows[-1]
        # Patch-only: every host has the image; change one patch file, rebuild (patch layer only), send.
        (chain_dir / "patch" / "sparse_swa.py").write_text('ORIGIN = "patch"\nPATCHED = True\nREVISION = 99\n')
        build()
        patch_s, patch_report = distribute(inventory, names[:counts[-1]])
        patch_bytes = sum(h.bytes_sent for h in patch_report.hosts)
        results["patch_only"] = {"n": counts[-1], "seconds": round(patch_s, 2), "bytes_sent": patch_bytes,
                                 "modes": sorted({h.mode for h in patch_report.hosts}),
                                 "full_seconds": full_s, "full_bytes_sent": full_report["bytes_sent"]}
        say(f"patch-only to {counts[-1]}: {patch_bytes} bytes in {patch_s:.2f}s")
        # Transports: the whole distribution to N hosts, and one raw channel.
        empty_hosts(layout, names[:counts[-1]])
        paramiko_s, _ = distribute(inventory, names[:counts[-1]], transport="paramiko")
        empty_hosts(layout, names[:counts[-1]])
        openssh_s, _ = distribute(inventory, names[:counts[-1]], transport="openssh")
        channel = distribute_transport.measure(inventory.ssh_target(inventory.hosts[-1]), 512, 3)
        results["transport"] = {"n": counts[-1], "openssh_s": round(openssh_s, 2), "paramiko_s": round(paramiko_s, 2),
                                "channel": channel}
        one, last = rows[0], rows[-1]
        results["ratios"] = {
            f"sparkctl_N{last['n']}_over_N1": round(last["sparkctl_s"] / one["sparkctl_s"], 2),
            f"local_load_N{last['n']}_over_N1": round(last["local_load_s"] / one["local_load_s"], 2),
            f"sparkctl_over_local_load_N{last['n']}": round(last["sparkctl_s"] / last["local_load_s"], 2),
            f"naive_N{last['n']}_over_sparkctl_N{last['n']}": round(last["naive_s"] / last["sparkctl_s"], 2),
            "patch_over_full_bytes": round(patch_bytes / full_report["bytes_sent"], 5),
            "patch_over_full_seconds": round(patch_s / full_s, 2),
            f"paramiko_over_openssh_N{last['n']}_seconds": round(paramiko_s / openssh_s, 2),
            "openssh_over_paramiko_channel": channel["openssh_over_paramiko"],
        }
    finally:
        if not args.keep:
            cluster.down("bench")
            engine.stop()
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept: sandbox state {root}, engine {engine.url} (pid {engine.proc.pid})")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        size = results["scaling"][0]["docker_save_bytes"] / 1048576
        print(f"image: {size:.0f} MiB archive (STANDIN_MB={args.standin_mb}); sandbox of {args.hosts} hosts on one "
              f"{results['cpus']}-CPU machine (every host's sshd and dockerd share it)")
        print(f"{'N':>3} {'sparkctl':>10} {'naive loop':>11} {'local load':>11}")
        for row in results["scaling"]:
            print(f"{row['n']:>3} {row['sparkctl_s']:>9.2f}s {row['naive_s']:>10.2f}s {row['local_load_s']:>10.2f}s")
        p = results["patch_only"]
        print(f"patch-only to {p['n']}: {p['bytes_sent']} bytes in {p['seconds']:.2f}s ({','.join(p['modes'])}) "
              f"vs full {p['full_bytes_sent']} bytes in {p['full_seconds']:.2f}s")
        t = results["transport"]
        print(f"bulk transport to {t['n']}: OpenSSH {t['openssh_s']:.2f}s, paramiko {t['paramiko_s']:.2f}s; one channel "
              f"{t['channel']['openssh_mib_s']} vs {t['channel']['paramiko_mib_s']} MiB/s")
        for key, value in results["ratios"].items():
            print(f"  {key} = {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
