"""`sparkctl build` for real, on a throwaway Docker engine started on this machine (no mocks).

The tests run in order on one engine and one copy of the sandbox chain: a full build, a rebuild
that skips everything, a patch change that rebuilds only the patch layer (and the variant above
it), pruning, and the checks that make a build fail (verify, ENTRYPOINT, patch destinations).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from test_build_support import copy_chain, local_dockerd_fixture, run_sparkctl

from sparkctl.images import inputs as I
from sparkctl.images.chain import load_chain
from sparkctl.images.plan import plan_build
from sparkctl.ops.build import LABEL_CHAIN, LABEL_CONTENT, LABEL_INPUTS, LABEL_LAYER, LABEL_PARENT

pytestmark = pytest.mark.integration  # a private dockerd builds the images

ROOT = "/usr/local/lib/python3.12/dist-packages/vllm"
LAYERS = ["overlay1", "overlay3", "overlay4", "overlay5", "patch"]


@pytest.fixture(scope="session")
def local_dockerd(request):
    return local_dockerd_fixture(request)


@pytest.fixture(scope="module")
def chain_dir(tmp_path_factory) -> Path:
    return copy_chain(tmp_path_factory.mktemp("chain") / "sandbox")


@pytest.fixture(scope="module")
def docker(local_dockerd):
    client = local_dockerd.client()
    yield client
    client.close()


def build(local_dockerd, *args: str):
    return run_sparkctl("--json", "build", *args, env=local_dockerd.env())


def cat(docker, image: str, path: str) -> str:
    return docker.containers.run(image, ["cat", path], remove=True, network_mode="none").decode()


NEXT = "\n--- next command ---\n"


def outputs(docker, image: str, *commands: str) -> list[str]:
    """What each shell command printed, all run by one container in ``image`` (a container's start
    and removal cost the engine far more than the commands); the first that fails fails the run."""
    script = "set -e\n" + f"\nprintf '{NEXT.encode('unicode_escape').decode()}'\n".join(commands)
    printed = docker.containers.run(image, ["-c", script], entrypoint=["/bin/sh"], remove=True,
                                    network_mode="none").decode()
    parts = printed.split(NEXT)
    assert len(parts) == len(commands), printed[-2000:]
    return parts


def ids(doc) -> dict[str, str]:
    return {layer["name"]: layer["image_id"] for layer in doc["layers"]}


@pytest.fixture(scope="module")
def first_build(local_dockerd, chain_dir):
    result = build(local_dockerd, "--image", str(chain_dir), "--variant", "engram-mem")
    assert result.code == 0, result
    return result.json()


def test_build_reads_the_engine_surface_from_the_image(first_build):
    """After the build, the engine's surface is read from the image itself (its python3, no GPU,
    no network) and kept by image ID for render/serve/doctor."""
    from sparkctl.images import surface

    doc = first_build
    assert doc["surfaces"] == {"vllm": "vllm 0.33.0 (435 options, 318 variables)",
                               "sglang": "sglang 0.5.23 (559 options, 763 variables)"}
    read = surface.load(doc["image_id"], "vllm")
    assert read["tags"] == ["sparkctl-sandbox:engram-mem"] and read["reader"] == "sparkctl stand-in"
    assert read["package_root"] == ROOT
    # the package layout shows where the TP4 vLLM report's patches landed: beside the release's model folder
    assert "models/deepseek_v4_1/attention.py" in read["layout"]
    assert "models/deepseek_v41/model.py" in read["layout"]


def test_full_build_labels_every_layer_with_its_input_hash(first_build, chain_dir, docker, local_dockerd):
    doc = first_build
    assert set(doc) == {"image", "image_id", "layers", "surfaces"}
    assert doc["image"] == "sparkctl-sandbox:engram-mem"
    assert [(l["name"], l["cached"]) for l in doc["layers"]] == [(n, False) for n in LAYERS + ["engram-mem"]]
    assert all(set(l) == {"name", "image_id", "cached"} for l in doc["layers"])
    plan = plan_build(load_chain(str(chain_dir)), "engram-mem")
    base = docker.images.get("sparkctl-sandbox:base")
    assert base.labels[LABEL_INPUTS] == plan.base.inputs_hash
    parent = base.id
    for layer_plan, layer in zip(plan.layers, doc["layers"]):
        image = docker.images.get(layer["image_id"])
        assert layer_plan.tag in image.tags
        assert image.labels[LABEL_PARENT] == parent
        assert image.labels[LABEL_CONTENT] == layer_plan.inputs_hash
        assert image.labels[LABEL_INPUTS] == I.layer_key(layer_plan.inputs_hash, parent)
        assert (image.labels[LABEL_LAYER], image.labels[LABEL_CHAIN]) == (layer_plan.name, "sandbox")
        parent = image.id
    assert doc["image_id"] == parent


def test_final_images_have_the_patches_and_an_empty_entrypoint(first_build, docker):
    for tag in ("sparkctl-sandbox:latest", "sparkctl-sandbox:engram-mem"):
        assert docker.images.get(tag).attrs["Config"]["Entrypoint"] in (None, [])
    # The base keeps the stock entrypoint, so the check above is a real one.
    assert docker.images.get("sparkctl-sandbox:base").attrs["Config"]["Entrypoint"] == ["/bin/sh", "-c", "echo stock vllm entrypoint"]
    engram = f"{ROOT}/models/deepseek_v4_1/common/engram.py"
    attention = f"{ROOT}/models/deepseek_v4_1/attention.py"
    patched, cubin, build_info, kernels = outputs(
        docker, "sparkctl-sandbox:latest", f"cat {engram}", "cat /root/.cache/sparse_mla/sparse_mla_decode.cubin",
        "cat /opt/cutlass/build-info", "wc -c < /opt/flashinfer/kernels.bin")
    reverted, kept = outputs(docker, "sparkctl-sandbox:engram-mem", f"cat {engram}", f"cat {attention}")
    assert 'ORIGIN = "patch"' in patched
    assert 'ORIGIN = "branch"' in reverted  # The TP8 vLLM report §3: reverted
    assert 'ORIGIN = "patch"' in kept
    assert "sparse_mla_decode" in cubin
    assert "MAX_JOBS=4" in build_info
    assert kernels.split()[0] == str(4 * 1024 * 1024)


def test_the_patch_layer_and_the_variant_are_one_image_layer_per_folder(first_build, docker):
    """Seven patch files (three originals): one COPY, so one image layer, per destination folder, and
    the files land where the manifest says, with the modes the context gives them. Files are copied,
    not a folder tree, so the folders on their way keep the owner and mode the image below gave them."""
    def layers(tag: str) -> list[str]:
        return docker.images.get(tag).attrs["RootFS"]["Layers"]

    def stat(tag: str, *paths: str, what: str = "%a %u %g %Y %n") -> list[str]:
        # (the entrypoint given: the images below the patch layer keep the stock one, which ignores arguments)
        return docker.containers.run(tag, ["-c", what, *paths], entrypoint=["stat"], remove=True,
                                     network_mode="none").decode().splitlines()

    overlay5, patched, variant = layers("sparkctl-sandbox:overlay5"), layers("sparkctl-sandbox:latest"), layers("sparkctl-sandbox:engram-mem")
    patch_folders = {"model_executor/layers", "model_executor/model_loader", "models/deepseek_v4_1",
                     "models/deepseek_v4_1/common", "models/deepseek_v4_1/nvidia", "v1/attention/backends/mla"}
    reverted_folders = {"model_executor/model_loader", "models/deepseek_v4_1/common", "models/deepseek_v4_1/nvidia"}
    assert patched[:len(overlay5)] == overlay5 and len(patched) == len(overlay5) + len(patch_folders)
    assert variant[:len(patched)] == patched and len(variant) == len(patched) + len(reverted_folders)
    # Folders above the ones that get a file: a folder tree copied whole would give them the context's
    # owner and mode (0755); copied files leave them as they were. overlay4 gives models/ a mode of its
    # own (0775), so the difference shows.
    on_the_way = [ROOT, f"{ROOT}/models", f"{ROOT}/model_executor", f"{ROOT}/v1", f"{ROOT}/v1/attention"]
    listing, after = (printed.splitlines() for printed in outputs(  # the patched image's, in one container
        docker, "sparkctl-sandbox:latest",
        f"stat -c '%a %u %g %n' {ROOT}/models/deepseek_v4_1/attention.py {ROOT}/models/deepseek_v4_1/nvidia/model_state.py",
        "stat -c '%a %u %g %Y %n' " + " ".join(on_the_way)))
    assert listing == [f"644 0 0 {ROOT}/models/deepseek_v4_1/attention.py", f"644 0 0 {ROOT}/models/deepseek_v4_1/nvidia/model_state.py"]
    before = stat("sparkctl-sandbox:overlay5", *on_the_way)
    assert before[1].startswith("775 ")
    assert after == before


def test_sandbox_image_runs_the_stand_in_engine(first_build, docker):
    """The sandbox chain's base carries python3 and the stand-in engine: `vllm serve` parses argv
    against vLLM 0.33.0's real flags, so a flag vLLM lacks is refused as vLLM would refuse it."""
    import docker as docker_sdk

    with pytest.raises(docker_sdk.errors.ContainerError) as refused:
        docker.containers.run("sparkctl-sandbox:latest", ["vllm", "serve", "/model", "--no-such-flag", "1"],
                              remove=True, network_mode="none")
    assert refused.value.exit_status == 2
    assert b"--no-such-flag" in (refused.value.stderr or b"")
    version = docker.containers.run("sparkctl-sandbox:latest", ["python3", "-c", "import sys; print(sys.version_info[0])"],
                                    remove=True, network_mode="none")
    assert version.decode().strip() == "3"


