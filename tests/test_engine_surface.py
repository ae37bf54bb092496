"""The engine surface read from an image (sparkctl.images.surface), without docker: the same probe
program a container runs, run here against the stand-in package laid out as it is in the image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkctl.commands.engine_flags import load_engine_flags
from sparkctl.config.inventory import load_inventory
from sparkctl.errors import ConfigError
from sparkctl.images import surface
from sparkctl.ops.render import render

REPO = Path(__file__).resolve().parent.parent
FLAGS = REPO / "sparkctl" / "engine_flags"


def run_probe(tmp_path: Path, engine: str, flags_dir: Path | None = None) -> dict:
    """``python3 -c PROBE ENGINE`` with the stand-in importable as ``sparkctl_standin`` (as in the image)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    link = site / "sparkctl_standin"
    if not link.exists():
        link.symlink_to(REPO / "sparkctl" / "standin")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARKCTL_STANDIN_FLAGS_DIR")}
    env["PYTHONPATH"] = str(site)
    if flags_dir:
        env["SPARKCTL_STANDIN_FLAGS_DIR"] = str(flags_dir)
    proc = subprocess.run([sys.executable, "-c", surface.PROBE, engine, ""], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return surface.parse_probe_output(proc.stdout, engine)


def variant_flags(tmp_path: Path, drop_flag: str | None = None, drop_env: str | None = None) -> Path:
    """A copy of the flags folder lacking one option / one variable: what a variant image carries."""
    folder = tmp_path / "variant-flags"
    shutil.copytree(FLAGS, folder, dirs_exist_ok=True)
    if drop_flag:
        path = folder / "vllm-0.33.0.json"
        data = json.loads(path.read_text())
        del data[drop_flag]
        path.write_text(json.dumps(data))
    if drop_env:
        path = folder / "vllm-0.33.0-envs.txt"
        path.write_text("".join(line + "\n" for line in path.read_text().split() if line != drop_env))
    return folder


@pytest.mark.parametrize("engine,version", [("vllm", "0.33.0"), ("sglang", "0.5.23")])
def test_the_standin_image_answers_like_the_shipped_lists(tmp_path, engine, version):
    doc = run_probe(tmp_path, engine)
    assert (doc["engine"], doc["version"], doc["reader"]) == (engine, version, "sparkctl stand-in")
    read = surface.as_engine_flags({**doc, "image_id": "sha256:" + "a" * 64, "tags": ["t:1"]})
    shipped = load_engine_flags(engine, version)
    assert dict(read.flags) == dict(shipped.flags)
    assert read.envs == shipped.envs and len(read.envs) > 300
    assert dict(read.parsers) == dict(shipped.parsers)
    assert "/v1/chat/completions" in doc["routes"]


def test_the_shipped_fallback_is_the_released_packages_export():
    """Option and variable counts of vLLM 0.33.0 / SGLang 0.5.23 as their own parsers and env tables list them."""
    vllm, sglang = load_engine_flags("vllm", "0.33.0"), load_engine_flags("sglang", "0.5.23")
    assert (len(vllm.flags), len(vllm.envs)) == (435, 318)
    assert (len(sglang.flags), len(sglang.envs)) == (559, 763)
    assert "VLLM_FLASHINFER_AUTOTUNE" not in vllm.envs and "--disable-flashinfer-autotune" in vllm.flags
    assert "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE" in sglang.envs


def test_render_refuses_what_the_image_lacks(tmp_path, monkeypatch):
    """A variant image lacking a rendered flag, then a rendered variable: render names each."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inventory = load_inventory(REPO / "inventory.example.yaml")
    image_id = "sha256:" + "b" * 64
    doc = run_probe(tmp_path, "vllm", variant_flags(tmp_path, drop_flag="--limit-mm-per-prompt"))
    surface.store(image_id, ["vllm-dsv41:latest"], doc)
    with pytest.raises(ConfigError) as err:
        render(inventory, "tp4")
    assert "has no option --limit-mm-per-prompt" in err.value.detail
    assert "image vllm-dsv41:latest" in err.value.detail

    image_id = "sha256:" + "c" * 64  # read later: it wins for the tag
    doc = run_probe(tmp_path, "vllm", variant_flags(tmp_path / "v2", drop_env="VLLM_HOST_IP"))
    surface.store(image_id, ["vllm-dsv41:latest"], doc)
    with pytest.raises(ConfigError) as err:
        render(inventory, "tp4")
    assert "does not read the environment variable VLLM_HOST_IP" in err.value.detail
    # another tag is still checked against the shipped lists
    plan, _ = render(inventory, "tp8-300k")
    assert plan.surface == "shipped list vllm-0.33.0.json"


def test_the_image_surface_decides_the_autotune_switch(tmp_path, monkeypatch):
    """The TP4 vLLM report's image reads VLLM_FLASHINFER_AUTOTUNE through its own branch: then it is the variable."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = variant_flags(tmp_path)
    with open(folder / "vllm-0.33.0-envs.txt", "a") as handle:
        handle.write("VLLM_FLASHINFER_AUTOTUNE\n")
    surface.store("sha256:" + "d" * 64, ["vllm-dsv41:engram-mem"], run_probe(tmp_path, "vllm", folder))
    plan, _ = render(load_inventory(REPO / "inventory.example.yaml"), "tp8-300k")
    head = plan.hosts[0]
    assert head.env["VLLM_FLASHINFER_AUTOTUNE"] == "0"
    assert "--disable-flashinfer-autotune" not in head.engine_argv
    assert plan.surface.startswith("image vllm-dsv41:engram-mem")


def test_an_image_of_another_engine_version_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = variant_flags(tmp_path)
    (folder / "vllm-0.33.0.json").rename(folder / "vllm-0.34.0.json")
    (folder / "vllm-0.33.0-envs.txt").rename(folder / "vllm-0.34.0-envs.txt")
    surface.store("sha256:" + "e" * 64, ["vllm-dsv41:latest"], run_probe(tmp_path, "vllm", folder))
    with pytest.raises(ConfigError) as err:
        render(load_inventory(REPO / "inventory.example.yaml"), "tp4")
    assert err.value.field == "engine_version" and "vllm 0.34.0" in err.value.detail


def test_verify_deployment_reads_an_unknown_image_once_on_a_host(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inventory = load_inventory(REPO / "inventory.example.yaml")
    plan, _ = render(inventory, "tp4")
    variant = variant_flags(tmp_path, drop_env="VLLM_HOST_IP")
    calls = []

    def run_probe_on(host, argv):
        calls.append((host, argv[:8]))
        return True, json.dumps(run_probe(tmp_path, "vllm", variant))

    ids = {h.name: "sha256:" + "f" * 64 for h in plan.hosts}
    refusal, _ = surface.verify_deployment("vllm", "0.33.0", "vllm-dsv41:latest", plan.hosts, ids, run_probe_on)
    assert refusal and "VLLM_HOST_IP" in refusal and "spark-153" in refusal
    assert calls == [("spark-153", ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
                                    "sha256:" + "f" * 64])]
    # stored by image ID: the next check reads no container
    refusal, _ = surface.verify_deployment("vllm", "0.33.0", "vllm-dsv41:latest", plan.hosts, ids, run_probe_on)
    assert refusal and len(calls) == 1


def test_options_of_every_launcher():
    assert surface.options_of(["vllm", "serve", "/model", "--port", "8000"]) == ["--port", "8000"]
    assert surface.options_of(["python3", "-m", "sglang.launch_server", "--tp-size", "4"]) == ["--tp-size", "4"]
    assert surface.options_of(["bash", "-c", "ray start --head --port=6379 && exec vllm serve /model --port 8000"]) == \
        ["--port", "8000"]
    assert surface.options_of(["ray", "start", "--address=h:6379", "--block"]) is None


def test_doctor_checks_the_profile_against_the_head_images_surface(tmp_path, monkeypatch):
    from sparkctl.config.profile import load_profile, select_hosts
    from sparkctl.ops.doctor.judge import check_surface

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inventory = load_inventory(REPO / "inventory.example.yaml")
    profile = load_profile("tp4").profile
    hosts, _ = select_hosts(profile, inventory.hosts, None)
    unknown = check_surface(profile, hosts, "sha256:" + "1" * 64)
    assert unknown.status == "skip" and "shipped lists" in unknown.detail
    surface.store("sha256:" + "2" * 64, ["vllm-dsv41:latest"], run_probe(tmp_path, "vllm"))
    good = check_surface(profile, hosts, "sha256:" + "2" * 64)
    assert good.status == "pass" and "vllm 0.33.0 read from image 222222222222" in good.detail
    surface.store("sha256:" + "3" * 64, ["vllm-dsv41:latest"],
                  run_probe(tmp_path, "vllm", variant_flags(tmp_path, drop_flag="--reasoning-parser")))
    bad = check_surface(profile, hosts, "sha256:" + "3" * 64)
    assert bad.status == "fail" and "--reasoning-parser" in bad.detail and "engine_args.reasoning-parser" in bad.detail


def test_the_probe_asks_a_real_engine_package_first(tmp_path):
    """An image with an engine package: the probe reads its parser, its variable table and its
    parser names (here a tiny package with SGLang's module shape), not the stand-in."""
    pkg = tmp_path / "site" / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (tmp_path / "site" / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(
        "class ServerArgs:\n"
        "    @staticmethod\n"
        "    def add_cli_args(parser):\n"
        "        parser.add_argument('--model-path', type=str)\n"
        "        parser.add_argument('--enable-multimodal', action='store_true')\n"
        "        parser.add_argument('--tool-call-parser', choices=['auto', 'deepseekv41'])\n")
    (pkg / "environ.py").write_text(
        "class EnvField:\n"
        "    def __set_name__(self, owner, name):\n"
        "        self.name = name\n"
        "class _DeprecatedEnv:\n"
        "    def __init__(self, new):\n"
        "        self.new_name = new\n"
        "class Envs:\n"
        "    SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE = EnvField()\n"
        "    SGLANG_EXA_ = EnvField()\n"  # a family's stem, not a variable
        "_DEPRECATED = {'SGLANG_OLD_KNOB': _DeprecatedEnv('SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE')}\n"
        "_EXAMPLES = {'SGLANG_OLD_NAME': _DeprecatedEnv('SGLANG_NEW_NAME')}\n")  # forwards to nothing real
    dist = tmp_path / "site" / "sglang-0.5.23.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    # an overlay's adapter folder on the image's PYTHONPATH, whose modules read their switches
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "engram_backend.py").write_text(
        "import os\nMODE = os.environ.get('OFFLOAD_MODE', 'nvme')\nDIR = os.getenv(\"DSV41_PACKED_DIR\")\n"
        "def threads():\n    return int(os.environ['DSV41_IO_THREADS'])\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = f"{tmp_path / 'site'}:{adapter}"
    proc = subprocess.run([sys.executable, "-c", surface.PROBE, "sglang", ""], capture_output=True, text=True,
                          env=env, timeout=60)
    doc = surface.parse_probe_output(proc.stdout, "sglang")
    assert (doc["reader"], doc["version"]) == ("sglang", "0.5.23")
    assert doc["switches"] == ["DSV41_IO_THREADS", "DSV41_PACKED_DIR", "OFFLOAD_MODE"]
    flags = surface.as_engine_flags({**doc, "image_id": "sha256:" + "4" * 64, "tags": ["sglang-dsv41:latest"]})
    assert "OFFLOAD_MODE" in flags.switches and "adapter folders" in flags.switches_source
    assert doc["flags"]["--enable-multimodal"] == {"takes_value": False, "choices": None}
    assert doc["flags"]["--model-path"]["takes_value"] is True
    assert doc["envs"] == ["SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "SGLANG_OLD_KNOB"]
    assert doc["parsers"]["tool_call_parsers"] == ["auto", "deepseekv41"]
    assert "srt/environ.py" in doc["layout"]
