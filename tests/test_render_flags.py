"""Only options the engine version really has leave sparkctl; a bad engine_args entry is exit 2.

Checked through the real CLI (`python -m sparkctl`), with the engine flags files as the reference.
"""

from __future__ import annotations

import pytest

from test_render_helpers import engine_flags, parse_options, parsers, render, render_json, split_engine_argv

PROFILES = {"tp4": ("vllm", "0.33.0"), "tp8-300k": ("vllm", "0.33.0"), "tp8-1m": ("vllm", "0.33.0"), "sglang-tp4-1m": ("sglang", "0.5.23")}
PARSER_KIND = {"--tool-call-parser": "tool_call_parsers", "--reasoning-parser": "reasoning_parsers"}


@pytest.mark.parametrize(
    "profile, extra",
    [(name, ()) for name in PROFILES]
    + [("tp4", ("--set", "distributed.launcher=ray", "--set", "engine_args.distributed-executor-backend=null"))],
    ids=list(PROFILES) + ["tp4-ray"],
)
def test_every_rendered_option_exists_in_the_engine_flags_file(profile, extra):
    engine, version = PROFILES[profile]
    flags, names = engine_flags(engine, version), parsers(engine, version)
    data = render_json("--profile", profile, *extra)
    checked = engine_hosts = 0
    for host in data["hosts"]:
        if host["engine_argv"][:2] == ["ray", "start"]:
            continue  # a Ray worker runs no engine
        engine_hosts += 1
        _, options = split_engine_argv(host["engine_argv"])
        parsed = parse_options(options, flags)  # unknown option, missing value or bad choice fails here
        for flag, kind in PARSER_KIND.items():
            if flag in parsed:
                assert parsed[flag] in names[kind], (flag, parsed[flag])
        checked += len(parsed)
    assert engine_hosts == (1 if extra else len(data["hosts"]))
    assert checked >= 15 * engine_hosts  # the whole command was read, not an empty one


# (profile, --set assignment, field named in the error, words the message must contain)
REFUSED = [
    ("tp4", "engine_args.no-such-option=1", "engine_args.no-such-option", "has no option --no-such-option"),
    ("tp4", "engine_args.speculative-confg={}", "engine_args.speculative-confg", "did you mean --speculative-config"),
    ("tp4", "engine_args.tp=8", "engine_args.tp", "has no option --tp"),
    ("tp4", "engine_args.convert=bogus", "engine_args.convert", "not a valid --convert"),
    ("tp4", "engine_args.tool-call-parser=no_such_parser", "engine_args.tool-call-parser", "no --tool-call-parser named"),
    ("tp4", "engine_args.reasoning-parser=deepseek-v41", "engine_args.reasoning-parser", "no --reasoning-parser named"),
    ("tp4", "engine_args.tool-call-parser=true", "engine_args.tool-call-parser", "takes a value"),
    ("tp4", "engine_args.enable-auto-tool-choice=1", "engine_args.enable-auto-tool-choice", "takes no value"),
    ("tp4", "engine_args.no-such-switch=false", "engine_args.no-such-switch", "has no option"),
    ("sglang-tp4-1m", "engine_args.tp=4", "engine_args.tp", "has no option --tp"),
    ("sglang-tp4-1m", "engine_args.tool-call-parser=deepseek_v41", "engine_args.tool-call-parser", "not a valid --tool-call-parser"),
    ("sglang-tp4-1m", "engine_args.reasoning-parser=deepseek_v41", "engine_args.reasoning-parser", "not a valid --reasoning-parser"),
]
# Options sparkctl renders itself, per engine (aliases included).
OWNED = {
    "tp4": ["tensor-parallel-size", "nnodes", "node-rank", "master-addr", "master-port", "host", "port", "model",
            "served-model-name", "headless", "max-model-len", "gpu-memory-utilization", "max-num-seqs",
            "max-num-batched-tokens", "block-size"],
    "sglang-tp4-1m": ["tp-size", "tensor-parallel-size", "nnodes", "node-rank", "dist-init-addr", "host", "port",
                      "model-path", "model", "served-model-name", "mem-fraction-static", "context-length",
                      "max-running-requests", "chunked-prefill-size", "page-size"],
}
for _profile, _flags in OWNED.items():
    REFUSED += [(_profile, f"engine_args.{flag}=1", f"engine_args.{flag}", "is set by sparkctl") for flag in _flags]


@pytest.mark.parametrize("profile, assignment, field, words", REFUSED, ids=[f"{p}:{a}" for p, a, _, _ in REFUSED])
def test_bad_engine_args_are_refused_naming_field_and_profile_file(profile, assignment, field, words):
    result = render("--profile", profile, "--set", assignment)
    assert result.code == 2, result
    assert result.stdout == ""
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "Traceback" not in result.stderr
    assert f"{field}:" in error
    assert f"recipes/{profile}.yaml" in error
    assert words in error


def test_a_bad_option_in_a_profile_file_names_that_file_and_line(tmp_path):
    (tmp_path / "my-tp4.yaml").write_text(
        "extends: tp4\n"
        "engine_args:\n"
        "  enable-prefix-caching: true\n"
        "  prefill-magic: 3\n"
    )
    result = render("--profile", "my-tp4", env={"SPARKCTL_RECIPES": str(tmp_path)})
    assert result.code == 2, result
    assert f"{tmp_path / 'my-tp4.yaml'}:4: engine_args.prefill-magic: vllm 0.33.0 has no option --prefill-magic" in result.stderr


def test_a_bad_option_inherited_from_a_base_names_the_base(tmp_path):
    (tmp_path / "_base.yaml").write_text("extends: tp4\nengine_args:\n  kv-cache-dtyp: fp8\n")
    (tmp_path / "child.yaml").write_text("extends: _base\nmax_num_seqs: 4\n")
    result = render("--profile", "child", env={"SPARKCTL_RECIPES": str(tmp_path)})
    assert result.code == 2, result
    assert f"{tmp_path / '_base.yaml'}:3: engine_args.kv-cache-dtyp:" in result.stderr
    assert "did you mean --kv-cache-dtype" in result.stderr and "inherited by profile 'child'" in result.stderr


def test_an_engine_version_without_a_flags_file_is_refused():
    result = render("--profile", "tp4", "--set", 'engine_version="0.34.0"')
    assert result.code == 2, result
    assert "engine_version" in result.stderr and "no flags file for vllm 0.34.0" in result.stderr


def test_valid_engine_args_via_set_are_rendered_and_checked():
    data = render_json("--profile", "tp4", "--set", "engine_args.kv-cache-dtype=fp8", "--set", "engine_args.enforce-eager=true",
                       "--set", "engine_args.enable-prefix-caching=false")
    options = parse_options(split_engine_argv(data["hosts"][0]["engine_argv"])[1], engine_flags("vllm", "0.33.0"))
    assert options["--kv-cache-dtype"] == "fp8"
    assert options["--enforce-eager"] is True
    assert "--enable-prefix-caching" not in options  # false leaves a switch out
