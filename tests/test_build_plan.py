"""Image chains as data and the pure build plan: loading, hashing, rendering, `build --dry-run`."""

from __future__ import annotations

import json

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from test_build_support import REPO, copy_chain, run_sparkctl

from sparkctl.errors import ConfigError
from sparkctl.images import inputs as I
from sparkctl.images.chain import load_chain
from sparkctl.images.plan import plan_build

ROOT = "/usr/local/lib/python3.12/dist-packages/vllm"
TP4_REPORT_PATCHES = {  # The TP4 vLLM report §4.3: file -> mount path
    "engram.py": "models/deepseek_v4_1/common/engram.py",
    "model_state.py": "models/deepseek_v4_1/nvidia/model_state.py",
    "weight_utils.py": "model_executor/model_loader/weight_utils.py",
    "attention.py": "models/deepseek_v4_1/attention.py",
    "flashinfer_sparse.py": "models/deepseek_v4_1/nvidia/flashinfer_sparse.py",
    "sparse_swa.py": "v1/attention/backends/mla/sparse_swa.py",
    "sparse_attn_indexer.py": "model_executor/layers/sparse_attn_indexer.py",
}


@pytest.fixture
def chain_copy(tmp_path) -> Path:
    return copy_chain(tmp_path / "sandbox")


# --- the chains as data -------------------------------------------------------------------------


def test_vllm_chain_is_the_tp4_report_chain():
    chain = load_chain("vllm-dsv41")
    assert chain.spec.base.image == "vllm/vllm-openai:nightly-8a728663c1c3eeace834a95f5654fa653cc1998c"
    assert [(l.spec.name, l.tag) for l in chain.layers()] == [
        ("overlay1", "vllm-dsv41:overlay1"), ("overlay3", "vllm-dsv41:overlay3"), ("overlay4", "vllm-dsv41:overlay4"),
        ("overlay5", "vllm-dsv41:overlay5"), ("patch", "vllm-dsv41:latest")]
    assert {p.key: p.dest for p in chain.spec.patches} == TP4_REPORT_PATCHES
    assert chain.spec.package_root == ROOT
    overlay1 = chain.spec.layers[0]
    assert [c.src for c in overlay1.copy_] == ["vllm/vllm/", "build/_C_stable_libtorch.abi3.so", "build/_moe_C_stable_libtorch.abi3.so"]
    variant = chain.spec.variants["engram-mem"]
    assert (variant.tag, sorted(variant.revert)) == ("vllm-dsv41:engram-mem", ["engram.py", "model_state.py", "weight_utils.py"])
    assert [l.spec.name for l in chain.layers("engram-mem")][-2:] == ["patch", "engram-mem"]


def test_sandbox_chain_has_the_same_structure():
    real, sandbox = load_chain("vllm-dsv41"), load_chain("sandbox")
    assert [l.spec.name for l in sandbox.layers("engram-mem")] == [l.spec.name for l in real.layers("engram-mem")]
    assert [l.spec.template for l in sandbox.layers("engram-mem")] == [l.spec.template for l in real.layers("engram-mem")]
    assert {p.key: p.dest for p in sandbox.spec.patches} == TP4_REPORT_PATCHES
    assert sandbox.spec.variants["engram-mem"].revert == real.spec.variants["engram-mem"].revert
    assert sandbox.spec.base.rootfs.busybox and sandbox.final_tag(None) == "sparkctl-sandbox:latest"


