"""``sparkctl build``: run a BuildPlan on a Docker engine, skipping every layer whose inputs are unchanged.

Each layer's image carries labels: ``org.sparkctl.inputs`` (the layer key: the hash of its template,
build arguments and copied files, bound to the parent image's ID), ``org.sparkctl.parent`` (that ID),
``org.sparkctl.layer`` and ``org.sparkctl.chain``. A layer is skipped when its tag already carries
the key it would get -- or when an image of this chain reachable through those parent labels does
(after ``--prune-intermediate`` untagged it). So a change to one patch file rebuilds only the patch
layer, and a change below rebuilds from there up.

Before the patch layer is built, its destinations are checked inside the parent image itself; after
the last layer, the final image must have an empty ENTRYPOINT.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass, field

from sparkctl import engines
from sparkctl.images import inputs as I
from sparkctl.images import surface
from sparkctl.images.engine import CliEngine, DockerPyEngine, Engine, EngineError
from sparkctl.images.plan import BuildPlan, LayerPlan, PatchTarget, suggest
from sparkctl.ops.steps import CHANGED, OK, StepFailed  # a result as a step's end (outcome)
from sparkctl.remote.pool import connect
from sparkctl.remote.result import RemoteError

LABEL_INPUTS = "org.sparkctl.inputs"
LABEL_CONTENT = "org.sparkctl.content"  # the inputs hash alone (without the parent): for people reading labels
LABEL_PARENT = "org.sparkctl.parent"
LABEL_LAYER = "org.sparkctl.layer"
LABEL_CHAIN = "org.sparkctl.chain"


@dataclass
class BuildOptions:
    no_cache: bool = False
    prune_intermediate: bool = False
    strict_patches: bool = False


@dataclass
class LayerOutcome:
    name: str
    tag: str
    image_id: str | None = None
    cached: bool = False
    seconds: float = 0.0
    key: str | None = None
    how: str = ""  # "built", "label", "relabelled tag" ...

    def to_json(self) -> dict:
        return {"name": self.name, "image_id": self.image_id, "cached": self.cached}


@dataclass
class BuildResult:
    image: str
    engine: str
    base: LayerOutcome | None = None
    layers: list[LayerOutcome] = field(default_factory=list)
    patch_targets: list[PatchTarget] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    surfaces: dict[str, str] = field(default_factory=dict)  # engine -> "vllm 0.33.0 (435 options, 318 variables)"
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def image_id(self) -> str | None:
        if not self.ok or not self.layers:
            return None
        return self.layers[-1].image_id

    def outcome(self, host: str) -> tuple[str, str]:
        """As a step's end on the build ``host``: ok (every layer reused), changed (built), or StepFailed."""
        if not self.ok:
            raise StepFailed(f"build of {self.image} on {host} failed: {'; '.join(self.errors)}")
        built = [layer.name for layer in [self.base, *self.layers] if layer is not None and not layer.cached]
        if not built:
            return OK, f"{self.image} on {host}: every layer reused"
        return CHANGED, f"built {', '.join(built)} of {self.image} on {host} in {self.seconds:.1f} s"

    def to_json(self) -> dict:
        return {"image": self.image, "image_id": self.image_id, "layers": [layer.to_json() for layer in self.layers],
                "surfaces": self.surfaces}


class _Log:
    """Build output: every line on a terminal (or with -v); otherwise only step lines, prefixed by layer."""

    def __init__(self, out, layer: str):
        self.out, self.layer = out, layer
        console = out.console
        self.full = out.verbose or console.is_terminal

    def __call__(self, line: str) -> None:
        if not line.strip():
            return
        if self.full or line.startswith("Step "):
            self.out.console.print(f"{self.layer} | {line}", soft_wrap=True, markup=False, highlight=False,
                                   style="dim" if self.full and not line.startswith("Step ") else None)


def _say(out, message: str, style: str | None = None) -> None:
    out.console.print(message, soft_wrap=True, markup=False, highlight=False, style=style)


def _labels(plan: BuildPlan, layer: LayerPlan, key: str, parent_id: str) -> dict[str, str]:
    return {LABEL_INPUTS: key, LABEL_CONTENT: layer.inputs_hash or "", LABEL_PARENT: parent_id,
            LABEL_LAYER: layer.name, LABEL_CHAIN: plan.chain}