def test_chain_ids_match_the_engines_layer_store(first_build, docker, local_dockerd):
    layers = docker.images.get("sparkctl-sandbox:latest").attrs["RootFS"]["Layers"]
    store = Path(local_dockerd.root) / "data" / "image" / "overlay2" / "layerdb" / "sha256"
    for diff, chain in zip(layers, I.chain_ids(layers)):
        assert (store / chain.split(":")[1] / "diff").read_text() == diff


def test_unchanged_rebuild_skips_every_layer(first_build, local_dockerd, chain_dir, docker):
    started = time.time()  # the engine runs on this machine: one clock
    result = build(local_dockerd, "--image", str(chain_dir), "--variant", "engram-mem")
    assert result.code == 0, result
    doc = result.json()
    assert [l["cached"] for l in doc["layers"]] == [True] * 6
    assert ids(doc) == ids(first_build) and doc["image_id"] == first_build["image_id"]
    assert "Step 1/" not in result.stderr
    # the surfaces already read from this image ID are reused: no container was started to read them
    assert doc["surfaces"] == first_build["surfaces"]
    def starts(since: float) -> list:
        return list(docker.events(since=since, until=time.time(), decode=True,
                                  filters={"type": "container", "event": "start"}))

    assert starts(started) == []
    # The same question sees a container that does start (so the empty answer above is a real one).
    control = time.time()
    docker.containers.run("sparkctl-sandbox:latest", ["true"], remove=True, network_mode="none")
    assert len(starts(control)) >= 1


