"""The shared set-up of the fault matrix's rows for the verbs that move things to hosts (build --on,
distribute, model sync, pack-engram): two small image chains (no stand-in engine: a few MB each), a
small checkpoint, and an inventory whose model and Engram folders are this module's own. Each cell
takes from spark-2 what its verb puts there, so the verb has real work to do under the fault and in
the re-run, and the truth is read on the hosts themselves (image IDs from each engine, files and
shards on each NVMe), never only from what sparkctl reports.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from clirun import run_cli
from sandbox_fixture import give_to_user
from test_build_support import copy_chain

BASE = "/mnt/nvme/fault-tests"
BUILD_CHAIN, DIST_CHAIN = "faultbuild", "faultdist"  # one chain per verb: their tags never meet on a host
UP_CHAIN = "faultup"  # with the stand-in engine: up serves it


def tag(chain: str) -> str:
    return f"sparkctl-{chain}:latest"


class ChainSite:
    def __init__(self, cluster, tmp: Path, docker_env: dict | None = None):
        self.cluster, self.tmp = cluster, tmp
        self.hosts = list(cluster.info.hosts)
        self.images = tmp / "images"
        for chain in (BUILD_CHAIN, DIST_CHAIN, UP_CHAIN):
            folder = copy_chain(self.images / chain)
            spec = folder / "chain.yaml"
            text = spec.read_text().replace("sparkctl-sandbox:", f"sparkctl-{chain}:")
            if chain != UP_CHAIN:  # a few MB without the engine's python
                text = text.replace("    standin_engine: true", "    standin_engine: false")
            spec.write_text(text)
        inventory = yaml.safe_load(Path(cluster.info.inventory).read_text())
        inventory["paths"].update(model_dir=f"{BASE}/model", engram_dir=f"{BASE}/engram", hf_cache=f"{BASE}/hf")
        self.inventory = tmp / "inventory.yaml"
        self.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
        self.env = {"SPARKCTL_IMAGES": str(self.images), **(docker_env or {})}
        self.checkpoint = tmp / "ckpt"
        for host in self.hosts:  # the login user's folders, as on a prepared box
            for folder in ("model", "engram", "hf"):
                path = self.local(host, f"{BASE}/{folder}")
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir(parents=True)
        give_to_user(*(h.nvme_dir for h in self.hosts))

    def cli(self, *args: str, timeout: float = 300):
        return run_cli("-i", str(self.inventory), *args, env=self.env, timeout=timeout)

    def argv(self, *args: str) -> list[str]:
        import sys

        return [sys.executable, "-m", "sparkctl", "-i", str(self.inventory), *args]

    def exec(self, host, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        from sparkctl.sandbox import cluster

        result = cluster.exec_in_host(self.cluster.info, host.name, list(argv), timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"{host.name}: {argv}: {result.stderr.decode(errors='replace')}")
        return result

    @staticmethod
    def local(host, path: str) -> Path:
        """Where a host's /mnt/nvme/... lives on this machine."""
        return Path(host.nvme_dir) / Path(path).relative_to("/mnt/nvme")

    def image_id(self, host, chain: str) -> str:
        """The image's ID in the host's own engine ("" when absent)."""
        result = self.exec(host, "docker", "image", "inspect", "--format", "{{.Id}}", tag(chain), check=False)
        return result.stdout.decode().strip() if result.returncode == 0 else ""

    def drop_image(self, host, chain: str) -> None:
        self.exec(host, "docker", "rmi", "-f", tag(chain), check=False)
        assert self.image_id(host, chain) == ""

    def running(self, host) -> list[str]:
        """Names of the profile's containers running on the host, as its engine says."""
        listed = self.exec(host, "docker", "ps", "--filter", "label=sparkctl.profile=sandbox", "--format", "{{.Names}}")
        return listed.stdout.decode().split()

    def model_copy(self, host) -> Path:
        return self.local(host, f"{BASE}/model")

    def shards(self, host) -> list[str]:
        folder = self.local(host, f"{BASE}/engram")
        return sorted(p.name for p in folder.iterdir() if p.name.startswith("engram-")) if folder.exists() else []

    def clear_folder(self, path: Path) -> None:
        for entry in path.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    def drop_chain(self, host, chain: str) -> None:
        """Every image of the chain off the host: the next distribute sends it whole."""
        for _ in range(6):  # children first: a parent with a child is refused until the child is gone
            listed = self.exec(host, "docker", "images", "-aq", "--filter", f"label=org.sparkctl.chain={chain}")
            ids = sorted(set(listed.stdout.decode().split()))
            if not ids:
                break
            self.exec(host, "docker", "rmi", "-f", *ids, check=False)
        self.drop_image(host, chain)

    def same_model(self, host, checkpoint: Path | None = None) -> bool:
        """The host's copy holds every file of the checkpoint, byte for byte."""
        copy = self.model_copy(host)
        return all((copy / p.name).is_file() and (copy / p.name).read_bytes() == p.read_bytes()
                   for p in (checkpoint or self.checkpoint).iterdir())


def rows(doc: dict) -> dict[str, dict]:
    """The per-host rows of a report, by host name (reports name the key "name" or "host")."""
    return {row.get("name") or row.get("host"): row for row in doc.get("hosts", [])}


def parse(result) -> dict:
    try:
        return json.loads(result.stdout) if result.stdout.strip() else {}
    except json.JSONDecodeError:
        return {}
