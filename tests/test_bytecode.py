"""Byte code shipped with what starts Python many times (sparkctl/bytecode.py): the zipped agents'
pycs are the ones their python3 loads, a python3 with another magic number falls back to the
sources, and the stand-in image's interpreter loads the image's pycs instead of compiling."""

from __future__ import annotations

import glob
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import rootfs_once
from sparkctl import bytecode
from sparkctl.images.relay import relay_zip
from sparkctl.ops.engram import HOST_MODULES

# Run inside the interpreter under test: import the modules named in argv[1:] (JSON list) with an
# audit hook that records every compile() (importlib compiles a source through it), then print
# what was compiled and where each module's code came from.
IMPORTS_WATCHED = r"""
import importlib, json, sys
compiled = []
sys.addaudithook(lambda event, args: compiled.append(str(args[1])) if event == "compile" else None)
names = json.loads(sys.argv[1])
sys.path[:0] = json.loads(sys.argv[2])
for name in names:
    importlib.import_module(name)
print(json.dumps({"compiled": compiled,
                  "files": {n: sys.modules[n].__file__ for n in names},
                  "cached": {n: getattr(sys.modules[n], "__cached__", None) for n in names}}))
"""


def watched_imports(python: str, names: list[str], path: list[str], env: dict | None = None) -> dict:
    done = subprocess.run([python, "-B", "-I", "-c", IMPORTS_WATCHED, json.dumps(names), json.dumps(path)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def other_magic(magic: bytes) -> bytes:
    """A magic number of another Python version (the next one up)."""
    return (int.from_bytes(magic[:2], "little") + 50).to_bytes(2, "little") + magic[2:]


def with_magic(program: bytes, magic: bytes) -> bytes:
    """The zip with every pyc's magic number replaced."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(program)) as old, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            data = old.read(info)
            new.writestr(info, magic + data[4:] if info.filename.endswith(".pyc") else data)
    return out.getvalue()


def run_probe(python: str, program: bytes, folder: Path) -> dict:
    """The engram host program's ``probe`` operation, run as a host runs it (it removes its folder)."""
    folder.mkdir()
    (folder / "engram.pyz").write_bytes(program)
    request = json.dumps({"dest": str(folder.parent / "engram"), "names": ["engram-l0-r0of1.bin"]}).encode()
    done = subprocess.run([python, str(folder / "engram.pyz"), "probe"], input=request, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout.decode().splitlines()[-1])


HOST_NAMES = list(HOST_MODULES)


def test_an_agent_zip_carries_a_pyc_beside_each_source(tmp_path):
    with zipfile.ZipFile(io.BytesIO(relay_zip(HOST_MODULES, "sparkctl.engram.hostside"))) as archive:
        names = set(archive.namelist())
        pycs = {n for n in names if n.endswith(".pyc")}
        assert {n[:-1] for n in pycs} <= names  # never a pyc without its source
        assert {"sparkctl/engram/hostside.pyc", "sparkctl/images/orphan.pyc", "__main__.pyc"} <= pycs
        header = archive.read("sparkctl/engram/hostside.pyc")[:16]
        source = archive.read("sparkctl/engram/hostside.py")
    assert header[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(header[4:8], "little") == 0b01  # hash-based, unchecked: the zip is one piece
    assert header[8:16] == importlib.util.source_hash(source)
    with zipfile.ZipFile(io.BytesIO(relay_zip(HOST_MODULES, "sparkctl.engram.hostside", bytecode=False))) as bare:
        assert not [n for n in bare.namelist() if n.endswith(".pyc")]


def test_the_agent_zip_is_loaded_from_its_pycs_not_compiled(tmp_path):
    zipped = tmp_path / "agent.pyz"
    zipped.write_bytes(relay_zip(HOST_MODULES, "sparkctl.engram.hostside"))
    seen = watched_imports(sys.executable, HOST_NAMES, [str(zipped)])
    assert all(f.startswith(str(zipped)) for f in seen["files"].values())
    assert not [c for c in seen["compiled"] if "sparkctl" in c]
    bare = tmp_path / "bare.pyz"
    bare.write_bytes(relay_zip(HOST_MODULES, "sparkctl.engram.hostside", bytecode=False))
    compiled = watched_imports(sys.executable, HOST_NAMES, [str(bare)])["compiled"]
    assert {f"{bare}/sparkctl/engram/hostside.py", f"{bare}/sparkctl/images/orphan.py"} <= set(compiled)


def test_a_python_with_another_magic_number_runs_the_agent_from_its_sources(tmp_path):
    program = relay_zip(HOST_MODULES, "sparkctl.engram.hostside")
    mismatched = with_magic(program, other_magic(importlib.util.MAGIC_NUMBER))
    zipped = tmp_path / "agent.pyz"
    zipped.write_bytes(mismatched)
    compiled = watched_imports(sys.executable, HOST_NAMES, [str(zipped)])["compiled"]
    assert {f"{zipped}/sparkctl/engram/hostside.py", f"{zipped}/sparkctl/images/orphan.py"} <= set(compiled)
    expected = run_probe(sys.executable, program, tmp_path / "with-pycs")
    assert run_probe(sys.executable, mismatched, tmp_path / "fallback") == expected
    assert expected["shards"]["engram-l0-r0of1.bin"]["final"] is None


def _other_python() -> str | None:
    """An installed python3 of another minor version (a host's, e.g. Ubuntu's 3.12 on a Spark)."""
    mine = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-9]*/bin/python3.1*"))):
        if not candidate.endswith(mine) and os.access(candidate, os.X_OK) and candidate[-4:].replace(".", "").isdigit():
            return candidate
    return None


@pytest.mark.skipif(_other_python() is None, reason="no python3 of another minor version on this machine")
def test_a_real_python_of_another_version_runs_the_agent(tmp_path):
    program = relay_zip(HOST_MODULES, "sparkctl.engram.hostside")
    other = _other_python()
    answer = run_probe(other, program, tmp_path / "agent")
    assert answer["shards"]["engram-l0-r0of1.bin"] == run_probe(sys.executable, program, tmp_path / "mine")["shards"]["engram-l0-r0of1.bin"]
    assert answer["python"] != "%d.%d.%d" % sys.version_info[:3]


# ------------------------------------------------------------------------------------- the image


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    """The stand-in rootfs (the real maker's bytes, once a process) unpacked in a folder."""
    folder = tmp_path_factory.mktemp("standin-rootfs")
    report = rootfs_once.write_rootfs_tar(folder / "standin.tar")
    root = folder / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(folder / "standin.tar")], check=True, timeout=120)
    return report, root


