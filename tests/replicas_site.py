"""The replicas sandbox suites' site: two TP2 replicas behind a router on this test process's 4-host
sandbox, built from a private copy of an image chain under the suite's own tag.

A suite copies ``images/<chain>`` into its temporary folder (``$SPARKCTL_IMAGES`` points there),
so a patch file or a tag can change without touching the images other suites check, and points the
inventory's model, Engram and cache folders under its own ``base`` on each host's NVMe.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from sparkctl.sandbox import cluster as sandbox
from test_standin_support import REPO, sparkctl

ROUTER_PORT, SERVING_PORT = 8889, 8000


class ReplicasSite:
    def __init__(self, cluster, inventory: Path, images: Path, profile: list[str], env: dict | None = None):
        self.cluster, self.inventory, self.images, self.profile = cluster, inventory, images, profile
        self.env = {"SPARKCTL_IMAGES": str(images), **(env or {})}
        self.hosts = list(cluster.info.hosts)
        self.router = f"http://{self.hosts[0].address}:{ROUTER_PORT}"
        # replica 1 is ranks 0-1 (head on host 0), replica 2 ranks 2-3 (head on host 2)
        self.replicas = [f"http://{self.hosts[0].address}:{SERVING_PORT}", f"http://{self.hosts[2].address}:{SERVING_PORT}"]

    def cli(self, *args: str, timeout: float = 900):
        return sparkctl("-i", str(self.inventory), *args, timeout=timeout, env=self.env)

    def up(self, *extra: str):
        """``up --json`` of the suite's profile: (the result, its document or None)."""
        result = self.cli("--json", "up", *self.profile, *extra)
        doc = json.loads(result.stdout) if result.stdout.strip() else None
        if result.code != 0:
            print(f"up {' '.join(extra)}: exit {result.code}\n{result.stdout}\n{result.stderr}")
        return result, doc

    def exec(self, host, *argv: str):
        return sandbox.exec_in_host(self.cluster.info, host.name, list(argv), timeout=120)

    def local(self, host, path: str) -> Path:
        """A host's /mnt/nvme path as this machine sees it."""
        return Path(host.nvme_dir) / Path(path).relative_to("/mnt/nvme")


def make_site(cluster, tmp: Path, *, chain: str, name: str, tag: str, base: str, profile: list[str],
              env: dict | None = None) -> ReplicasSite:
    """A site whose chain is ``images/<chain>`` copied as ``<name>``, its images tagged ``sparkctl-<name>:``
    instead of the chain's own ``sparkctl-<chain>:``, and whose inventory keeps its folders under ``base``."""
    images = tmp / "images"
    shutil.copytree(REPO / "images" / chain, images / name)
    chain_file = images / name / "chain.yaml"
    chain_file.write_text(chain_file.read_text().replace(f"sparkctl-{chain}:", tag.split(":")[0] + ":"))
    inventory = yaml.safe_load(Path(cluster.info.inventory).read_text())
    inventory["paths"].update(model_dir=f"{base}/model", engram_dir=f"{base}/engram", hf_cache=f"{base}/hf")
    inventory_path = tmp / "inventory.yaml"
    inventory_path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return ReplicasSite(cluster, inventory_path, images, profile, env)
