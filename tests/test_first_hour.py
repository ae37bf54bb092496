"""The first hour of a new user, without a cluster: --version, the missing-inventory hint, `init
--example` and the per-user defaults, the renamed flags and their old spellings, shell completion."""

from __future__ import annotations


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
    full = {**env, "_SPARKCTL_COMPLETE": "complete_bash",
            "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    return run_cli(env=full, timeout=60).stdout.split()


def test_completion_names_profiles_and_hosts(tmp_path, example_inventory):
    env = {"XDG_CONFIG_HOME": str(tmp_path), "SPARKCTL_INVENTORY": example_inventory}
    assert set(_complete("sparkctl plan --profile tp8", env)) == {"tp8-300k", "tp8-1m"}
    assert "spark-153" in _complete("sparkctl doctor --hosts spark-1", env)
    assert _complete("sparkctl doctor --hosts spark-153,spark-14", env) == ["spark-153,spark-147", "spark-153,spark-148"]
    assert "pack-engram" in _complete("sparkctl pa", env)
    for shell in ("bash", "zsh", "fish"):
        script = run_cli("completion", shell)
        assert script.code == 0 and "_SPARKCTL_COMPLETE" in script.stdout, script


# ---------------------------------------------------------------- the small traps


def test_inventory_check_reports_every_error(tmp_path):
    bad = tmp_path / "inventory.yaml"
    bad.write_text("hosts:\n"
                   "  - {name: a, address: 10.0.0.1, role: head, bogus: 1}\n"
                   "  - {name: 'bad name!', address: 10.0.0.2}\n"
                   "  - {name: c, address: 10.0.0.3, hcas: wrong}\n")
    result = run_cli("--json", "-i", str(bad), "inventory", "check")
    assert result.code == 2, result
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 3, result.stderr
    assert ":2: hosts[0].bogus" in lines[0] and ":3: hosts[1].name" in lines[1] and ":4: hosts[2].hcas" in lines[2]
    assert [e["line"] for e in result.json()["errors"]] == [2, 3, 4]
    twice = tmp_path / "twice.yaml"
    twice.write_text("hosts:\n  - {name: a, address: 10.0.0.1, role: head}\n  - {name: a, address: 10.0.0.1, role: head}\n")
    dup = run_cli("-i", str(twice), "inventory", "check")
    assert dup.code == 2 and dup.stderr.count("error: ") == 3, dup.stderr  # name, address, second head


def test_inventory_show_keeps_long_names_in_a_pipe(tmp_path):
    name = "spark-node-with-a-very-long-host-name-0001.rack-b"
    address = "spark-node-with-a-very-long-host-name-0001.mgmt.example.internal"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  - name: {name}\n    address: {address}\n    role: head\n")
    result = run_cli("-i", str(inventory), "inventory", "show", env={"COLUMNS": "80"})
    assert result.code == 0, result
    assert name in result.stdout and address in result.stdout, result.stdout


def test_did_you_mean_for_profiles_and_set_fields(example_inventory):
    profile = run_cli("plan", "--profile", "tp8")
    assert profile.code == 2 and "did you mean tp8-1m or tp8-300k" in profile.stderr, profile.stderr
    field = run_cli("plan", "--profile", "tp4", "--set", "max_model_lenn=5")
    assert field.code == 2 and "did you mean max_model_len?" in field.stderr, field.stderr
    nested = run_cli("plan", "--profile", "tp4", "--set", "serving.prot=5")
    assert "did you mean port?" in nested.stderr, nested.stderr


def test_bool_flags_show_no_value_type_in_help():
    result = run_cli("doctor", "--help", env={"COLUMNS": "200"})
    assert result.code == 0
    line = next(line for line in result.stdout.splitlines() if "--accept-new-host-keys" in line)
    assert "<bool>" not in line and "BOOLEAN" not in line, line
    assert "<float" in next(line for line in result.stdout.splitlines() if "--connect-timeout" in line)  # values keep theirs


def test_pack_engram_after_model_sync_reads_the_hosts_copy(example_inventory):
    """The README's verb-by-verb path: after `model sync` the hosts hold the checkpoint, so
    `pack-engram --profile P` (no --checkpoint) cuts the shards there instead of asking for a folder."""
    local = run_cli("-i", example_inventory, "pack-engram", "--profile", "tp8-1m", "--source", "local", "--dry-run")
    assert local.code == 2 and "--source on-hosts" in local.stderr, local.stderr
    default = run_cli("--json", "-i", example_inventory, "pack-engram", "--profile", "tp8-1m", "--dry-run",
                      "--hosts", "spark-153", "--connect-timeout", "0.5")
    assert "--checkpoint" not in default.stderr, default  # it went to the hosts (unreachable here)
    readme = (REPO / "README.md").read_text()
    assert "sparkctl pack-engram --profile tp8-1m " in readme and "on-hosts" in readme


# ---------------------------------------------------------------- the build context and the builder


def test_build_dry_run_prints_the_plan_and_every_missing_input(tmp_path):
    result = run_cli("--json", "build", "--profile", "tp4", "--dry-run", "--context", str(tmp_path / "nowhere"))
    assert result.code == 2, result
    doc = result.json()  # one document: the plan, with what is missing
    assert doc["ok"] is False and [layer["name"] for layer in doc["layers"]][-1] == "patch"
    paths = {m["path"] for m in doc["missing_inputs"]}
    assert "patch/engram.py" in paths and "build/_C_stable_libtorch.abi3.so" in paths and len(paths) > 10
    human = run_cli("build", "--profile", "tp4", "--dry-run", "--context", str(tmp_path / "nowhere"))
    assert "missing inputs (" in human.stdout and "docs/images.md" in human.stdout + human.stderr


def test_up_takes_a_build_context():
    result = run_cli("up", "--help", env={"COLUMNS": "200"})
    assert "--context" in result.stdout


def test_a_foreign_arch_local_build_is_refused_naming_the_fix():
    from sparkctl.errors import ConfigError
    from sparkctl.ops.build_arch import check_local_build, normalized

    assert normalized("aarch64") == normalized("arm64") == "arm64" and normalized("x86_64") == "amd64"
    check_local_build("arm64", {"spark-1": "arm64"})  # same: fine
    try:
        check_local_build("amd64", {"spark-1": "arm64", "spark-2": "arm64"})
    except ConfigError as err:
        assert "--on spark-1" in str(err) and "exec format error" in str(err)
    else:
        raise AssertionError("an amd64 build for arm64 hosts was not refused")


def test_the_workflow_runs_the_tests_and_the_lowest_versions_job():
    import yaml

    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "smoke-deploy.yml").read_text())
    runs = {job: " ".join(step.get("run", "") for step in spec["steps"]) for job, spec in workflow["jobs"].items()}
    assert "scripts/test.sh" in runs["tests"]
    assert "scripts/lowest-versions.sh" in runs["lowest-versions"]
    assert "scripts/smoke-deploy.sh" in runs["smoke-deploy"]