@pytest.mark.integration
def test_the_images_interpreter_loads_its_pycs_and_compiles_nothing(unpacked):
    """Run chroot-free: the interpreter finds its standard library beside itself (root/usr/lib/...)."""
    report, root = unpacked
    python = str(root) + report.python
    site = str(root) + report.site_packages
    names = ["sparkctl_standin.cli", "sparkctl_standin.server", "sparkctl_standin.surface", "sglang.launch_server",
             "argparse", "json", "http.server", "email.parser"]
    seen = watched_imports(python, names, [site], env={"PATH": "/usr/bin:/bin"})
    assert all(f.startswith(str(root)) for f in seen["files"].values()), seen["files"]
    assert [c for c in seen["compiled"] if c.endswith(".py")] == []  # ('<string>': dataclasses' and namedtuple's exec)
    for name, cached in seen["cached"].items():
        assert cached and cached.startswith(str(root)) and os.path.isfile(cached), name


def source_hashes(python: str, paths: list[str]) -> list[bytes]:
    """``importlib.util.source_hash`` of each file as ``python`` computes it (its magic number is the key)."""
    program = ("import importlib.util, json, sys\n"
               "print(json.dumps([importlib.util.source_hash(open(p, 'rb').read()).hex() for p in json.loads(sys.argv[1])]))")
    done = subprocess.run([python, "-I", "-c", program, json.dumps(paths)], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return [bytes.fromhex(h) for h in json.loads(done.stdout)]


@pytest.mark.integration
def test_every_pyc_in_the_image_is_checked_against_the_source_beside_it(unpacked):
    """Checked hashes: a later layer that replaces a .py is what runs, whatever its time and size."""
    report, root = unpacked
    pycs = sorted(root.rglob("*.pyc"))
    assert len(pycs) > 50
    sources = [pyc.parent.parent / (pyc.name.split(".")[0] + ".py") for pyc in pycs]
    assert all(pyc.parent.name == "__pycache__" for pyc in pycs)
    expected = source_hashes(str(root) + report.python, [str(s) for s in sources])
    for pyc, source_hash in zip(pycs, expected):
        header = pyc.read_bytes()[:16]
        assert int.from_bytes(header[4:8], "little") == 0b11, pyc
        assert header[8:16] == source_hash, pyc
    site = Path(str(root) + report.site_packages)
    assert (site / "sparkctl_standin" / "__pycache__").is_dir() and (site / "sglang" / "__pycache__").is_dir()
    assert not list((site / "sparkctl_standin").glob("__pycache__/rootfs.*"))  # never imported in the image


# ------------------------------------------------------------------------------ the pyc sets' cache


def _package(folder: Path, value: int, head: str = "import json\n") -> Path:
    (folder / "demo").mkdir(parents=True, exist_ok=True)
    (folder / "demo" / "__init__.py").write_text("")
    (folder / "demo" / "mod.py").write_text(f"{head}VALUE = {value}\n")
    return folder


def _made(python: str, site: Path, out: Path, cache: Path | None, also: set[str] = frozenset()) -> dict[str, bytes]:
    import json as json_module

    out.mkdir(exist_ok=True)
    shipped = {"/site/demo/__init__.py", "/site/demo/mod.py", json_module.__file__, *also}
    pycs = bytecode.image_pycs(python, str(out), places=[(str(site), "/site")], imports=["demo.mod"],
                               shipped=shipped, cache=str(cache) if cache else None)
    return {pyc: Path(made).read_bytes() for pyc, made in pycs}


def test_a_pyc_set_is_kept_and_made_again_when_a_source_changes(tmp_path, monkeypatch):
    import json as json_module
    import marshal

    site, cache = _package(tmp_path / "site", 1), tmp_path / "cache"
    first = _made(sys.executable, site, tmp_path / "out1", cache)
    mod_pyc = importlib.util.cache_from_source("/site/demo/mod.py")
    assert set(first) == {importlib.util.cache_from_source(p) for p in ("/site/demo/__init__.py", "/site/demo/mod.py",
                                                                        json_module.__file__)}
    assert first == _made(sys.executable, site, tmp_path / "cold", None)  # the same bytes, cached or not

    def no_interpreter(*args, **kwargs):
        raise AssertionError("the kept set should have been used")

    monkeypatch.setattr(bytecode.subprocess, "run", no_interpreter)
    assert _made(sys.executable, site, tmp_path / "out2", cache) == first
    monkeypatch.undo()

    _package(site, 2)  # the same size and, within the clock's step, the same time: only the content differs
    second = _made(sys.executable, site, tmp_path / "out3", cache)
    source = (site / "demo" / "mod.py").read_bytes()
    assert second[mod_pyc] != first[mod_pyc] and second[mod_pyc][8:16] == importlib.util.source_hash(source)
    scope: dict = {}
    exec(marshal.loads(second[mod_pyc][16:]), scope)
    assert scope["VALUE"] == 2
    assert len([e for e in cache.iterdir() if not e.name.startswith(".")]) == 2


@pytest.mark.integration
def test_a_changed_standin_source_changes_the_rootfs_tar_and_its_pyc(unpacked, tmp_path, monkeypatch):
    """The image plan keys the base on the tar's digest: a changed engine must change it."""
    from sparkctl.images import inputs
    from sparkctl.standin import rootfs

    report, root = unpacked
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # this changed set stays out of the user's cache
    real = rootfs._standin_files()
    changed = tmp_path / "server.py"
    changed.write_bytes(Path(real["sparkctl_standin/server.py"]).read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(rootfs, "_standin_files", lambda: {**real, "sparkctl_standin/server.py": str(changed)})
    again = rootfs.write_rootfs_tar(tmp_path / "changed.tar")
    assert inputs.file_digest(again.path) != inputs.file_digest(report.path)
    folder = f"{report.site_packages}/sparkctl_standin/__pycache__/".lstrip("/")
    with tarfile.open(again.path) as tar:  # the image's cache tag, whichever python3 it is
        pyc = next(n for n in tar.getnames() if n.startswith(folder + "server.") and n.endswith(".pyc"))
        header = tar.extractfile(pyc).read()[:16]
    assert header[8:16] == source_hashes(report.python, [str(changed)])[0]


def test_the_cache_keeps_the_recent_sets_and_prunes_only_idle_ones(tmp_path):
    now = os.stat(tmp_path).st_mtime

    def aged(name: str, age: float) -> None:
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (now - age, now - age))

    for number in range(bytecode.CACHE_KEEP + 3):
        # the CACHE_KEEP most recent; one beyond them used within the hour (kept); the rest idle
        age = number if number < bytecode.CACHE_KEEP else bytecode.CACHE_IDLE_S / 2 if number == bytecode.CACHE_KEEP \
            else bytecode.CACHE_IDLE_S * 2 + number
        aged(f"set{number:02d}", age)
    aged(".partial-x", 0)  # another command's set being made
    aged(".partial-killed", bytecode.CACHE_IDLE_S * 2)  # a make killed midway, long ago
    bytecode._prune(str(tmp_path))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".partial-x"] + [f"set{n:02d}" for n in range(bytecode.CACHE_KEEP + 1)]