def test_one_changed_patch_file_rebuilds_only_the_patch_layer(first_build, local_dockerd, chain_dir, docker):
    (chain_dir / "patch" / "sparse_swa.py").write_text('ORIGIN = "patch"\nPATCHED = True\nREVISION = 2\n')
    result = build(local_dockerd, "--image", str(chain_dir))
    assert result.code == 0, result
    doc = result.json()
    assert [(l["name"], l["cached"]) for l in doc["layers"]] == [(n, n != "patch") for n in LAYERS]
    before, after = ids(first_build), ids(doc)
    assert [n for n in LAYERS if before[n] != after[n]] == ["patch"]
    assert "REVISION = 2" in cat(docker, "sparkctl-sandbox:latest", f"{ROOT}/v1/attention/backends/mla/sparse_swa.py")
    # The variant stands on the patch layer: it alone rebuilds with it.
    variant = build(local_dockerd, "--image", str(chain_dir), "--variant", "engram-mem")
    assert variant.code == 0, variant
    assert [(l["name"], l["cached"]) for l in variant.json()["layers"]] == [(n, True) for n in LAYERS] + [("engram-mem", False)]


def test_prune_intermediate_untags_overlays_and_removes_superseded_images(first_build, local_dockerd, chain_dir, docker):
    import docker as docker_module

    old_patch = first_build["layers"][4]["image_id"]  # superseded by the previous test
    docker.images.get(old_patch)
    result = build(local_dockerd, "--image", str(chain_dir), "--variant", "engram-mem", "--prune-intermediate")
    assert result.code == 0, result
    tags = {t for image in docker.images.list() for t in image.tags}
    assert not {f"sparkctl-sandbox:{n}" for n in ("overlay1", "overlay3", "overlay4", "overlay5")} & tags
    assert {"sparkctl-sandbox:latest", "sparkctl-sandbox:engram-mem", "sparkctl-sandbox:base"} <= tags
    with pytest.raises(docker_module.errors.ImageNotFound):
        docker.images.get(old_patch)
    assert "REVISION = 2" in cat(docker, "sparkctl-sandbox:latest", f"{ROOT}/v1/attention/backends/mla/sparse_swa.py")
    # The overlays are still the final image's layers: the next build finds them by their labels.
    again = build(local_dockerd, "--image", str(chain_dir))
    assert again.code == 0, again
    assert [l["cached"] for l in again.json()["layers"]] == [True] * 5
    assert "re-tagged" in again.stderr
    assert "sparkctl-sandbox:overlay5" in {t for image in docker.images.list() for t in image.tags}


