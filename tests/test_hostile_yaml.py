"""Hostile inventories, profiles and --set values: one line naming the file or option, exit 2, no
traceback, and bounded time and memory (each run below may map at most 1 GB more and is stopped
after 60 s)."""

from __future__ import annotations

import contextlib
import json
import re
import os
import resource
import time

import pytest

from clirun import REPO, run_cli_in_process

GOOD_HOSTS = "hosts:\n  - name: a\n    address: 10.0.0.1\n    role: head\n"
MEMORY_CAP = 1 << 30  # the old loader took 1.1 GB for seven levels of nine aliases
CPU_CAP = 150  # times a plain check's CPU (~12 ms; the deepest case here ~25x, ~56x seen at load 45, where
# cache misses stretch CPU time too): the old loader took 7 s, about 580x


def _mapped_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


@contextlib.contextmanager
def _address_space_cap(extra: int):
    """This process may map at most ``extra`` more bytes until the block ends: past that an
    allocation fails with MemoryError (which the CLI reports as exit 1) instead of eating the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_mapped_bytes() + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_capped(*args: str, timeout: float = 60):
    """The CLI's entry point in this process (tests/clirun.py) under the address-space cap. Returns
    its result and the CPU seconds it used (not the wall clock, which a loaded machine stretches)."""
    started = time.process_time()
    with _address_space_cap(MEMORY_CAP):
        result = run_cli_in_process(*args, timeout=timeout)
    return result, time.process_time() - started


@pytest.fixture(scope="module")
def plain_check_cpu(tmp_path_factory) -> float:
    """CPU seconds of checking the example inventory (the best of three): what a hostile one is
    measured against. Each copy differs by a comment, so each is parsed afresh."""
    example = (REPO / "inventory.example.yaml").read_text()
    runs = []
    for attempt in range(3):
        path = tmp_path_factory.mktemp("plain") / "inventory.yaml"
        path.write_text(f"{example}\n# copy {attempt}\n")
        result, seconds = run_capped("-i", str(path), "inventory", "check")
        assert result.returncode == 0, result.stderr[-2000:]
        runs.append(seconds)
    return min(runs)


def assert_one_line(proc, *fragments, code=2):
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def billion_laughs(levels: int = 7) -> str:
    out = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        out.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(out) + "\n"


HOSTILE = [
    ("alias-bomb", billion_laughs(7) + GOOD_HOSTS, ["more than 100,000 values"]),
    ("alias-bomb-in-a-field", "defaults:\n  hcas: &x [a, a, a, a, a, a, a, a, a, a]\n" + billion_laughs(8).replace("\n", "\n  ").join(["extra:\n  ", ""]) + GOOD_HOSTS, ["values"]),
    ("recursive-alias", "x: &r [*r]\n" + GOOD_HOSTS, [":1:", "recursive alias"]),
    ("recursive-mapping-alias", "x: &r {a: *r}\n" + GOOD_HOSTS, ["recursive alias"]),
    ("deep-flow-nesting", "x: " + "[" * 5000 + "]" * 5000 + "\n" + GOOD_HOSTS, [":1:", "nested more than 32 levels"]),
    ("deep-block-nesting", "".join("  " * i + f"k{i}:\n" for i in range(200)) + GOOD_HOSTS, ["nested more than 32 levels"]),
    ("list-as-key", "? [a]\n: 1\n" + GOOD_HOSTS, [":1:", "mapping key must be a plain value"]),
    ("ten-thousand-digits", "cluster: " + "9" * 10000 + "\n" + GOOD_HOSTS, [":1:", "longer than 100 digits"]),
    ("undefined-alias", "x: *nope\n" + GOOD_HOSTS, ["invalid YAML", "nope"]),
    ("two-documents", GOOD_HOSTS + "---\n" + GOOD_HOSTS, ["invalid YAML", "single document"]),
]


@pytest.mark.parametrize("case_id,text,fragments", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_inventory(tmp_path, case_id, text, fragments, plain_check_cpu):
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    proc, seconds = run_capped("-i", str(path), "inventory", "check")
    assert_one_line(proc, str(path), *fragments)
    assert proc.stdout == ""
    # The old loader took 7 s and 1.1 GB on the seven-level bomb.
    assert seconds < CPU_CAP * plain_check_cpu, (seconds, plain_check_cpu)


@pytest.mark.parametrize("case_id,text,fragments", HOSTILE[:5], ids=[c[0] for c in HOSTILE[:5]])
def test_hostile_profile_file(tmp_path, case_id, text, fragments):
    path = tmp_path / "evil.yaml"
    path.write_text("extends: tp4\n" + text.replace(GOOD_HOSTS, ""))
    proc, _ = run_capped("plan", "--profile", str(path))
    assert_one_line(proc, str(path), *(f for f in fragments if f != ":1:"))


def test_aliases_that_stay_small_still_work_and_keep_lines(tmp_path):
    # Sharing a value through an anchor is fine; an error under it names the line where it is written.
    path = tmp_path / "inventory.yaml"
    path.write_text("defaults:\n  hcas: &h [mlx5_0, mlx5_1]\n" + GOOD_HOSTS +
                    "    hcas: *h\n  - name: b\n    address: 10.0.0.2\n    hcas: *h\n    bogus: 1\n")
    proc, _ = run_capped("-i", str(path), "inventory", "check")
    assert_one_line(proc, f"{path}:11:", "hosts[1].bogus", "unknown field")


def test_huge_inventory_is_refused_at_once(tmp_path, plain_check_cpu):
    # 200,000 hosts, 8.5 MB, with an error on line 3: the old loader took 88 s and 1.4 GB to say so.
    path = tmp_path / "inventory.yaml"
    with path.open("w") as out:
        out.write("hosts:\n  - name: a\n    bogus: 1\n")
        for i in range(200_000):
            out.write(f"  - name: h{i}\n    address: 10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}\n")
    proc, seconds = run_capped("-i", str(path), "inventory", "check")
    assert_one_line(proc, str(path), "256 KiB")
    assert seconds < CPU_CAP * plain_check_cpu, (seconds, plain_check_cpu)  # the old loader: 88 s to say so


def test_symlink_loop_as_inventory(tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    proc, _ = run_capped("-i", str(tmp_path / "a.yaml"), "inventory", "check")
    assert_one_line(proc, "a.yaml", "cannot read", "symbolic links")


def test_inventory_not_utf8(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_bytes(GOOD_HOSTS.encode() + b"cluster: \xff\xfe\n")
    proc, _ = run_capped("-i", str(path), "inventory", "check")
    assert_one_line(proc, str(path), "not UTF-8")


def test_deep_set_value_names_the_option():
    proc, _ = run_capped("plan", "--profile", "tp4", "--set", "engine_args.x=" + "[" * 3000 + "]" * 3000)
    assert_one_line(proc, "--set engine_args.x", "nested more than 32 levels")


def test_second_set_of_a_key_is_the_one_blamed():
    proc, _ = run_capped("plan", "--profile", "tp4", "--set", "tensor_parallel=2", "--set", "tensor_parallel=0")
    assert_one_line(proc, "tensor_parallel", "--set tensor_parallel=0")
    assert "tensor_parallel=2" not in proc.stderr


def test_set_error_above_the_key_is_attributed_to_the_set_not_the_recipe():
    proc, _ = run_capped("plan", "--profile", "tp4", "--set", "colour.of.sky=blue")
    assert_one_line(proc, "colour", "unknown field", "--set colour.of.sky=blue")
    assert "tp4.yaml" not in proc.stderr


def test_set_error_shows_a_secret_masked():
    proc, _ = run_capped("plan", "--profile", "tp4", "--set", "engine_args.API_KEY=sk-hunter2")
    assert_one_line(proc, "engine_args")
    assert "sk-hunter2" not in proc.stderr


@pytest.mark.parametrize("args,code", [
    (["--json", "plan", "--profile", "tp4", "--set", "serving.port=0"], 2),
    (["plan", "--profile", "tp4", "--json", "--set", "serving.port=0"], 2),
    (["plan", "--profile", "tp4", "--json", "--bogus"], 2),
    (["--json", "-i", "/nonexistent/inventory.yaml", "inventory", "check"], 2),
])
def test_json_errors_print_one_error_document(args, code):
    proc, _ = run_capped(*args)
    assert proc.returncode == code, proc.stderr
    document = json.loads(proc.stdout)
    assert document["ok"] is False and document["exit_code"] == code and document["error"]
    assert "Traceback" not in proc.stderr


def test_json_error_document_names_file_line_and_field(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(GOOD_HOSTS + "    colour: red\n")
    proc, _ = run_capped("-i", str(path), "inventory", "check", "--json")
    document = json.loads(proc.stdout)
    assert (document["file"], document["line"], document["field"]) == (str(path), 5, "hosts[0].colour")


def test_control_characters_in_a_key_stay_on_one_line(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(GOOD_HOSTS + '    "bad\\nkey\\r\\u001b[2J": 1\n')
    proc, _ = run_capped("-i", str(path), "inventory", "check")
    assert_one_line(proc, "hosts[0].bad\\nkey\\r\\x1b[2J", "unknown field")
    assert "\x1b" not in proc.stderr


def test_usage_errors_are_one_line():
    proc, _ = run_capped("plan", "--profile", "tp4", "--bogus")
    assert_one_line(proc, "sparkctl plan", "--bogus")


def test_make_checkpoint_onto_an_existing_file(tmp_path):
    target = tmp_path / "model"
    target.write_text("not a folder")
    proc, _ = run_capped("sandbox", "make-checkpoint", str(target))
    assert_one_line(proc, str(target), "not a folder")
    assert target.read_text() == "not a folder"
    proc, _ = run_capped("sandbox", "make-checkpoint", str(target / "below"))
    assert_one_line(proc, str(target / "below"), "Not a directory", code=1)


@pytest.mark.parametrize("field_yaml,field", [
    ("paths:\n  model_dir: /mnt/nvme/a:b\n", "paths.model_dir"),
    ("paths:\n  state_dir: /var/lib/x:ro\n", "paths.state_dir"),
    ("defaults:\n  nvme_path: '/mnt/a,b'\n", "defaults.nvme_path"),
])
def test_colon_in_a_host_path_is_refused_at_inventory_check(tmp_path, field_yaml, field):
    # docker run -v /mnt/nvme/a:b:/model would read "b" as the container path and "/model" as a mode.
    path = tmp_path / "inventory.yaml"
    path.write_text(field_yaml + GOOD_HOSTS)
    proc, _ = run_capped("-i", str(path), "inventory", "check")
    assert_one_line(proc, f"{path}:2:", field, "separator")


def test_a_named_pipe_without_writer_as_inventory_does_not_hang(tmp_path):
    fifo = tmp_path / "inventory.yaml"
    os.mkfifo(fifo)
    proc, _ = run_capped("-i", str(fifo), "inventory", "check", timeout=30)
    assert_one_line(proc, str(fifo), "not a regular file")


def test_deeply_nested_checkpoint_config_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    proc, _ = run_capped("-i", str(REPO / "inventory.example.yaml"), "pack-engram", "-p", "tp4", "-c", str(tmp_path),
                         "--dry-run")
    assert_one_line(proc, str(tmp_path / "config.json"), "nested too deeply")


def test_deeply_nested_safetensors_header_is_named(tmp_path):
    import struct

    from sparkctl.engram.checkpoint_maker import make_checkpoint

    make_checkpoint(tmp_path, vocab_size=500, head_dim=64, files=2, seed=1)
    victim = tmp_path / "model-00001-of-00002.safetensors"
    data = victim.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = ('{"a":' * 50_000 + "1" + "}" * 50_000).encode()
    victim.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + length:])
    proc, _ = run_capped("-i", str(REPO / "inventory.example.yaml"), "pack-engram", "-p", "tp4", "-c", str(tmp_path),
                         "--dry-run")
    assert_one_line(proc, str(victim), "nested too deeply")


def test_render_blames_the_last_set_of_a_key_not_a_recipe_line():
    proc, _ = run_capped("-i", str(REPO / "inventory.example.yaml"), "render", "--profile", "tp4",
                         "--set", "engine_args.convert=auto", "--set", "engine_args.convert=bogus")
    assert_one_line(proc, "engine_args.convert", "--set engine_args.convert=bogus")
    assert not re.search(r"\.yaml:\d+:", proc.stderr), proc.stderr
