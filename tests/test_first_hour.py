"""The first hour of a new user, without a cluster: --version, the missing-inventory hint, `init
--example` and the per-user defaults, the renamed flags and their old spellings, shell completion."""

from __future__ import annotations

import os
import subprocess
import sys

from clirun import REPO, run_cli


def _env(tmp_path, **extra) -> dict:
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), **extra}


def test_version_prints_the_package_version():
    from sparkctl import __version__

    result = run_cli("--version")
    assert result.code == 0, result
    assert result.stdout.strip() == f"sparkctl {__version__}"


def test_no_inventory_says_how_to_make_one(tmp_path):
    result = run_cli("doctor", cwd=tmp_path, env=_env(tmp_path))
    assert result.code == 2, result
    assert "sparkctl init --hosts" in result.stderr and "-i FILE" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_init_example_becomes_the_default_inventory(tmp_path):
    env = _env(tmp_path)
    written = run_cli("--json", "init", "--example", "--default-profile", "tp8-1m", cwd=tmp_path, env=env)
    assert written.code == 0, written
    doc = written.json()
    inventory = tmp_path / "config" / "sparkctl" / "inventory.yaml"
    assert doc["inventory"] == str(inventory) and doc["written"] is True
    assert inventory.read_text() == (REPO / "inventory.example.yaml").read_text()
    # Later commands need neither -i nor --profile.
    check = run_cli("--json", "inventory", "check", cwd=tmp_path, env=env)
    assert check.code == 0 and check.json()["inventory"] == str(inventory), check
    plan = run_cli("--json", "plan", cwd=tmp_path, env=env)
    assert plan.code in (0, 1) and plan.json()["profile"] == "tp8-1m", plan
    # A second init does not replace the file unless told to.
    again = run_cli("init", "--example", cwd=tmp_path, env=env)
    assert again.code == 2 and "--force" in again.stderr, again


def test_init_dry_run_writes_nothing(tmp_path):
    result = run_cli("init", "--example", "--dry-run", cwd=tmp_path, env=_env(tmp_path))
    assert result.code == 0, result
    assert "hosts:" in result.stdout
    assert not (tmp_path / "config").exists()


def test_init_refuses_when_a_host_does_not_answer(tmp_path):
    # 127.0.0.1 port 9: nothing listens; the inventory is not written with a host's answers missing.
    result = run_cli("--json", "init", "--hosts", "spark-1=127.0.0.1", "--port", "9", "--connect-timeout", "2",
                     cwd=tmp_path, env=_env(tmp_path))
    assert result.code == 1, result
    doc = result.json()
    assert doc["written"] is False and doc["hosts"][0]["ok"] is False and doc["hosts"][0]["error"]
    assert not (tmp_path / "config" / "sparkctl" / "inventory.yaml").exists()


def test_default_profile_unknown_is_refused_with_a_suggestion(tmp_path):
    result = run_cli("init", "--default-profile", "tp8", cwd=tmp_path, env=_env(tmp_path))
    assert result.code == 2, result
    assert "tp8-1m" in result.stderr or "tp8-300k" in result.stderr, result.stderr


def test_old_timeout_spelling_still_works_and_says_the_new_name(tmp_path, example_inventory):
    """`--timeout` meant the SSH connect timeout in doctor: it is `--connect-timeout` now, the old
    spelling rewritten (with a note) for one release, and no longer shown in help."""
    env = _env(tmp_path)
    old = run_cli("-i", example_inventory, "doctor", "--timeout", "0.2", "--hosts", "nope", cwd=tmp_path, env=env)
    assert "`doctor --timeout` is now `--connect-timeout`" in old.stderr, old
    assert "no such option" not in old.stderr
    for verb, new in (("doctor", "--connect-timeout"), ("serve", "--health-timeout"), ("up", "--health-timeout"),
                      ("smoke", "--request-timeout"), ("stop", "--grace"), ("bench", "--request-timeout"),
                      ("pack-engram", "--connect-timeout")):
        helped = run_cli(verb, "--help", env={"COLUMNS": "200", **env})
        assert new in helped.stdout, (verb, helped.stdout[-2000:])
        assert "--timeout " not in helped.stdout, (verb, "the old spelling is hidden")
    model = run_cli("model", "sync", "--help", env={"COLUMNS": "200", **env})
    assert "--connect-timeout" in model.stdout and "--timeout " not in model.stdout


def _complete(words: str, env: dict) -> list[str]:
    full = {**os.environ, **env, "PYTHONPATH": str(REPO), "_SPARKCTL_COMPLETE": "complete_bash",
            "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    proc = subprocess.run([sys.executable, "-m", "sparkctl"], env=full, capture_output=True, text=True, timeout=60)
    return proc.stdout.split()


def test_completion_names_profiles_and_hosts(tmp_path, example_inventory):
    env = {"XDG_CONFIG_HOME": str(tmp_path), "SPARKCTL_INVENTORY": example_inventory}
    assert set(_complete("sparkctl plan --profile tp8", env)) == {"tp8-300k", "tp8-1m"}
    assert "spark-153" in _complete("sparkctl doctor --hosts spark-1", env)
    assert _complete("sparkctl doctor --hosts spark-153,spark-14", env) == ["spark-153,spark-147", "spark-153,spark-148"]
    assert "pack-engram" in _complete("sparkctl pa", env)
    for shell in ("bash", "zsh", "fish"):
        script = run_cli("completion", shell)
        assert script.code == 0 and "_SPARKCTL_COMPLETE" in script.stdout, script
