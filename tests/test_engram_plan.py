"""The pure half of pack-engram's execution: argv lists sent to hosts, df parsing, and the
skip / resume / replace decision from what a host reports."""

from __future__ import annotations

import json
import subprocess

import pytest

from sparkctl.engram.checkpoint_maker import make_checkpoint
from sparkctl.engram.config import load_engram_config
from sparkctl.engram.layout import plan_layout
from sparkctl.engram.safetensors_index import is_engram_tensor, load_tensors
from sparkctl.engram.shards import plan_shards
from sparkctl.commands.probes import free_space_argv
from sparkctl.ops.engram import (HOST_MODULES, REPLACE, RESUME, SKIP, WRITE, decide, host_program,
                                 parse_df_avail)


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    make_checkpoint(folder, vocab_size=200, n_heads=2, files=2)
    config = load_engram_config(folder)
    tensors = load_tensors(folder, lambda n: is_engram_tensor(n, config.layer_ids))
    return plan_shards(plan_layout(config, 2), tensors, str(folder.resolve()))[1]


class _Recording:
    """This machine as the host (its own python3), keeping every argv run on it."""

    def __init__(self):
        from sparkctl.remote.process import local

        self.inner, self.argvs = local(), []
        self.name = self.inner.name

    def run(self, argv, **kwargs):
        self.argvs.append(list(argv))
        return self.inner.run(argv, **kwargs)

    def run_stream_in(self, argv, chunks, **kwargs):
        self.argvs.append(list(argv))
        return self.inner.run_stream_in(argv, chunks, **kwargs)

    def shipped(self) -> list[str]:
        """The host programs run: each ``python3 /tmp/sparkctl-engram.XXXXXX/engram.pyz OP ...``."""
        return [a[1] for a in self.argvs if a[0] == "python3" and a[1].endswith("/engram.pyz")]


def test_each_run_of_the_host_program_is_shipped_and_leaves_nothing_behind(tmp_path):
    """Through the transport's ``ship_agent``: a zip in its own temporary folder, which the program
    removes when it ends."""
    import os

    from sparkctl.ops.engram import _host_json

    host = _Recording()
    answer = _host_json(host, "probe", {"dest": str(tmp_path / "engram dir"), "names": ["engram-l1-r0of2.bin"]})
    assert answer["shards"]["engram-l1-r0of2.bin"]["final"] is None
    (path,) = host.shipped()
    assert os.path.basename(os.path.dirname(path)).startswith("sparkctl-engram.")
    assert host.argvs[-1][2:] == ["probe"] and not os.path.exists(os.path.dirname(path))


def test_the_first_look_is_one_run_of_the_host_program_that_rehashes_only_the_complete_shards(tmp_path_factory, tmp_path):
    """pack-engram's look at a host (``_probe``): the listing and the re-hash of the shards that look
    complete are one python3 run, not one each; a corrupted shard is found, and a shard of another
    plan (or still partial) is not re-hashed (it is rewritten anyway)."""
    from sparkctl.ops.engram import _host_json, _probe

    folder = tmp_path_factory.mktemp("ckpt4")
    make_checkpoint(folder, vocab_size=200, n_heads=2, files=2)
    config = load_engram_config(folder)
    tensors = load_tensors(folder, lambda n: is_engram_tensor(n, config.layer_ids))
    good, bad, other, absent = plan_shards(plan_layout(config, 2), tensors, str(folder.resolve()))[:4]
    dest = tmp_path / "engram"  # cut by the host program: hashed with what the host's python3 has
    _host_json(_Recording(), "cut", {"root": good.root, "dest": str(dest), "specs": [s.spec() for s in (good, bad, other)]})
    with open(dest / bad.name, "r+b") as handle:  # same size, one byte flipped
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 0xFF]))
    (dest / (other.name[:-4] + ".json")).write_text(json.dumps(dict(other.spec(), rows=[0, 1])))  # another plan's
    host = _Recording()
    state = _probe(host, str(dest), [good, bad, other, absent])
    assert len(host.shipped()) == 1 and [a[2] for a in host.argvs if a[0] == "python3"] == ["probe"]
    assert state["avail"] > 0 and "verified" not in state
    assert state["shards"][good.name]["verified"] is True, state["shards"][good.name]["verify_detail"]
    assert state["shards"][bad.name]["verified"] is False
    assert state["shards"][bad.name]["verify_detail"].startswith("corrupt: ")
    assert "verified" not in state["shards"][other.name] and "verified" not in state["shards"][absent.name]
    assert [decide(s, state["shards"][s.name]).action for s in (good, bad, other, absent)] == [SKIP, REPLACE, REPLACE, WRITE]


def test_a_failing_python3_fails_the_look_with_its_own_message_never_an_empty_engram_dir(tmp_path, shard):
    """The host's python3 fails (a broken interpreter): the look is that error, not "no shards there"."""
    from sparkctl.ops.engram import _probe, _RemoteFailure

    broken = tmp_path / "python3"
    broken.write_text("#!/bin/sh\necho 'Fatal Python error: init_fs_encoding: failed to get the Python codec' >&2\nexit 1\n")
    broken.chmod(0o755)

    class BrokenPython(_Recording):
        def run(self, argv, **kwargs):
            return super().run([str(broken), *argv[1:]] if argv[0] == "python3" else argv, **kwargs)

    with pytest.raises(_RemoteFailure, match="^probe: Fatal Python error: init_fs_encoding"):
        _probe(BrokenPython(), str(tmp_path / "engram"), [shard])


def test_a_shipped_receiver_whose_input_ends_early_keeps_the_partial_and_removes_its_folder(shard, tmp_path):
    """The sender is gone (pack-engram killed): the partial stays for a resume, the shipped program's
    folder does not stay behind in /tmp."""
    import json
    import os

    from sparkctl.engram.hostside import EXIT_SHORT
    from sparkctl.ops.engram import _run_host

    host, dest = _Recording(), tmp_path / "engram"
    result = _run_host(host, "receive", str(dest), json.dumps(shard.spec()), "0", chunks=[b"x" * 1000], timeout=60)
    assert result.exit_code == EXIT_SHORT, result.stderr
    (path,) = host.shipped()
    assert not os.path.exists(os.path.dirname(path))
    assert (dest / (shard.name + ".partial")).stat().st_size == 1000


def test_the_host_program_imports_only_the_standard_library_and_optionally_xxhash_and_numpy():
    """A bare host's python3 runs it: beyond the standard library only xxhash and numpy, and every
    import of them sits in a ``try`` that catches ImportError (the fallback is tested in
    test_engram_packed and by the stock-python cut)."""
    import ast
    import importlib
    import io
    import zipfile

    optional = {"xxhash", "numpy"}
    with zipfile.ZipFile(io.BytesIO(host_program())) as archive:
        shipped = set(archive.namelist())
    assert {m.replace(".", "/") + ".py" for m in HOST_MODULES} <= shipped
    for module in HOST_MODULES:
        with open(importlib.import_module(module).__file__, encoding="utf-8") as handle:
            _assert_stdlib_or_optional(ast.parse(handle.read()), optional if module.endswith("hostside") else set())


def _assert_stdlib_or_optional(tree, optional: set) -> None:
    """Every import is of the standard library, of the zip itself, or optional under try/except ImportError."""
    import ast
    import sys

    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                guarded.update(id(n) for n in ast.walk(stmt))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            full = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            full = {node.module or ""}
        else:
            continue
        names = {n.split(".")[0] for n in full if n not in HOST_MODULES}  # the zip's own modules are there
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