def _generation(engine: Engine, chain: str) -> dict[str, str]:
    """inputs key -> image ID for every image of ``chain`` reachable from a tagged one through parent labels.

    Labels are inherited by the images built on top (docker's intermediate images included), so a
    label filter alone would also match images that merely sit above the one we want; following the
    recorded parent IDs from tagged build results only ever visits real layer results."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    for start in engine.tagged_images(f"{LABEL_CHAIN}={chain}"):
        current = start
        while current is not None and current.id not in seen and current.labels.get(LABEL_CHAIN) == chain:
            seen.add(current.id)
            key = current.labels.get(LABEL_INPUTS)
            if key:
                found.setdefault(key, current.id)
            parent = current.labels.get(LABEL_PARENT)
            current = engine.inspect(parent) if parent else None
    return found


def _reuse(engine: Engine, tag: str, key: str, generation: dict[str, str] | None) -> tuple[str, str] | None:
    """(image ID, how) when an image with ``key`` exists: already under ``tag``, or found and re-tagged."""
    current = engine.inspect(tag)
    if current is not None and current.labels.get(LABEL_INPUTS) == key:
        return current.id, "tag"
    if generation and key in generation:
        engine.tag(generation[key], tag)
        return generation[key], "re-tagged"
    return None


@contextlib.contextmanager
def _temp_tar(entries):
    handle = tempfile.NamedTemporaryFile(prefix="sparkctl-context-", suffix=".tar", delete=False)
    try:
        with handle:
            I.write_tar(entries, handle)
        yield handle.name
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(handle.name)


def _ensure_base(plan: BuildPlan, engine: Engine, options: BuildOptions, generation, out) -> LayerOutcome:
    base = plan.base
    started = time.monotonic()
    if base.kind == "image":
        info = engine.inspect(base.image)
        if info is None:
            _say(out, f"base     pulling {base.image} on {engine.name}")
            engine.pull(base.image, _Log(out, "base"))
            info = engine.inspect(base.image)
            if info is None:
                raise EngineError(f"base image {base.image} is still absent after the pull")
        return LayerOutcome("base", base.tag, info.id, True, time.monotonic() - started, None, "present")
    key = base.inputs_hash
    assert key is not None
    if not options.no_cache:
        reused = _reuse(engine, base.tag, key, generation)
        if reused:
            return LayerOutcome("base", base.tag, reused[0], True, time.monotonic() - started, key, reused[1])
    changes = list(base.changes) + [f"LABEL {LABEL_INPUTS}={key} {LABEL_CONTENT}={key} {LABEL_LAYER}=base {LABEL_CHAIN}={plan.chain}"]
    with _temp_tar(base.entries) as path:
        if base.tarball:
            path = _merge_tarball(base.tarball, path)
        try:
            image_id = engine.import_rootfs(path, base.tag, changes)
        finally:
            if base.tarball:
                os.unlink(path)
    return LayerOutcome("base", base.tag, image_id, False, time.monotonic() - started, key, "imported")


def _merge_tarball(tarball: str, overlay_tar: str) -> str:
    """A rootfs tarball with the chain's own entries laid over it.

    The engine refuses a tar that names one path twice, so a path the chain's entries provide is
    dropped from the tarball rather than appended again."""
    def key(name: str) -> str:
        return name.lstrip("./").rstrip("/")

    with tarfile.open(overlay_tar, mode="r:*") as tar:
        overridden = {key(m.name) for m in tar.getmembers()}
    merged = tempfile.NamedTemporaryFile(prefix="sparkctl-rootfs-", suffix=".tar", delete=False)
    with merged, tarfile.open(fileobj=merged, mode="w", format=tarfile.PAX_FORMAT) as out:
        seen: set[str] = set()
        for source, skip in ((tarball, overridden), (overlay_tar, set())):
            with tarfile.open(source, mode="r:*") as tar:
                for member in tar:
                    name = key(member.name)
                    if name in skip or name in seen:
                        continue
                    seen.add(name)
                    out.addfile(member, tar.extractfile(member) if member.isfile() else None)
    return merged.name


def check_patch_targets_in_image(engine: Engine, image: str, targets: list[PatchTarget], image_name: str) -> list[PatchTarget]:
    """The patch destinations, checked inside ``image`` (a throwaway container, no network)."""
    probes = engine.probe_paths(image, [t.dest for t in targets])
    if probes is None or len(probes) != len(targets):
        return [PatchTarget(t.name, t.file, t.dest, "unknown", f"{image_name} (could not run /bin/sh in it)") for t in targets]
    out = []
    for target, probe in zip(targets, probes):
        if probe.exists:
            out.append(PatchTarget(target.name, target.file, target.dest, "present", image_name))
        else:
            hint = suggest(target.dest, probe.existing_dir or "/", probe.names)
            out.append(PatchTarget(target.name, target.file, target.dest, "missing", image_name, hint))
    return out


def run_build(plan: BuildPlan, engine: Engine, options: BuildOptions, out) -> BuildResult:
    if plan.missing:
        raise plan.missing_error()
    started = time.monotonic()
    result = BuildResult(image=plan.image, engine=engine.name, patch_targets=list(plan.patch_targets))
    generation = None if options.no_cache else _generation(engine, plan.chain)
    try:
        result.base = _ensure_base(plan, engine, options, generation, out)
        _say(out, _line(result.base))
        parent_id = result.base.image_id
        for layer in plan.layers:
            assert parent_id is not None and layer.inputs_hash is not None
            layer_started = time.monotonic()
            key = I.layer_key(layer.inputs_hash, parent_id)
            reused = None if options.no_cache else _reuse(engine, layer.tag, key, generation)
            if reused:
                outcome = LayerOutcome(layer.name, layer.tag, reused[0], True, time.monotonic() - layer_started, key, reused[1])
            else:
                if layer.kind == "patch":
                    result.patch_targets = check_patch_targets_in_image(engine, parent_id, plan.patch_targets, layer.parent)
                    missing = [t for t in result.patch_targets if t.status == "missing"]
                    for target in missing:
                        _say(out, "warning: " + target.message(), "yellow")
                    if missing and options.strict_patches:
                        result.errors.append(f"{len(missing)} patch destination(s) do not exist in {layer.parent} (--strict-patches)")
                        break
                # The labels ride in the Dockerfile as one LABEL step, not as `--label`s (one step each).
                with _temp_tar(layer.context_entries(_labels(plan, layer, key, parent_id))) as path:
                    image_id = engine.build(path, dockerfile=I.DOCKERFILE_NAME, tag=layer.tag, args=layer.args,
                                            no_cache=options.no_cache, on_log=_Log(out, layer.name))
                outcome = LayerOutcome(layer.name, layer.tag, image_id, False, time.monotonic() - layer_started, key, "built")
            result.layers.append(outcome)
            _say(out, _line(outcome))
            parent_id = outcome.image_id
    except EngineError as err:
        result.errors.append(str(err))
        result.log_tail = err.log
    except RemoteError as err:  # --on: the host dropped us mid-build
        result.errors.append(str(err))
    if result.ok:
        _check_entrypoint(engine, result)
    if result.ok:
        result.surfaces = read_surfaces(engine, result, out)
    if result.ok and options.prune_intermediate:
        result.pruned = prune_intermediate(engine, plan, result)
    result.seconds = time.monotonic() - started
    return result


def stale_layers(plan: BuildPlan, engine: Engine) -> list[str]:
    """The chain's layers a build would (re)build on ``engine``, base first; [] when its final tag
    already holds these exact inputs. Read-only: follows the tags' input labels, builds nothing."""
    names = ["base"] + [layer.name for layer in plan.layers]
    base = plan.base
    info = engine.inspect(base.image if base.kind == "image" else base.tag)
    if info is None or (base.kind != "image" and info.labels.get(LABEL_INPUTS) != base.inputs_hash):
        return names
    parent_id = info.id
    for index, layer in enumerate(plan.layers, start=1):
        current = engine.inspect(layer.tag)
        if layer.inputs_hash is None or current is None or \
                current.labels.get(LABEL_INPUTS) != I.layer_key(layer.inputs_hash, parent_id):
            return names[index:]
        parent_id = current.id
    return []