def test_no_cache_rebuilds_every_layer(local_dockerd, chain_dir, tmp_path):
    result = build(local_dockerd, "--image", str(chain_dir), "--no-cache")
    assert result.code == 0, result
    assert [l["cached"] for l in result.json()["layers"]] == [False] * 5
    # The five labels are one builder step per layer (not one `--label` step each), and they hold.
    label_steps = [line.split(" | ", 1)[0] for line in result.stderr.splitlines() if " : LABEL " in line]
    assert label_steps == LAYERS, result.stderr


def test_a_patch_target_missing_in_the_parent_image_is_reported(local_dockerd, tmp_path, docker):
    # overlay5 deletes a file the patch replaces: only a check inside the image can see that.
    chain = copy_chain(tmp_path / "sandbox")
    text = (chain / "chain.yaml").read_text()
    text = text.replace("      - sh /tmp/prewarm5.sh\n",
                        f"      - sh /tmp/prewarm5.sh\n      - rm -r {ROOT}/models/deepseek_v4_1/nvidia\n")
    (chain / "chain.yaml").write_text(text)
    dry = run_sparkctl("--json", "build", "--image", str(chain), "--dry-run")
    assert [t["status"] for t in dry.json()["patch_targets"]] == ["present"] * 7  # the listing cannot know
    result = build(local_dockerd, "--image", str(chain))
    assert result.code == 0, result
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: patch")]
    assert [w.split(":")[1].strip() for w in warnings] == ["patch model_state.py", "patch flashinfer_sparse.py"]
    assert all("sparkctl-sandbox:overlay5" in w and "models/deepseek_v4_1/nvidia/" in w for w in warnings), warnings
    (chain / "patch" / "engram.py").write_text("REVISION = 3\n")  # force the patch layer to build again
    strict = build(local_dockerd, "--image", str(chain), "--strict-patches")
    assert strict.code == 1, strict
    assert "2 patch destination(s) do not exist in sparkctl-sandbox:overlay5 (--strict-patches)" in strict.stderr + strict.stdout
    assert strict.json()["image_id"] is None


def test_a_failing_verify_stops_the_chain_with_exit_1(local_dockerd, tmp_path):
    chain = copy_chain(tmp_path / "sandbox")
    (chain / "build" / "verify5.sh").write_text("#!/bin/sh\necho HIT/MISS\n")
    result = build(local_dockerd, "--image", str(chain))
    assert result.code == 1, result
    doc = result.json()
    assert doc["image_id"] is None
    assert [l["name"] for l in doc["layers"]] == ["overlay1", "overlay3", "overlay4"]
    assert "verify failed: expected HIT/HIT" in result.stderr


def test_an_image_that_keeps_its_entrypoint_fails_the_check(local_dockerd, tmp_path):
    chain = copy_chain(tmp_path / "sandbox")
    own = chain / "images" / "patch.Dockerfile.j2"  # a chain may ship its own template
    own.parent.mkdir()
    template = (Path(__file__).resolve().parent.parent / "templates" / "images" / "patch.Dockerfile.j2").read_text()
    own.write_text(template.replace("ENTRYPOINT []\n", ""))
    result = build(local_dockerd, "--image", str(chain))
    assert result.code == 1, result
    assert result.json()["image_id"] is None
    assert "has ENTRYPOINT ['/bin/sh', '-c', 'echo stock vllm entrypoint']" in result.stdout + result.stderr


def test_an_unreachable_engine_is_one_line_exit_1(tmp_path):
    result = run_sparkctl("build", "--image", "sandbox", env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert result.code == 1, result
    assert "Traceback" not in result.stderr
    *warnings, error = result.stderr.splitlines()
    assert error.startswith("error: cannot reach the Docker engine at unix://"), result.stderr
    # No inventory here: a local build says it cannot compare the hosts' architecture, then tries.
    assert [w.split(":")[:2] for w in warnings] == [["warning", " no inventory"]], result.stderr