def test_profiles_name_their_chain_and_variant():
    from sparkctl.cli.build_cmd import resolve_image

    chain, variant = resolve_image("tp8-300k", None, None)
    assert (chain.name, variant, chain.final_tag(variant)) == ("vllm-dsv41", "engram-mem", "vllm-dsv41:engram-mem")
    chain, variant = resolve_image("tp4", None, None)
    assert (chain.name, variant, chain.final_tag(variant)) == ("vllm-dsv41", None, "vllm-dsv41:latest")
    with pytest.raises(ConfigError, match="builds 'vllm-dsv41:latest'"):
        resolve_image("tp4", None, None, sets=["image.tag=vllm-dsv41:other"])
    with pytest.raises(ConfigError, match="unknown variant 'nope'"):
        resolve_image(None, "sandbox", "nope")
    with pytest.raises(ConfigError, match="not both"):
        resolve_image("tp4", "sandbox", None)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("old, new, message, needle", [
    ("package_root:", "packageroot:", "packageroot: unknown field", "packageroot:"),
    ("revert: [engram.py, weight_utils.py, model_state.py]", "revert: [engram.py,\n      nope.py]",
     "variants.engram-mem.revert[1]: reverts 'nope.py', which is not in the patch manifest", "nope.py]"),
    ("tag: sparkctl-sandbox:overlay4", "tag: sparkctl-sandbox:overlay3", "is used by layers 'overlay3' and 'overlay4'", "- name: overlay4"),
    ("    patches: true\n", "", "the last layer, and only it, applies the patch manifest", "- name: patch"),
    ("{src: vllm/vllm/, dest: .}", "{src: ../vllm/, dest: .}", "must not leave the build context", "../vllm/"),
])
def test_bad_chain_data_is_one_line_with_file_field_and_line(chain_copy, old, new, message, needle):
    path = chain_copy / "chain.yaml"
    text = path.read_text()
    assert old in text
    text = text.replace(old, new)
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_chain(str(chain_copy))
    assert message in str(info.value)
    assert info.value.file == str(path)
    assert info.value.line == _line_of(text, needle), str(info.value)


def test_errors_inside_the_patch_manifest_name_that_file(chain_copy):
    manifest = chain_copy / "patches.yaml"
    text = manifest.read_text().replace("dest: models/deepseek_v4_1/attention.py", "dest: models/deepseek_v4_1/common/engram.py")
    manifest.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_chain(str(chain_copy))
    assert info.value.file == str(manifest) and "duplicate patch destination" in str(info.value)
    assert info.value.line == _line_of(text, "- file: patch/attention.py")
    manifest.write_text(text.replace("- file: patch/engram.py", "- file: patch/engram.py\n  owner: me", 1))
    with pytest.raises(ConfigError) as info:
        load_chain(str(chain_copy))
    assert (info.value.file, info.value.field, info.value.line) == (str(manifest), "[0].owner", _line_of(manifest.read_text(), "owner: me"))


# --- hashing ------------------------------------------------------------------------------------


def _hashes(plan):
    return {layer.name: layer.inputs_hash for layer in plan.layers}


def test_input_hashes_are_stable_and_ignore_mtimes(chain_copy):
    chain = load_chain(str(chain_copy))
    first = plan_build(chain, "engram-mem")
    assert all(h and len(h) == 64 for h in _hashes(first).values()) and first.base.inputs_hash
    os.utime(chain_copy / "patch" / "engram.py", (1, 1))
    os.utime(chain_copy / "vllm" / "vllm" / "__init__.py", (2, 2))
    again = plan_build(load_chain(str(chain_copy)), "engram-mem")
    assert _hashes(again) == _hashes(first) and again.base.inputs_hash == first.base.inputs_hash


def test_changing_one_patch_file_changes_only_the_patch_layer_hash(chain_copy):
    before = _hashes(plan_build(load_chain(str(chain_copy))))
    (chain_copy / "patch" / "attention.py").write_text("PATCHED = True\nREVISION = 2\n")
    after = _hashes(plan_build(load_chain(str(chain_copy))))
    assert [name for name in before if before[name] != after[name]] == ["patch"]


@pytest.mark.parametrize("change, changed", [
    (lambda c: (c / "build" / "_moe_C_stable_libtorch.abi3.so").write_bytes(b"rebuilt"), ["overlay1"]),
    (lambda c: (c / "vllm/vllm/models/deepseek_v4_1/new.py").write_text("x = 1\n"), ["overlay1"]),
    (lambda c: os.chmod(c / "build" / "verify5.sh", 0o644), ["overlay5"]),
    (lambda c: (c / "base/usr/local/lib/python3.12/dist-packages/vllm/__init__.py").write_text("v = 2\n"), []),
    # An original file: overlay1 copies it and the variant puts it back; the patch layer is unaffected.
    (lambda c: (c / "vllm/vllm/models/deepseek_v4_1/common/engram.py").write_text("ORIGIN = 'branch2'\n"), ["overlay1", "engram-mem"]),
])
def test_each_input_reaches_exactly_its_layers_hash(chain_copy, change, changed):
    before = plan_build(load_chain(str(chain_copy)), "engram-mem")
    change(chain_copy)
    after = plan_build(load_chain(str(chain_copy)), "engram-mem")
    assert [n for n, h in _hashes(before).items() if _hashes(after)[n] != h] == changed
    # The base tree is the base's input (its hash, not a layer's).
    assert (before.base.inputs_hash != after.base.inputs_hash) == (changed == [])