def read_surfaces(engine: Engine, result: BuildResult, out) -> dict[str, str]:
    """Read the engine's surface from the image just built (no GPU) and keep it by image ID, so
    render/serve/doctor check a deployment against what this image's engine really accepts."""
    image_id = result.layers[-1].image_id
    found: dict[str, str] = {}
    for name in (plugin.name for plugin in engines.served_by_flags()):
        try:
            doc = surface.reuse(image_id, [result.image], name) or \
                surface.capture(engine, image_id, image_id, [result.image], name)
        except surface.SurfaceError:
            continue  # this image has no such engine
        envs = len(doc["envs"]) if doc.get("envs") is not None else "unknown"
        found[name] = f"{doc['engine']} {doc['version']} ({len(doc['flags'])} options, {envs} variables)"
        _say(out, f"surface    {result.image:<34} {found[name]}")
    if not found:
        _say(out, f"warning: could not read an engine surface from {result.image}; render and serve fall back to "
                  "the shipped lists", "yellow")
    return found


def _check_entrypoint(engine: Engine, result: BuildResult) -> None:
    final = engine.inspect(result.layers[-1].image_id)
    if final is None:
        result.errors.append(f"{result.image}: the final image vanished")
    elif final.entrypoint not in (None, []):
        result.errors.append(f"{result.image} has ENTRYPOINT {final.entrypoint}; the last layer must clear it "
                             f"(ENTRYPOINT []) so the engine command given at `docker run` is what runs")


