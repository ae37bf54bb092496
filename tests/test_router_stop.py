"""`stop` of a replicated profile removes the router first: a host whose containers cannot be listed is
that host's error (exit 1 naming it), never "no router container". The listing script runs in a real
shell here, with a `docker` on PATH that fails as a stopped Docker engine does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import OperationFailed
from sparkctl.ops.replica_stop import stop_router
from sparkctl.remote.result import CommandResult

DOCKER_DOWN = "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock.' >&2\nexit 1\n"
# ps lists one router; inspect describes it; rm records what it removed
DOCKER_UP = """#!/bin/sh
case "$1" in
  ps) echo abc123 ;;
  inspect) echo '[{"Id": "abc123", "Name": "/sparkctl-router-sandbox-replicas", "State": {"Status": "running"}}]' ;;
  rm) echo "$@" >> "$(dirname "$0")/removed" ;;
  *) exit 1 ;;
esac
"""


class LocalShell:
    """A host stand-in that runs each argv here, with its own `docker` first on PATH."""

    def __init__(self, name: str, bin_dir: Path):
        self.name, self.bin_dir = name, bin_dir

    def connect(self):
        return self

    def run(self, argv, *, timeout=None, stdin=None, reads_only=False):
        env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ['PATH']}"}
        done = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout)
        return CommandResult(done.returncode, done.stdout, done.stderr, 0.0)


class Pool:
    def __init__(self, shells: dict[str, LocalShell]):
        self.shells = shells

    def get(self, target):
        return self.shells[target.name]


def _site(tmp_path: Path, dockers: dict[str, str]):
    inventory_path = tmp_path / "inventory.yaml"
    hosts = [{"name": n, "address": f"10.9.0.{i + 11}", **({"role": "head"} if i == 0 else {})} for i, n in enumerate(dockers)]
    inventory_path.write_text(yaml.safe_dump({"cluster": "t", "hosts": hosts}))
    shells = {}
    for name, script in dockers.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "docker").write_text(script)
        (folder / "docker").chmod(0o755)
        shells[name] = LocalShell(name, folder)
    return load_inventory(str(inventory_path)), load_profile("sandbox-replicas"), Pool(shells)


def test_a_host_whose_containers_cannot_be_listed_is_an_error_naming_it(tmp_path):
    inventory, loaded, pool = _site(tmp_path, {"s1": DOCKER_UP, "s2": DOCKER_DOWN, "s3": DOCKER_UP})
    with pytest.raises(OperationFailed) as caught:
        stop_router(inventory, loaded, pool)
    message = str(caught.value)
    assert "s2: cannot list the router container: Cannot connect to the Docker daemon" in message
    assert "the replicas were not stopped" in message and "\n" not in message
    # what could be done was done, and said
    assert "removed the router (s1: sparkctl-router-sandbox-replicas; s3: sparkctl-router-sandbox-replicas)" in message
    assert (tmp_path / "s1" / "removed").exists() and not (tmp_path / "s2" / "removed").exists()


def test_every_host_answering_removes_the_router_wherever_it_runs(tmp_path):
    inventory, loaded, pool = _site(tmp_path, {"s1": DOCKER_UP, "s2": DOCKER_UP})
    assert stop_router(inventory, loaded, pool) == (
        "removed the router (s1: sparkctl-router-sandbox-replicas; s2: sparkctl-router-sandbox-replicas)")
    assert "sparkctl-router-sandbox-replicas" in (tmp_path / "s2" / "removed").read_text()