def test_lowest_constraints_pin_every_lower_bound():
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    from lowest_constraints import lower_bounds

    pins = lower_bounds('dependencies = [\n  "typer>=0.27.2",  # why\n  "pyyaml>=6.0",\n]\n')
    assert pins == ["typer==0.27.2", "pyyaml==6.0"]


# ---------------------------------------------------------------- progress lines


def test_progress_says_percent_rate_and_time_left():
    from sparkctl.progress import describe

    assert describe(128 * 2**30, 512 * 2**30, 100.0) == "128.0 GiB of 512.0 GiB (25.0 %), 1.3 GiB/s, ETA 5m00s"
    assert describe(512 * 2**30, 512 * 2**30, 400.0).endswith("done in 6m40s")
    assert describe(250, 1000, 5.0) == "250 B of 1000 B (25.0 %), 50 B/s, ETA 15s"


def test_local_hashing_reports_every_byte_read(tmp_path):
    from sparkctl.model import agent

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 300_000)
    seen = []
    agent.build(str(tmp_path), "sha256", None, on_read=seen.append)
    total = sum((tmp_path / n).stat().st_size for n in agent.checkpoint_files(str(tmp_path)))
    assert sum(seen) == total and total >= 300_000


def test_destructive_flags_refuse_without_a_terminal_unless_yes(example_inventory, tmp_path):
    """--force-break-lock (serve, up, stop) and stop itself ask first; with no terminal to ask they
    refuse before anything is contacted (the example's hosts do not exist), naming -y."""
    for args in (("serve", "--profile", "tp4", "--force-break-lock"), ("up", "--profile", "tp4", "--force-break-lock"),
                 ("stop", "--profile", "tp4")):
        result = run_cli("-i", example_inventory, *args, env=_env(tmp_path))  # stdin: empty, not a terminal
        assert result.code == 2 and "-y/--yes" in result.stderr, (args, result.stderr)
        assert "cannot reach" not in result.stderr and "timed out" not in result.stderr


def test_every_verb_that_changes_something_has_dry_run():
    for verb in (["init"], ["build"], ["distribute"], ["model", "sync"], ["pack-engram"], ["serve"], ["stop"], ["up"],
                 ["sandbox", "down"]):
        result = run_cli(*verb, "--help", env={"COLUMNS": "200"})
        assert result.code == 0 and "--dry-run" in result.stdout, (verb, result)