def test_a_module_in_the_working_folder_changes_nothing(tmp_path, monkeypatch):
    """The finder's import path holds no folder of the user's: a glob.py where sparkctl runs is not
    imported in place of the image's own, which keeps its pyc."""
    import glob as glob_module

    site = _package(tmp_path / "site", 1, head="import json\nimport glob\n")
    also = {glob_module.__file__}
    clean = _made(sys.executable, site, tmp_path / "clean", None, also)
    assert importlib.util.cache_from_source(glob_module.__file__) in clean
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "glob.py").write_text("VALUE = 'the working folder'\n")
    (tmp_path / "work" / "json.py").write_text("raise ImportError('the working folder')\n")
    monkeypatch.chdir(tmp_path / "work")
    assert _made(sys.executable, site, tmp_path / "cwd", None, also) == clean


def test_a_stale_timestamp_cache_file_is_never_shipped(tmp_path):
    """A timestamp pyc matches its source on time and size only: one of other code beside a source
    of the same size and time is compiled afresh, not re-headed as that source's."""
    import marshal

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "stale.py").write_text("VALUE = 1\n")
    old = b"VALUE = 2\n"
    st = os.stat(lib / "stale.py")
    cached = Path(importlib.util.cache_from_source(str(lib / "stale.py")))
    cached.parent.mkdir()
    cached.write_bytes(importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                       + len(old).to_bytes(4, "little") + marshal.dumps(compile(old, str(lib / "stale.py"), "exec")))
    site = _package(tmp_path / "site", 1, head=f"import sys\nsys.path.append({str(lib)!r})\nimport stale\n")
    made = _made(sys.executable, site, tmp_path / "out", None, {str(lib / "stale.py")})
    pyc = made[str(cached)]
    assert pyc[8:16] == importlib.util.source_hash(b"VALUE = 1\n")
    scope: dict = {}
    exec(marshal.loads(pyc[16:]), scope)
    assert scope["VALUE"] == 1


def test_a_module_printing_as_it_is_imported_still_gets_its_pyc(tmp_path):
    site = _package(tmp_path / "site", 1, head="import json\nprint('hello from an import')\n")
    made = _made(sys.executable, site, tmp_path / "out", None)
    assert importlib.util.cache_from_source("/site/demo/mod.py") in made
    assert not (tmp_path / "out" / bytecode.ANSWER).exists()


def test_an_agent_pyc_keeps_its_asserts_under_an_optimizing_python(tmp_path):
    """zip_pyc compiles at optimize 0, whatever -O the control process runs with."""
    program = ("import marshal, sys\nfrom sparkctl.bytecode import zip_pyc\n"
               "sys.stdout.buffer.write(zip_pyc(b'assert False, \"kept\"\\n', 'agent.py'))")
    done = subprocess.run([sys.executable, "-O", "-c", program], capture_output=True, timeout=60,
                          cwd=str(Path(bytecode.__file__).parent.parent))
    assert done.returncode == 0, done.stderr.decode()
    import marshal

    with pytest.raises(AssertionError, match="kept"):
        exec(marshal.loads(done.stdout[16:]), {})