def prune_intermediate(engine: Engine, plan: BuildPlan, result: BuildResult) -> list[str]:
    """Untag the overlay layers and remove this chain's superseded, untagged images.

    Images the current result stands on are never removed (their layers are the image)."""
    removed: list[str] = []
    current = {o.image_id for o in result.layers} | ({result.base.image_id} if result.base else set())
    overlays = {layer.name for layer in plan.layers if layer.kind == "overlay"}
    for outcome in result.layers:
        if outcome.name in overlays:  # the patched image and its variants are deliverables: kept
            engine.untag(outcome.tag)
            removed.append(outcome.tag)
    # Superseded generations: untagged images labelled with this chain, not below the current image.
    keep = current | set(_generation(engine, plan.chain).values())
    for _ in range(8):  # leaves first: a removal can free its parent for the next pass
        progress = False
        for info in engine.dangling_images(f"{LABEL_CHAIN}={plan.chain}"):
            if info.id not in keep and info.labels.get(LABEL_INPUTS) and engine.remove(info.id):
                removed.append(info.id)
                progress = True
        if not progress:
            break
    return removed


def report_errors(result: BuildResult, out) -> None:
    for line in result.log_tail[-10:]:
        _say(out, f"  | {line}", "dim")
    for error in result.errors:
        _say(out, f"error: {error}", "red")


def _line(outcome: LayerOutcome) -> str:
    state = f"cached ({outcome.how})" if outcome.cached else outcome.how
    return f"{outcome.name:<10} {outcome.tag:<34} {state:<18} {str(outcome.image_id)[:19]}  {outcome.seconds:.1f}s"


def format_result(result: BuildResult) -> str:
    """The human summary (stdout). Errors go to stderr through ``report_errors``, in JSON mode too."""
    lines = []
    if result.ok:
        built = sum(1 for layer in result.layers if not layer.cached)
        lines.append(f"{result.image}: {result.image_id} ({built} of {len(result.layers)} layers built, "
                     f"{result.seconds:.1f}s, on {result.engine})")
    else:
        lines.append(f"{result.image}: build failed after {len(result.layers)} layer(s)")
    missing = [t for t in result.patch_targets if t.status == "missing"]
    if missing:
        lines.append(f"{len(missing)} patch destination(s) missing from the image below the patch layer (see warnings)")
    if result.pruned:
        lines.append(f"pruned: {len(result.pruned)} tags/images")
    return "\n".join(lines)


@contextlib.contextmanager
def engine_for(st, on: str | None, *, accept_new_host_keys: bool = False, connect_timeout: float = 10.0):
    """The local engine (docker-py), or ``--on HOST``'s engine through the SSH layer (its connection
    given ``connect_timeout`` seconds to open)."""
    if on is None:
        engine = DockerPyEngine()
    else:
        inventory = st.inventory()
        host = inventory.host(on, field="--on")
        engine = CliEngine(connect(inventory.ssh_target(host), connect_timeout=connect_timeout,
                                   accept_new_host_keys=accept_new_host_keys))
    try:
        yield engine
    finally:
        engine.close()