def test_build_args_are_hashed_and_overridable(chain_copy):
    chain = load_chain(str(chain_copy))
    base = _hashes(plan_build(chain))
    bigger = plan_build(chain, build_args={"STANDIN_MB": "64"})
    assert bigger.layer("overlay3").args == {"FLASHINFER_VERSION": "0.7.0rc1", "STANDIN_MB": "64"}
    assert [n for n, h in _hashes(bigger).items() if h != base[n]] == ["overlay3"]
    with pytest.raises(ConfigError, match="no layer declares build argument.*NOPE"):
        plan_build(chain, build_args={"NOPE": "1"})


def test_layer_key_binds_the_parent_image():
    assert I.layer_key("a" * 64, "sha256:1") != I.layer_key("a" * 64, "sha256:2")
    assert I.layer_key("a" * 64, "sha256:1") == I.layer_key("a" * 64, "sha256:1")


def test_chain_ids_follow_dockers_rule():
    import hashlib

    diffs = ["sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64]
    ids = I.chain_ids(diffs)
    second = "sha256:" + hashlib.sha256(f"{diffs[0]} {diffs[1]}".encode()).hexdigest()
    assert ids[:2] == [diffs[0], second]
    assert ids[2] == "sha256:" + hashlib.sha256(f"{second} {diffs[2]}".encode()).hexdigest()


def test_context_tar_is_reproducible_and_holds_exactly_the_inputs(chain_copy):
    plan = plan_build(load_chain(str(chain_copy)))
    layer = plan.layer("patch")
    blobs = []
    for _ in range(2):
        buffer = io.BytesIO()
        I.write_tar(layer.context_entries(), buffer)
        blobs.append(buffer.getvalue())
    assert blobs[0] == blobs[1]
    with tarfile.open(fileobj=io.BytesIO(blobs[0])) as tar:
        names = tar.getnames()
        assert tar.extractfile(I.DOCKERFILE_NAME).read().decode() == layer.dockerfile
        assert {m.mtime for m in tar.getmembers()} == {I.FIXED_MTIME}
    # Each patch file at its destination under the placed folder, which the COPY lines copy from.
    assert sorted(n for n in names if n.endswith(".py")) == sorted(f"{I.PLACED_DIR}/{dest}" for dest in TP4_REPORT_PATCHES.values())
    for name, dest in TP4_REPORT_PATCHES.items():
        with tarfile.open(fileobj=io.BytesIO(blobs[0])) as tar:
            assert tar.extractfile(f"{I.PLACED_DIR}/{dest}").read() == (chain_copy / "patch" / name).read_bytes()


def test_labels_ride_in_the_context_dockerfile_as_one_instruction(chain_copy):
    """`--label` flags would be one builder step each (an intermediate container per label): the
    labels are one LABEL instruction, last, and the layer's hash is still that of the plain Dockerfile."""
    plan = plan_build(load_chain(str(chain_copy)))
    layer = plan.layer("overlay3")
    labels = {"org.sparkctl.parent": "sha256:" + "a" * 64, "org.sparkctl.chain": "sandbox", "odd": 'a "b" $c \\d'}
    buffer = io.BytesIO()
    I.write_tar(layer.context_entries(labels), buffer)
    with tarfile.open(fileobj=io.BytesIO(buffer.getvalue())) as tar:
        text = tar.extractfile(I.DOCKERFILE_NAME).read().decode()
    assert text.startswith(layer.dockerfile.rstrip("\n") + "\n")
    assert [line for line in text.splitlines() if line.startswith("LABEL")] == [text.splitlines()[-1]]
    assert text.splitlines()[-1] == ('LABEL "odd"="a \\"b\\" \\$c \\\\d" "org.sparkctl.chain"="sandbox" '
                                     f'"org.sparkctl.parent"="sha256:{"a" * 64}"')
    assert layer.inputs_hash == I.inputs_hash(layer.dockerfile, layer.args, layer.files)
    with pytest.raises(ValueError, match="line break"):
        I.label_instruction({"k": "two\nlines"})


def test_busybox_check_refuses_a_dynamic_binary():
    assert I.is_static_elf(os.path.realpath("/bin/busybox")) or not os.path.exists("/bin/busybox")
    import sys

    assert not I.is_static_elf(os.path.realpath(sys.executable))


# --- rendered Dockerfiles -----------------------------------------------------------------------


def _copies_by_folder(dests) -> list[str]:
    """The COPY lines expected for files placed at ``dests``: one per folder, its files sorted."""
    folders: dict[str, list[str]] = {}
    for dest in sorted(dests):
        folders.setdefault(os.path.dirname(dest), []).append(f"{I.PLACED_DIR}/{dest}")
    return [f"COPY {' '.join(files)} {ROOT}/{folder}/" for folder, files in folders.items()]


def test_patch_and_variant_dockerfiles_match_the_tp4_report_appendix():
    plan = plan_build(load_chain("sandbox"), "engram-mem")
    patch = plan.layer("patch").dockerfile.splitlines()
    assert patch[1] == "FROM sparkctl-sandbox:overlay5"
    # The appendix's seven COPY lines, as one COPY per destination folder of the files placed at their
    # destinations (files, so the image's own folders keep their owner and mode); the manifest is in
    # the Dockerfile, so in the layer's hash.
    assert patch[2:] == [f"# patch/{f} -> {ROOT}/{d}" for f, d in TP4_REPORT_PATCHES.items()] + \
        _copies_by_folder(TP4_REPORT_PATCHES.values()) + ["ENTRYPOINT []"]
    assert len(_copies_by_folder(TP4_REPORT_PATCHES.values())) == 6  # two of the seven share a folder
    variant = plan.layer("engram-mem").dockerfile.splitlines()
    reverted = [TP4_REPORT_PATCHES[f] for f in ("engram.py", "weight_utils.py", "model_state.py")]
    assert variant[1:] == ["FROM sparkctl-sandbox:latest"] + [f"# vllm/vllm/{d} -> {ROOT}/{d}" for d in reverted] + \
        _copies_by_folder(reverted) + ["ENTRYPOINT []"]
    assert sorted(f.arcname for f in plan.layer("engram-mem").files if f.kind == "file") == sorted(
        f"{I.PLACED_DIR}/{TP4_REPORT_PATCHES[f]}" for f in ("engram.py", "weight_utils.py", "model_state.py"))
    overlay1 = plan.layer("overlay1").dockerfile
    # Copies into one folder are one COPY (one builder step, one image layer), in the order given.
    assert (f"COPY vllm/vllm/ build/_C_stable_libtorch.abi3.so build/_moe_C_stable_libtorch.abi3.so {ROOT}/\n"
            in overlay1)
    overlay5 = plan.layer("overlay5").dockerfile
    assert "case \"$out\" in *HIT/HIT*)" in overlay5 and 'out="$(sh /tmp/verify5.sh)"' in overlay5


def _render(chain_copy, **layer) -> str:
    from sparkctl.images.chain import LayerDef, LayerSpec
    from sparkctl.images.plan import render_layer

    spec = LayerSpec(name="probe", template="images/overlay.Dockerfile.j2", **layer)
    return render_layer(load_chain(str(chain_copy)), LayerDef(spec=spec, tag="probe:x", index=0), "probe:base",
                        dict(spec.args))


def _instructions(dockerfile: str) -> list[str]:
    joined = dockerfile.replace("\\\n", "")  # docker's line continuation
    return [line for line in joined.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("fails, expect_exit", [(None, 0), ("first", 7), ("verify", 1)])
def test_the_commands_of_one_run_behave_as_separate_runs(chain_copy, tmp_path, fails, expect_exit):
    """ARG, the copies into one folder, the commands with the verify, ENV: one instruction each (one
    builder step each); a copy to a file path keeps its own line, a later copy to the folder too.
    The layer's commands share one RUN: each still starts in the directory RUN starts in (a cd does
    not leak), a failing one stops the rest with its own status, a comment at a command's end or a
    quote inside it stays its own, and the verify still decides."""
    import subprocess

    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    first = "cd sub && touch one" + (" && exit 7" if fails == "first" else "") + "  # a comment ends it"
    dockerfile = _render(chain_copy, args={"A": "1", "B": "2"}, run=[first, "touch 'two'"],
                         copy=[{"src": "a/", "dest": "/opt/x/"}, {"src": "f", "dest": "/opt/x/"},
                               {"src": "g", "dest": "/opt/x/g.bin"}, {"src": "h", "dest": "/opt/x/"}],
                         verify={"command": "echo MISS" if fails == "verify" else "echo HIT/HIT", "expect": "HIT/HIT"},
                         env={"K": "v", "L": "w"})
    lines = _instructions(dockerfile)
    assert lines[1:5] == ["ARG A B", "COPY a/ f /opt/x/", "COPY g /opt/x/g.bin", "COPY h /opt/x/"]
    assert [line.split(" ", 1)[0] for line in lines] == ["FROM", "ARG", "COPY", "COPY", "COPY", "RUN", "ENV"]
    assert lines[-1] == "ENV K=v L=w"
    run = subprocess.run(["sh", "-c", lines[5][len("RUN "):]], cwd=work, capture_output=True, text=True, timeout=30)
    assert run.returncode == expect_exit, run
    assert (work / "sub" / "one").exists()
    assert (work / "two").exists() == (fails != "first") and not (work / "sub" / "two").exists()
    assert ("verify failed: expected HIT/HIT" in run.stderr) == (fails == "verify")


def test_a_command_in_exec_form_keeps_a_run_of_its_own(chain_copy):
    """A run entry written in exec form is JSON, not shell text that could join the others: every
    command of that layer is then a RUN of its own, as written."""
    dockerfile = _render(chain_copy, run=['["python3", "-c", "print(1)"]', "touch two"])
    assert [line for line in _instructions(dockerfile) if line.startswith("RUN")] == [
        'RUN ["python3", "-c", "print(1)"]', "RUN touch two"]


# --- `build --dry-run` --------------------------------------------------------------------------


def test_dry_run_json_is_the_plan(tmp_path):
    result = run_sparkctl("--json", "build", "--image", "sandbox", "--variant", "engram-mem", "--dry-run")
    assert result.code == 0, result
    doc = result.json()
    assert (doc["image"], doc["image_id"], doc["dry_run"], doc["variant"]) == ("sparkctl-sandbox:engram-mem", None, True, "engram-mem")
    assert [(l["name"], l["tag"], l["parent"], l["cached"]) for l in doc["layers"]] == [
        ("overlay1", "sparkctl-sandbox:overlay1", "sparkctl-sandbox:base", None),
        ("overlay3", "sparkctl-sandbox:overlay3", "sparkctl-sandbox:overlay1", None),
        ("overlay4", "sparkctl-sandbox:overlay4", "sparkctl-sandbox:overlay3", None),
        ("overlay5", "sparkctl-sandbox:overlay5", "sparkctl-sandbox:overlay4", None),
        ("patch", "sparkctl-sandbox:latest", "sparkctl-sandbox:overlay5", None),
        ("engram-mem", "sparkctl-sandbox:engram-mem", "sparkctl-sandbox:latest", None),
    ]
    assert doc["base"]["kind"] == "rootfs" and doc["base"]["tag"] == "sparkctl-sandbox:base"
    assert [t["status"] for t in doc["patch_targets"]] == ["present"] * 7
    assert doc["missing_inputs"] == []
    plan = plan_build(load_chain("sandbox"), "engram-mem")
    assert [l["inputs_hash"] for l in doc["layers"]] == [l.inputs_hash for l in plan.layers]
    # --profile reaches the same chain: the sandbox profile runs sparkctl-sandbox:latest.
    by_profile = run_sparkctl("--json", "build", "--profile", "sandbox", "--dry-run")
    assert by_profile.code == 0, by_profile
    assert by_profile.json()["image"] == "sparkctl-sandbox:latest" and len(by_profile.json()["layers"]) == 5


def test_missing_inputs_are_all_named_and_exit_2_before_anything(chain_copy):
    (chain_copy / "patch" / "sparse_swa.py").unlink()
    (chain_copy / "build" / "_moe_C_stable_libtorch.abi3.so").unlink()
    os.rename(chain_copy / "build" / "overlay4", chain_copy / "build" / "overlay4-old")
    parts = ("overlay1: build/_moe_C_stable_libtorch.abi3.so (not found)", "overlay4: build/overlay4/ (not found)",
             "patch: patch/sparse_swa.py (not found)")
    env = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    result = run_sparkctl("--json", "build", "--image", str(chain_copy), env=env)
    assert result.code == 2, result
    assert json.loads(result.stdout)["error"].startswith("3 build input(s) missing")  # --json: one error document
    message = result.stderr.strip()
    assert message.startswith("error: 3 build input(s) missing"), message
    assert all(part in message for part in parts), message
    assert "Traceback" not in result.stderr
    # --dry-run: the whole plan is the one document, every missing input in it, and still exit 2.
    result = run_sparkctl("--json", "build", "--image", str(chain_copy), "--dry-run", env=env)
    assert result.code == 2, result
    plan = json.loads(result.stdout)
    assert plan["ok"] is False and plan["dry_run"] is True and len(plan["layers"]) == 5
    assert [f"{m['layer']}: {m['path']} ({m['reason']})" for m in plan["missing_inputs"]] == list(parts)
    assert result.stderr.strip().splitlines()[-1].startswith("error: 3 build input(s) missing"), result.stderr
    text = run_sparkctl("build", "--image", str(chain_copy), "--dry-run", env=env)
    assert text.code == 2 and "missing inputs (3;" in text.stdout, text
    assert "Traceback" not in result.stderr + text.stderr


def test_vllm_chain_reports_the_four_patch_targets_the_base_lacks(tmp_path):
    # No build context at all: exit 2, but the patch check against the base listing is still said.
    result = run_sparkctl("build", "--image", "vllm-dsv41", "--dry-run", env={"HOME": str(tmp_path)})
    assert result.code == 2, result
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 4, result.stderr
    assert all("models/deepseek_v4_1/" in w and "deepseek_v41/, not deepseek_v4_1/" in w for w in warnings)
    # The plan (stdout) names the absent context first, then every input it must hold; one error line.
    assert "build context folder not found" in result.stdout.split("missing inputs (16;", 1)[1], result.stdout
    assert result.stderr.splitlines()[-1] == "error: 16 build input(s) missing: pass --context DIR (docs/images.md)"


def _fake_vllm_context(root: Path, with_branch_model: bool) -> Path:
    files = ["vllm/vllm/__init__.py", "build/_C_stable_libtorch.abi3.so", "build/_moe_C_stable_libtorch.abi3.so",
             "build/overlay3/flashinfer.whl", "build/overlay4/cutlass.whl", "build/overlay5/sparse_mla.whl",
             "build/prewarm5.py", "build/verify5.py"] + [f"patch/{name}" for name in TP4_REPORT_PATCHES]
    if with_branch_model:
        files += [f"vllm/vllm/{dest}" for name, dest in TP4_REPORT_PATCHES.items()]
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    return root


@pytest.mark.parametrize("with_branch_model, statuses", [
    (False, {"present": 3, "missing": 4}),
    (True, {"present": 7}),
])
def test_vllm_dry_run_with_a_context(tmp_path, with_branch_model, statuses):
    context = _fake_vllm_context(tmp_path / "ctx", with_branch_model)
    result = run_sparkctl("--json", "build", "--image", "vllm-dsv41", "--dry-run", "--context", str(context))
    assert result.code == 0, result
    doc = result.json()
    counts = {}
    for target in doc["patch_targets"]:
        counts[target["status"]] = counts.get(target["status"], 0) + 1
    assert counts == statuses
    if with_branch_model:
        assert {t["seen_in"] for t in doc["patch_targets"]} == {"layer overlay1"}
    else:
        present = sorted(t["name"] for t in doc["patch_targets"] if t["status"] == "present")
        assert present == ["sparse_attn_indexer.py", "sparse_swa.py", "weight_utils.py"]
    assert doc["layers"][0]["dockerfile"].splitlines()[1:3] == [
        "# Rendered by `sparkctl build`; every input below is hashed into the image label org.sparkctl.inputs.",
        "FROM vllm/vllm-openai:nightly-8a728663c1c3eeace834a95f5654fa653cc1998c"]


def test_usage_errors_exit_2():
    assert run_sparkctl("build", "--dry-run").code == 2
    result = run_sparkctl("build", "--image", "nope", "--dry-run")
    assert result.code == 2 and "unknown image chain 'nope'" in result.stderr
    result = run_sparkctl("build", "--image", "sandbox", "--dry-run", "--build-arg", "STANDIN_MB")
    assert result.code == 2 and "--build-arg expects KEY=VALUE" in result.stderr


def test_help_stays_light():
    import subprocess
    import sys

    code = ("import sys; from sparkctl.cli import build_cmd; "
            "print(','.join(m for m in ('docker', 'paramiko', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == ""
