"""Secrets given to a profile (--env, --set env.X, engine options) reach engine.env (0600) and nothing
else: not recipe.yaml, not render's stdout or --json, not the deployment record or audit fields, not
drift lines, not an error message. Each surface names the secret and says where its value lives."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.ops import serve as serve_op
from sparkctl.ops.drift import argv_changes
from sparkctl.secrets import MASK

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = str(REPO / "inventory.example.yaml")
TOKEN, PASSWORD, SET_TOKEN = "hf_V4lue1", "pw_V4lue2", "tok_V4lue3"
VALUES = (TOKEN, PASSWORD, SET_TOKEN)
SECRET_OPTIONS = ["--env", f"HF_TOKEN={TOKEN}", "--env", f"DB_PASSWORD={PASSWORD}", "--set", f"env.MY_TOKEN={SET_TOKEN}"]


def test_render_out_keeps_secret_values_in_engine_env_only(cli, tmp_path):
    out = tmp_path / "out"
    result = cli("-i", EXAMPLE, "render", "--profile", "tp4", *SECRET_OPTIONS, "--out", str(out))
    assert result.code == 0, result
    for value in VALUES:
        assert value not in result.stdout and value not in result.stderr
    holders = set()
    for path in out.rglob("*"):
        if path.is_file() and any(v in path.read_text() for v in VALUES):
            holders.add(path.name)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert holders == {"engine.env"}
    recipe = (out / "recipe.yaml").read_text()
    assert "HF_TOKEN" in recipe and MASK in recipe  # named, masked
    assert "engine.env" in result.stderr and "HF_TOKEN" in result.stderr  # where the value lives


def test_render_json_masks_secret_values(cli):
    result = cli("-i", EXAMPLE, "--json", "render", "--profile", "tp4", *SECRET_OPTIONS)
    assert result.code == 0, result
    for value in VALUES:
        assert value not in result.stdout
    env = result.json()["hosts"][0]["env"]
    assert env["HF_TOKEN"] == env["DB_PASSWORD"] == env["MY_TOKEN"] == MASK


@pytest.mark.parametrize("flag,hint", [("hf-token", "HF_TOKEN"), ("api-key", "api"), ("ssl-keyfile-password", "engine.env")])
def test_secret_engine_option_is_refused_and_its_value_never_shown(cli, flag, hint, tmp_path):
    value = "sk-N0tShown"
    for args in (["render", "--profile", "tp4"], ["serve", "--profile", "tp4", "--dry-run"]):
        result = cli("-i", EXAMPLE, "--json", *args, "--set", f"engine_args.{flag}={value}")
        assert result.code == 2, result
        assert value not in result.stdout + result.stderr
        assert f"engine_args.{flag}" in result.stderr and hint in result.stderr
        assert json.loads(result.stdout)["ok"] is False


def test_deployment_record_and_audit_fields_withhold_set_env_values():
    inventory = load_inventory(EXAMPLE)
    plan = serve_op.build_plan(inventory, "tp4", sets=[f"env.MY_TOKEN={SET_TOKEN}"], envs=[f"HF_TOKEN={TOKEN}"],
                               who="w", when="2026-11-30T12:00:00Z")
    assert SET_TOKEN not in json.dumps(plan.overrides)  # the audit line's overrides
    for host in plan.hosts:
        for file in host.files:
            if file.name != "engine.env":
                assert SET_TOKEN not in file.content and TOKEN not in file.content, file.name
    assert SET_TOKEN not in json.dumps(plan.to_json())


def test_drift_line_names_a_changed_secret_option_without_values():
    changes = argv_changes(["vllm", "serve", "/model", "--api-key", "sk-old", "--port", "8000"],
                           ["vllm", "serve", "/model", "--api-key", "sk-new", "--port", "8001"])
    text = " ".join(changes)
    assert "sk-old" not in text and "sk-new" not in text
    assert "--api-key" in text and "--port 8000 → 8001" in text
    gone = " ".join(argv_changes(["vllm", "--hf-token=hf_x"], ["vllm"]))
    assert "--hf-token" in gone and "hf_x" not in gone
