"""The pure half of pack-engram's execution: argv lists sent to hosts, df parsing, and the
skip / resume / replace decision from what a host reports."""

from __future__ import annotations

import subprocess

import pytest

from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.engram.config import load_engram_config
from sparkctl.engram.layout import plan_layout
from sparkctl.engram.safetensors_index import is_engram_tensor, load_tensors
from sparkctl.engram.shards import plan_shards
from sparkctl.ops.engram import (REPLACE, RESUME, SKIP, WRITE, decide, free_space_argv, host_argv, host_program,
                                 parse_df_avail)


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    make_checkpoint(folder, vocab_size=200, n_heads=2, files=2)
    config = load_engram_config(folder)
    tensors = load_tensors(folder, lambda n: is_engram_tensor(n, config.layer_ids))
    return plan_shards(plan_layout(config, 2), tensors, str(folder.resolve()))[1]


def test_host_argv_is_a_list_with_the_program_as_one_element():
    argv = host_argv("receive", "/mnt/nvme/engram dir", '{"file": "x"}', "0")
    assert argv[:2] == ["python3", "-c"] and argv[2] == host_program()
    assert argv[3:] == ["receive", "/mnt/nvme/engram dir", '{"file": "x"}', "0"]


def test_the_host_program_imports_only_the_standard_library_and_optionally_xxhash_and_numpy():
    """A bare host's python3 runs it: beyond the standard library only xxhash and numpy, and every
    import of them sits in a ``try`` that catches ImportError (the fallback is tested in
    test_engram_packed and by the stock-python cut)."""
    import ast
    import sys

    optional = {"xxhash", "numpy"}
    tree = ast.parse(host_program())
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                guarded.update(id(n) for n in ast.walk(stmt))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        else:
            continue
        imported |= names
        foreign = names - set(sys.stdlib_module_names)
        assert foreign <= optional, f"line {node.lineno}: imports {sorted(foreign)}"
        assert not foreign or id(node) in guarded, f"line {node.lineno}: {sorted(foreign)} not under try/except ImportError"
    assert imported - set(sys.stdlib_module_names) == optional


def _catches_import_error(handler) -> bool:
    import ast

    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in ("ImportError", "ModuleNotFoundError") for k in kinds)


def test_free_space_argv_reports_the_nearest_existing_parent(tmp_path):
    argv = free_space_argv(str(tmp_path / "not" / "yet" / "there"))
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", str(tmp_path / "not" / "yet" / "there")]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    import os

    st = os.statvfs(tmp_path)
    assert abs(parse_df_avail(proc.stdout) - st.f_bavail * st.f_frsize) < 64 * 2**20


def test_parse_df_avail():
    assert parse_df_avail("    Avail\n123456789\n") == 123456789
    with pytest.raises(ValueError, match="unexpected df output"):
        parse_df_avail("df: /x: No such file or directory\n")


def test_decide(shard):
    spec = shard.spec()
    manifest = dict(spec, sha256="00", xxh3_128=None)
    assert decide(shard, None).action == WRITE
    complete = {"final": shard.size, "manifest": manifest, "verified": True}
    assert decide(shard, complete).action == SKIP
    # Complete-looking but failing the re-hash: rewritten, never skipped.
    assert decide(shard, dict(complete, verified=False, verify_detail="corrupt: sha256")).action == REPLACE
    # A manifest of another plan (other rows) or a file of the wrong size: rewritten.
    assert decide(shard, dict(complete, manifest=dict(manifest, rows=[0, 1]))).action == REPLACE
    assert decide(shard, dict(complete, final=shard.size - 1)).action == REPLACE
    partial = {"partial": 1000, "partial_spec": spec}
    action = decide(shard, partial)
    assert (action.action, action.offset, action.bytes_needed) == (RESUME, 1000, shard.size - 1000)
    assert decide(shard, partial, can_resume=False).action == WRITE
    assert decide(shard, dict(partial, partial_spec=dict(spec, tp=8))).action == WRITE
    assert decide(shard, dict(partial, partial=shard.size + 1)).action == WRITE
