"""The first hour on the sandbox, as a new user: a wheel installed into a fresh venv (what pipx
does), run from an empty folder with an empty home; `sparkctl init --hosts ...` asks the hosts over
SSH and writes an inventory whose doctor passes; later commands need neither -i nor --profile.
Also stop's --dry-run and its confirmation, which must refuse without a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import fresh_venv
from sandbox_fixture import sandbox_cluster  # noqa: F401  (the session's cluster)

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """sparkctl built as a wheel and installed into a fresh venv (pipx's layout: its own venv, one command)."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = fresh_venv.shared_wheel(tmp_path_factory)
    venv = root / "venv"
    installed = fresh_venv.install(venv, wheel)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv


def _user(tmp_path: Path) -> dict:
    """A new user's environment: an empty home and config folder, no inventory anywhere."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_") and k not in ("PYTHONPATH", "SSH_AUTH_SOCK")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    return env


def _run(venv: Path, *args: str, env: dict, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "sparkctl"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_init_from_a_wheel_then_no_dash_i(sandbox_cluster, wheel_venv, tmp_path):  # noqa: F811
    from sparkctl.engram.checkpoint_maker import make_checkpoint

    info = sandbox_cluster.info
    for host in info.hosts:  # a checkpoint on every host, as `model sync` leaves it (a folder of this test's own)
        local = Path(host.nvme_dir) / "firsthour" / "model"
        if not (local / "model.safetensors.index.json").exists():
            make_checkpoint(str(local), vocab_size=64)
    env, work = _user(tmp_path), tmp_path / "work"
    work.mkdir()
    hosts = ",".join(f"{h.name}={h.address}" for h in info.hosts)
    from sparkctl.sandbox.layout import USER  # the hosts' login (nvidia, not root), as on DGX OS

    init = _run(wheel_venv, "--json", "init", "--hosts", hosts, "--user", USER, "--identity-file", info.identity_file,
                "--known-hosts", info.known_hosts, "--cluster", "firsthour", "--model-dir", "/mnt/nvme/firsthour/model", "--default-profile", "sandbox",
                env=env, cwd=work)
    assert init.returncode == 0, init.stderr or init.stdout[-3000:]
    doc = json.loads(init.stdout)
    assert doc["written"] and f"user: {USER}" in Path(doc["inventory"]).read_text()
    written = Path(doc["inventory"])
    assert written == Path(env["XDG_CONFIG_HOME"]) / "sparkctl" / "inventory.yaml" and doc["written"]
    # The fabric came from the hosts' own answers (ibdev2netdev, ip addr), not from a template.
    data = yaml.safe_load(written.read_text())
    # The cabled port's two twin netdevs (as a Spark shows it), each with its HCA and address.
    from sparkctl.sandbox.layout import FABRIC_TWINS

    assert data["defaults"]["fabric_interfaces"] == [dev for _, dev in FABRIC_TWINS]
    assert data["defaults"]["hcas"] == [hca for hca, _ in FABRIC_TWINS]
    assert [h["fabric_addresses"] for h in data["hosts"]] == [list(h.fabric_addresses) for h in info.hosts]
    assert data["hosts"][0]["role"] == "head" and "# " in written.read_text()  # commented
    # Later commands: no -i, no --profile.
    doctor = _run(wheel_venv, "--json", "doctor", env=env, cwd=work)
    report = json.loads(doctor.stdout)
    failed = [(h["name"], c["id"], c["detail"]) for h in report["hosts"] for c in h["checks"] if c["status"] == "fail"]
    assert doctor.returncode == 0 and not failed, (failed, doctor.stderr[-2000:])
    shown = _run(wheel_venv, "--json", "inventory", "show", env=env, cwd=work)
    assert shown.returncode == 0 and json.loads(shown.stdout)["cluster"] == "firsthour", shown.stderr
    stop = _run(wheel_venv, "--json", "stop", "--dry-run", "--set", "tensor_parallel=3", env=env, cwd=work)
    assert stop.returncode == 0, stop.stderr
    plan = json.loads(stop.stdout)
    assert plan["dry_run"] and plan["profile"] == "sandbox" and {h["name"] for h in plan["hosts"]} == {
        h.name for h in info.hosts}


def test_stop_asks_and_refuses_without_a_terminal(sandbox_cluster, tmp_path):  # noqa: F811
    env = {k: v for k, v in os.environ.items() if k != "SPARKCTL_INVENTORY"}
    env["PYTHONPATH"] = str(REPO)
    args = [sys.executable, "-m", "sparkctl", "-i", sandbox_cluster.info.inventory, "stop", "--profile", "sandbox",
            "--set", "tensor_parallel=3"]
    refused = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert refused.returncode == 2 and "-y/--yes" in refused.stderr, refused.stderr
    told_no = subprocess.run(["script", "-qec", " ".join(args), "/dev/null"], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=120, input="n\n") if _has_script() else None
    if told_no is not None:
        assert "not confirmed; nothing changed" in told_no.stdout + told_no.stderr
    done = subprocess.run([*args, "--yes", "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stderr


def _has_script() -> bool:
    import shutil

    return shutil.which("script") is not None
