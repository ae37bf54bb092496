"""The inventory's paths.state_dir decides where every host keeps sparkctl's files, lock and audit log
(a non-root SSH user can point it at a folder it owns)."""

from __future__ import annotations

from pathlib import Path

import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.ops import serve as serve_op

REPO = Path(__file__).resolve().parent.parent


def _inventory(tmp_path, state_dir=None):
    data = yaml.safe_load((REPO / "inventory.example.yaml").read_text())
    if state_dir:
        data["paths"]["state_dir"] = state_dir
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_inventory(path)


def test_default_state_dir(tmp_path):
    plan = serve_op.build_plan(_inventory(tmp_path), "tp4", who="w", when="t")
    assert plan.remote_dir == "/var/lib/sparkctl/tp4"
    assert plan.to_json()["lock"]["path"] == "/var/lib/sparkctl/deploy.lock"


def test_state_dir_reaches_files_env_file_lock_and_audit(tmp_path):
    plan = serve_op.build_plan(_inventory(tmp_path, "/home/nvidia/.sparkctl"), "tp4", who="w", when="t")
    assert plan.remote_dir == "/home/nvidia/.sparkctl/tp4"
    doc = plan.to_json()
    assert doc["lock"]["path"] == "/home/nvidia/.sparkctl/deploy.lock"
    assert doc["audit"]["path"] == "/home/nvidia/.sparkctl/audit.log"
    for host in plan.hosts:
        argv = host.docker_argv
        assert argv[argv.index("--env-file") + 1] == "/home/nvidia/.sparkctl/tp4/engine.env"
        assert "/var/lib/sparkctl" not in " ".join(argv)


def test_render_uses_the_state_dir(tmp_path, cli):
    inv = _inventory(tmp_path, "/srv/spark-state")
    result = cli("-i", inv.path, "render", "--profile", "tp4", "--json")
    assert result.code == 0, result
    for host in result.json()["hosts"]:
        argv = host["docker_argv"]
        assert argv[argv.index("--env-file") + 1] == "/srv/spark-state/tp4/engine.env"


def test_relative_state_dir_is_refused(tmp_path, cli):
    path = tmp_path / "inventory.yaml"
    data = yaml.safe_load((REPO / "inventory.example.yaml").read_text())
    data["paths"]["state_dir"] = "state"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = cli("-i", str(path), "inventory", "check")
    assert result.code == 2 and "paths.state_dir" in result.stderr and "relative path" in result.stderr
