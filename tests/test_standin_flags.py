"""The stand-in's command lines: parsed exactly against the engine flags files, as the real parsers do."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys

import pytest

from sparkctl.standin import flags as F
from sparkctl.standin.settings import StartupError, settings_from_args

REPO_FLAGS = F.find_flags_file("vllm").parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkctl.standin", *args], capture_output=True, text=True, timeout=30)


class _Started(AssertionError):
    """An argv the stand-in should have refused got as far as starting the engine."""


def run_refused(monkeypatch, *args: str) -> subprocess.CompletedProcess:
    """``python -m sparkctl.standin ARGS`` for an argv it must refuse, in this process (a fresh
    interpreter per case cost most of this file's time): its entry point, with sys.argv and stderr of
    its own, and an engine that fails the test instead of serving if the argv was taken. The process
    itself (exit status 2 from argparse) is checked by the two tests below that start one."""
    # The entry point (on import too) sets SIGTERM/SIGINT to exit at once (stopsignal): this test
    # process keeps its own.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    from sparkctl.standin import __main__ as entry
    from sparkctl.standin import cli as standin_cli

    def started(*_args, **_kwargs):
        raise _Started(f"accepted: {args}")

    monkeypatch.setattr(standin_cli, "Engine", started)
    monkeypatch.setattr(sys, "argv", ["sparkctl.standin", *args])
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = entry.main()
        except SystemExit as done:
            code = done.code
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


@pytest.fixture(scope="module")
def vllm_flags():
    return F.load_flags(F.find_flags_file("vllm", "0.33.0"))


@pytest.fixture(scope="module")
def sglang_flags():
    return F.load_flags(F.find_flags_file("sglang", "0.5.23"))


def parse(engine, flags, argv):
    return F.parse_engine_argv(engine, argv, flags)


def test_every_option_of_the_file_and_nothing_else(vllm_flags, sglang_flags):
    for engine, flags in (("vllm", vllm_flags), ("sglang", sglang_flags)):
        parser = F.build_parser(engine, flags)
        known = {s for action in parser._actions for s in action.option_strings}
        helps = {"-h", "--help"}  # argparse's own (vLLM's file lists them, SGLang's does not)
        assert known - helps == set(flags) - helps, engine


@pytest.mark.parametrize("engine, argv, message", [
    ("vllm", ["serve", "/model", "--kv-cache-dtyp", "fp8"], "unrecognized arguments: --kv-cache-dtyp"),
    ("vllm", ["serve", "/model", "--tp-size", "4"], "unrecognized arguments: --tp-size"),  # SGLang's spelling
    ("vllm", ["serve", "/model", "--port"], "argument --port: expected one argument"),
    ("vllm", ["serve", "/model", "--headless=yes"], "argument --headless: ignored explicit argument 'yes'"),
    ("vllm", ["serve", "/model", "--convert", "bogus"], "argument --convert: invalid choice: 'bogus'"),
    ("vllm", ["serve", "/model", "--port", "eighty"], "argument --port: invalid int value: 'eighty'"),
    ("sglang", ["--model-path", "/model", "--tensor-parallel", "4"], "unrecognized arguments: --tensor-parallel"),
    ("sglang", ["--model-path", "/model", "--max-model-len", "4096"], "unrecognized arguments: --max-model-len"),
    ("sglang", ["--port", "30000"], "the following arguments are required: --model-path"),
    ("sglang", ["--model-path", "/model", "--attention-backend", "nope"], "argument --attention-backend: invalid choice"),
])
def test_refused_argv_exits_2_with_argparse_error(monkeypatch, engine, argv, message):
    proc = run_refused(monkeypatch, engine, *argv)
    assert proc.returncode == 2, proc
    assert message in proc.stderr
    prog = "vllm serve" if engine == "vllm" else "launch_server.py"
    assert f"{prog}: error: " in proc.stderr and proc.stderr.startswith("usage: ")


def test_an_option_absent_from_another_version_is_refused(tmp_path, vllm_flags):
    """A profile pointed at another engine version is checked against that version's file."""
    older = {k: v for k, v in vllm_flags.items() if k != "--headless"}
    (tmp_path / "vllm-0.32.0.json").write_text(json.dumps(older))
    env_run = subprocess.run([sys.executable, "-m", "sparkctl.standin", "vllm", "serve", "/m", "--headless"],
                             capture_output=True, text=True, timeout=30,
                             env={"PATH": "/usr/bin:/bin", "SPARKCTL_STANDIN_FLAGS_DIR": str(tmp_path),
                                  "SPARKCTL_STANDIN_VLLM_VERSION": "0.32.0"})
    assert env_run.returncode == 2 and "unrecognized arguments: --headless" in env_run.stderr


def test_abbreviations_are_refused(vllm_flags):
    with pytest.raises(SystemExit) as exited:
        parse("vllm", vllm_flags, ["/model", "--max-model", "4096"])
    assert exited.value.code == 2


def test_vllm_argv_rewriting(vllm_flags):
    ns = parse("vllm", vllm_flags, ["--max_model_len", "32k", "--model", "/ckpt", "--tensor_parallel_size=2",
                                    "--compilation-config.cudagraph_mode", "FULL", "--compilation-config.level", "3"])
    assert ns.model_tag == "/ckpt"
    assert F.int_value(ns, "vllm", "--max-model-len", 0) == 32000
    assert F.int_value(ns, "vllm", "--tensor-parallel-size", 1) == 2
    assert json.loads(F.value(ns, "vllm", "--compilation-config")) == {"cudagraph_mode": "FULL", "level": 3}
    assert F.human_int("1M") == 1048576 and F.human_int("300000") == 300000


def test_short_alias_is_read_as_its_long_option(vllm_flags):
    ns = parse("vllm", vllm_flags, ["/m", "-tp", "3", "--nnodes", "3"])
    assert F.int_value(ns, "vllm", "--tensor-parallel-size", 1) == 3


def test_rendered_tp4_argv_is_accepted_and_read(vllm_flags, cli, example_inventory):
    """What `sparkctl render` produces for the TP4 vLLM report's profile, every rank, parses cleanly."""
    result = cli("-i", example_inventory, "render", "--profile", "tp4", "--json")
    assert result.code == 0, result
    hosts = result.json()["hosts"]
    for host in hosts:
        argv = host["engine_argv"]
        assert argv[:2] == ["vllm", "serve"]
        ns = parse("vllm", vllm_flags, argv[2:])
        s = settings_from_args("vllm", "0.33.0", ns, env=host["env"])
        assert (s.tp, s.nnodes, s.node_rank, s.headless) == (4, 4, host["rank"], host["rank"] > 0)
        assert s.max_model_len == 300000 and s.max_num_seqs == 8 and s.port == 8000
        assert s.served_model_name == "deepseek-v4.1-flash" and s.master_port == 29500
        assert s.reasoning_parser == "deepseek_v41" and s.default_chat_template_kwargs == {"thinking": False}
        assert s.engram_disk is True  # DSV41_ENGRAM_DISK=1 from the profile's engram.mode: disk


def test_rendered_sglang_argv_is_accepted_and_read(sglang_flags, cli, example_inventory):
    result = cli("-i", example_inventory, "render", "--profile", "sglang-tp4-1m", "--json")
    assert result.code == 0, result
    heads = set()
    for host in result.json()["hosts"]:
        argv = host["engine_argv"]
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        s = settings_from_args("sglang", "0.5.23", parse("sglang", sglang_flags, argv[3:]), env={})
        assert (s.tp, s.nnodes, s.node_rank) == (4, 4, host["rank"])
        assert s.max_model_len == 1048576 and s.serves_http == (host["rank"] == 0)
        assert s.master_port == 20000  # the SGLang line's source: DIST_PORT=20000
        heads.add(s.master_addr)
    assert len(heads) == 1  # every rank meets the same head


@pytest.mark.parametrize("argv, message", [
    (["/m", "--tensor-parallel-size", "4", "--nnodes", "3"], "does not match the world size"),
    (["/m", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "2", "--headless"], "outside 0..1"),
    (["/m", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"], "run with --headless"),
])
def test_a_world_that_does_not_add_up_is_a_startup_error(vllm_flags, argv, message):
    with pytest.raises(StartupError, match=message):
        settings_from_args("vllm", "0.33.0", parse("vllm", vllm_flags, argv), env={})


def test_bad_timing_environment_is_a_startup_error(vllm_flags):
    with pytest.raises(StartupError, match="SPARKCTL_STANDIN_ITL_MS"):
        settings_from_args("vllm", "0.33.0", parse("vllm", vllm_flags, ["/m"]), env={"SPARKCTL_STANDIN_ITL_MS": "fast"})


def test_vllm_top_level_command():
    assert run("vllm", "--version").stdout.strip() == "0.33.0"
    other = run("vllm", "bench")
    assert other.returncode == 2 and "invalid choice: 'bench'" in other.stderr
