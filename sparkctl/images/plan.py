"""What a build of a chain would do, computed without a Docker engine: ``plan_build``.

For every layer: its tag, its parent's tag, the rendered Dockerfile, its build arguments, the
files it copies and their content hash. Also: every input that is missing (all of them, so the
user fixes them in one go) and, for each patch, whether its destination is known to exist in the
image it lands on (a patch aimed at a path the engine does not have is a version mismatch).
"""

from __future__ import annotations

import difflib
import importlib
import json
import posixpath
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import jinja2

from sparkctl.errors import ConfigError
from sparkctl.images import inputs as I
from sparkctl.images.chain import Chain, LayerDef
from sparkctl.resources import cache_dir, templates_dir


@dataclass(frozen=True)
class Missing:
    layer: str  # "base" or a layer name
    path: str  # as the chain names it (relative to the build context)
    reason: str

    def __str__(self) -> str:
        return f"{self.layer}: {self.path} ({self.reason})"


@dataclass
class BasePlan:
    kind: str  # "image" (pulled/present) or "rootfs" (imported here)
    tag: str
    image: str | None = None
    entries: list[I.ContextFile] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    inputs_hash: str | None = None
    tarball: str | None = None

    def to_json(self) -> dict:
        out = {"kind": self.kind, "tag": self.tag}
        if self.kind == "image":
            out["image"] = self.image
        else:
            out.update({"inputs_hash": self.inputs_hash, "files": sum(1 for e in self.entries if e.kind == "file"),
                        "bytes": sum(e.size for e in self.entries), "changes": self.changes})
        return out


@dataclass
class LayerPlan:
    name: str
    tag: str
    parent: str  # the parent's tag (the FROM line)
    kind: str  # "overlay", "patch" or "variant"
    template: str
    dockerfile: str
    args: dict[str, str]
    files: list[I.ContextFile]
    inputs_hash: str | None  # None when an input is missing

    def context_entries(self, labels: dict[str, str] | None = None) -> list[I.ContextFile]:
        """The build context: the Dockerfile (``labels`` added as its last instruction; they hold the
        layer key, which is computed from the Dockerfile without them) and the inputs."""
        dockerfile = self.dockerfile if not labels else self.dockerfile.rstrip("\n") + "\n" + I.label_instruction(labels)
        return [I.generated(I.DOCKERFILE_NAME, dockerfile.encode())] + self.files

    def to_json(self) -> dict:
        as_given = ("name", "tag", "parent", "kind", "template", "inputs_hash")
        return {
            **{name: getattr(self, name) for name in as_given},
            "build_args": self.args,
            "files": sum(1 for f in self.files if f.kind == "file"),
            "bytes": sum(f.size for f in self.files),
            "dockerfile": self.dockerfile,
        }


@dataclass
class PatchTarget:
    name: str
    file: str
    dest: str  # absolute, inside the image
    status: str  # "present", "missing" or "unknown"
    seen_in: str | None = None  # which listing or layer provides it
    hint: str | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "file": self.file, "dest": self.dest, "status": self.status,
                "seen_in": self.seen_in, "hint": self.hint}

    def message(self) -> str:
        text = (f"patch {self.name}: {self.dest} does not exist in the image it is copied onto "
                f"(checked: {self.seen_in or 'nothing'}); nothing would import the file -- another engine version?")
        return text + (f" {self.hint}" if self.hint else "")


@dataclass
class BuildPlan:
    chain: str
    variant: str | None
    image: str  # the final tag
    context: str
    base: BasePlan
    layers: list[LayerPlan]
    patch_targets: list[PatchTarget]
    missing: list[Missing]

    def layer(self, name: str) -> LayerPlan:
        return next(layer for layer in self.layers if layer.name == name)

    def missing_error(self) -> ConfigError:
        listed = "; ".join(str(m) for m in self.missing)
        return ConfigError(f"{len(self.missing)} build input(s) missing (build context {self.context}): {listed} "
                           "-- pass --context DIR; docs/images.md says how to get the context", file=None, field=None)

    def to_json(self) -> dict:
        return {
            "image": self.image,
            "image_id": None,
            "dry_run": True,
            "chain": self.chain,
            "variant": self.variant,
            "context": self.context,
            "base": self.base.to_json(),
            "layers": [dict(layer.to_json(), image_id=None, cached=None) for layer in self.layers],
            "patch_targets": [t.to_json() for t in self.patch_targets],
            "missing_inputs": [{"layer": m.layer, "path": m.path, "reason": m.reason} for m in self.missing],
        }


# ---------------------------------------------------------------------------------------------
# Rendering


def _environment(chain: Chain):
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(chain.folder), str(templates_dir())]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["shquote"] = shlex.quote
    return env


def _dest(package_root: str, dest: str, is_dir: bool) -> str:
    path = dest if dest.startswith("/") else posixpath.normpath(posixpath.join(package_root, dest))
    return path.rstrip("/") + "/" if is_dir or dest in (".", "./") or dest.endswith("/") else path


def _copy_steps(root: str, copies) -> list[dict[str, str]]:
    """The COPY lines: consecutive copies into the same folder are one COPY of several sources (one
    builder step and one image layer instead of one each). Sources are copied in the order given, so
    a later one still wins over an earlier one, as with separate lines."""
    steps: list[dict] = []
    for copy in copies:
        dest = _dest(root, copy.dest, copy.is_dir)
        if steps and dest.endswith("/") and steps[-1]["dest"] == dest:
            steps[-1]["sources"].append(copy.src)
        else:
            steps.append({"sources": [copy.src], "dest": dest})
    return [{"src": " ".join(step["sources"]), "dest": step["dest"]} for step in steps]


def render_layer(chain: Chain, layer: LayerDef, parent: str, args: dict[str, str]) -> str:
    spec, root = layer.spec, chain.spec.package_root
    values = {
        "chain": chain.name,
        "layer": spec.name,
        "description": spec.description,
        "parent": parent,
        "package_root": root,
        "args": args,
        "copies": _copy_steps(root, spec.copy_),
        "run": spec.run,
        "verify": spec.verify.model_dump() if spec.verify else None,
        "patches": [{"name": p.key, "file": p.file, "dest": f"{root}/{p.dest}"} for p in chain.spec.patches] if spec.patches else [],
        # the patch files (or a variant's originals): one COPY per destination folder
        "placed_copies": _placed_copies(root, _placed_files(chain, layer).values()),
        "reverts": [],
        "env": dict(spec.env),
        "entrypoint": None if spec.entrypoint is None else json.dumps(spec.entrypoint),
    }
    if layer.variant is not None:
        originals = layer.variant.originals.strip("/")
        values["reverts"] = [
            {"name": key, "src": f"{originals}/{chain.patch(key).dest}", "dest": f"{root}/{chain.patch(key).dest}"}
            for key in layer.variant.revert
        ]
    if layer.line:
        where = f"variants.{layer.line}.layers[{layer.index}].template"
    else:
        where = f"variants.{spec.name}.template" if layer.variant else f"layers[{layer.index}].template"
    try:
        template = _environment(chain).get_template(spec.template)
    except jinja2.TemplateNotFound:
        raise ConfigError(f"template {spec.template!r} not found (looked in {chain.folder} and templates/)",
                          file=chain.file, field=where, line=chain.doc.line_of(_loc(layer, "template"))) from None
    except jinja2.TemplateSyntaxError as err:
        raise ConfigError(f"template {spec.template!r} line {err.lineno}: {err.message}", file=chain.file, field=where) from None
    try:
        return template.render(**values)
    except jinja2.UndefinedError as err:
        raise ConfigError(f"template {spec.template!r}: {err.message}", file=chain.file, field=where) from None


def _loc(layer: LayerDef, key: str) -> tuple:
    if layer.line:
        return ("variants", layer.line, "layers", layer.index, key)
    return ("variants", layer.spec.name, key) if layer.variant else ("layers", layer.index, key)


# ---------------------------------------------------------------------------------------------
# Inputs


def _placed_copies(root: str, placed: Iterable[str]) -> list[dict[str, str]]:
    """One COPY per destination folder, its files as the sources: files copied into a folder leave the
    folders already in the image as they are (a folder copied whole would reset the owner, mode and
    date of every existing folder on its path to the context's)."""
    by_folder: dict[str, list[str]] = {}
    for arcname in sorted(placed):
        folder = posixpath.dirname(arcname[len(I.PLACED_DIR) + 1:])
        by_folder.setdefault(folder, []).append(arcname)
    return [{"src": " ".join(files), "dest": f"{root}/{folder}/" if folder else f"{root}/"}
            for folder, files in by_folder.items()]


def _placed_files(chain: Chain, layer: LayerDef) -> dict[str, str]:
    """The patch files (or a variant's originals) -> where the context holds them: under
    ``PLACED_DIR`` at their destination relative to ``package_root``, where ``_placed_copies`` copies
    each folder's files from (one COPY per folder, not one per file)."""
    if layer.spec.patches:
        return {p.file: f"{I.PLACED_DIR}/{p.dest}" for p in chain.spec.patches}
    if layer.variant is not None:
        originals = layer.variant.originals.strip("/")
        return {f"{originals}/{chain.patch(key).dest}": f"{I.PLACED_DIR}/{chain.patch(key).dest}" for key in layer.variant.revert}
    return {}


def _wanted_inputs(chain: Chain, layer: LayerDef) -> list[str]:
    """The context paths a layer copies: its files, the patch files, a variant's originals."""
    return [c.src for c in layer.spec.copy_] + list(_placed_files(chain, layer))


def _layer_inputs(chain: Chain, layer: LayerDef, context: Path, missing: list[Missing]) -> list[I.ContextFile]:
    spec, exclude = layer.spec, chain.spec.exclude
    placed = _placed_files(chain, layer)
    entries: dict[str, I.ContextFile] = {}
    for relative in _wanted_inputs(chain, layer):
        if relative.strip("/").split("/", 1)[0] in (I.DOCKERFILE_NAME, I.PLACED_DIR):
            raise ConfigError(f"an input may not be named {relative.strip('/').split('/', 1)[0]} (sparkctl writes that)",
                              file=chain.file)
        try:
            found = I.collect(context, relative, exclude, arc_prefix=placed.get(relative))
        except I.MissingInput as err:
            missing.append(Missing(spec.name, relative, err.reason))
            continue
        for entry in found:
            entries.setdefault(entry.arcname, entry)
        # Parent folders of a nested input, so the context tar is well formed.
        parts = placed.get(relative, relative).strip("/").split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            entries.setdefault(folder, I.ContextFile(arcname=folder, kind="dir", mode=0o755))
    return sorted(entries.values(), key=lambda e: e.arcname)


def _busybox_entries(missing: list[Missing]) -> list[I.ContextFile]:
    busybox = shutil.which("busybox") or next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).exists()), None)
    if busybox is None:
        missing.append(Missing("base", "busybox", "not installed (apt-get install busybox-static)"))
        return []
    busybox = str(Path(busybox).resolve())
    if not I.is_static_elf(busybox):
        missing.append(Missing("base", busybox, "is dynamically linked; an image has no libc for it (apt-get install busybox-static)"))
        return []
    listing = subprocess.run([busybox, "--list"], capture_output=True, text=True, timeout=10)
    applets = sorted({a.strip() for a in listing.stdout.split() if a.strip() and "/" not in a} - {"busybox"})
    entries = [I.ContextFile(arcname=d, kind="dir", mode=0o1777 if d == "tmp" else 0o755)
               for d in ("bin", "dev", "etc", "proc", "root", "sys", "tmp", "usr", "usr/bin", "usr/local", "usr/local/bin", "var")]
    st = Path(busybox).stat()
    entries.append(I.ContextFile(arcname="bin/busybox", kind="file", mode=0o755, size=st.st_size, source=busybox,
                                 digest=I.file_digest(busybox)))
    entries += [I.ContextFile(arcname=f"bin/{a}", kind="symlink", mode=0o777, linkname="busybox") for a in applets]
    return entries


STANDIN_ROOTFS_MAKER = "sparkctl.standin.rootfs:write_rootfs_tar"


def _standin_tarball(missing: list[Missing]) -> str | None:
    """The stand-in engine's rootfs (this machine's python3 + the engine), written to the cache.

    Deterministic bytes for the same inputs, so an unchanged base keeps its hash and is not
    imported again."""
    # Found by name, only when a chain asks for the stand-in: the image planner does not depend on
    # the stand-in engine (a test fixture), the chain's data does.
    module, _, name = STANDIN_ROOTFS_MAKER.partition(":")
    write_rootfs_tar = getattr(importlib.import_module(module), name)
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / "standin-rootfs.tar"
    try:
        write_rootfs_tar(path)
    except (OSError, RuntimeError, ValueError) as err:
        missing.append(Missing("base", "standin_engine", f"cannot make the stand-in rootfs: {err}"))
        return None
    return str(path)


def _base_plan(chain: Chain, context: Path, missing: list[Missing]) -> BasePlan:
    base = chain.spec.base
    if base.image is not None:
        return BasePlan(kind="image", tag=base.image, image=base.image)
    rootfs = base.rootfs
    assert rootfs is not None and base.tag is not None
    entries: dict[str, I.ContextFile] = {}
    tarball = None
    if rootfs.tarball:
        path = Path(rootfs.tarball).expanduser()
        path = path if path.is_absolute() else chain.folder / path
        if not path.is_file():
            missing.append(Missing("base", str(path), "rootfs tarball not found"))
        else:
            tarball = str(path)
    if rootfs.standin_engine:
        tarball = _standin_tarball(missing)
    if rootfs.busybox:
        for entry in _busybox_entries(missing):
            entries[entry.arcname] = entry
    if rootfs.tree:
        try:
            for entry in I.collect(context, rootfs.tree.rstrip("/") + "/", chain.spec.exclude, arc_prefix=""):
                entries[entry.arcname] = entry
        except I.MissingInput as err:
            missing.append(Missing("base", rootfs.tree, err.reason))
    ordered = sorted(entries.values(), key=lambda e: e.arcname)
    extra = {"changes": list(rootfs.changes), "tarball": I.file_digest(tarball) if tarball else None}
    inputs_hash = None if any(m.layer == "base" for m in missing) else I.inputs_hash("", {}, ordered, extra)
    return BasePlan(kind="rootfs", tag=base.tag, entries=ordered, changes=list(rootfs.changes),
                    inputs_hash=inputs_hash, tarball=tarball)


# ---------------------------------------------------------------------------------------------
# Patch destinations


def _listing(chain: Chain, base: BasePlan) -> tuple[set[str], str | None]:
    """Absolute paths known to exist in the base (files and folders), and where that knowledge comes from."""
    known: set[str] = set()
    source = None
    if base.kind == "rootfs":
        for entry in base.entries:
            known.add("/" + entry.arcname.strip("/"))
        source = f"base rootfs {base.tag}"
    if chain.spec.base.files:
        path = chain.folder / chain.spec.base.files
        if not path.is_file():
            raise ConfigError(f"base file listing {chain.spec.base.files!r} not found", file=chain.file, field="base.files",
                              line=chain.doc.line_of(("base", "files")))
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.split("#", 1)[0].strip()
            if line:
                absolute = line if line.startswith("/") else f"{chain.spec.package_root}/{line}"
                known.add(absolute.rstrip("/"))
        source = f"{chain.spec.base.files} (listing of the base)"
    # Every folder above a known path exists too.
    for path in list(known):
        parent = posixpath.dirname(path)
        while parent not in ("/", "") and parent not in known:
            known.add(parent)
            parent = posixpath.dirname(parent)
    return known, source


def _layer_outputs(chain: Chain, layer: LayerPlan, spec_layer: LayerDef) -> set[str]:
    """Absolute paths a layer's COPY lines create (from the inputs it copies)."""
    out: set[str] = set()
    root = chain.spec.package_root
    for copy in spec_layer.spec.copy_:
        dest = _dest(root, copy.dest, copy.is_dir)
        src = copy.src.strip("/")
        for entry in layer.files:
            if copy.is_dir and entry.arcname.startswith(src + "/"):
                out.add(dest.rstrip("/") + "/" + entry.arcname[len(src) + 1:])
            elif not copy.is_dir and entry.arcname == src:
                out.add(dest + posixpath.basename(src) if dest.endswith("/") else dest)
    for path in list(out):
        parent = posixpath.dirname(path)
        while parent not in ("/", "") and parent not in out:
            out.add(parent)
            parent = posixpath.dirname(parent)
    return out


def suggest(dest: str, existing_dir: str, names: list[str]) -> str | None:
    """A hint for a missing ``dest``: the closest name in its deepest existing folder."""
    remainder = dest[len(existing_dir.rstrip("/")) + 1:] if dest.startswith(existing_dir.rstrip("/") + "/") else dest
    wanted = remainder.split("/", 1)[0]
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.75)
    if not close:
        return None
    return f"(the image has {existing_dir.rstrip('/')}/{close[0]}/, not {wanted}/)" if "/" in remainder else \
        f"(the image has {existing_dir.rstrip('/')}/{close[0]}, not {wanted})"


def check_patch_targets(chain: Chain, base: BasePlan, layers: list[LayerPlan], defs: list[LayerDef]) -> list[PatchTarget]:
    """Static check of patch destinations against the base listing and what the layers below copy in."""
    if not chain.spec.patches:
        return []
    known, source = _listing(chain, base)
    added: dict[str, str] = {}
    for plan, spec_layer in zip(layers, defs):
        if spec_layer.spec.patches:
            break
        for path in _layer_outputs(chain, plan, spec_layer):
            added.setdefault(path, f"layer {plan.name}")
    root = chain.spec.package_root
    out = []
    for patch in chain.spec.patches:
        dest = f"{root}/{patch.dest}"
        if dest in added:
            out.append(PatchTarget(patch.key, patch.file, dest, "present", added[dest]))
        elif dest in known:
            out.append(PatchTarget(patch.key, patch.file, dest, "present", source))
        elif source is None:
            out.append(PatchTarget(patch.key, patch.file, dest, "unknown", None))
        else:
            everything = known | set(added)
            folder = posixpath.dirname(dest)
            while folder not in everything and folder not in ("/", ""):
                folder = posixpath.dirname(folder)
            names = sorted({p[len(folder.rstrip('/')) + 1:].split("/", 1)[0] for p in everything
                            if p.startswith(folder.rstrip("/") + "/")})
            out.append(PatchTarget(patch.key, patch.file, dest, "missing", source + " and the layers below",
                                   suggest(dest, folder, names)))
    return out


# ---------------------------------------------------------------------------------------------


def _layer_args(layer: LayerDef, overrides: dict[str, str], used: set[str]) -> dict[str, str]:
    args = dict(layer.spec.args)
    for key, value in overrides.items():
        if key in args:
            args[key] = value
            used.add(key)
    return args


def plan_build(chain: Chain, variant: str | None = None, *, context: str | None = None,
               build_args: dict[str, str] | None = None) -> BuildPlan:
    """Everything ``sparkctl build`` would do, without an engine. Reads (and hashes) the inputs."""
    overrides = dict(build_args or {})
    context_dir = chain.resolve_context(context)
    missing: list[Missing] = []
    if not context_dir.is_dir():
        missing.append(Missing("context", str(context_dir), "build context folder not found (--context or $SPARKCTL_BUILD_CONTEXT)"))
    base = _base_plan(chain, context_dir, missing)
    defs = chain.layers(variant)
    used: set[str] = set()
    layers: list[LayerPlan] = []
    parent = base.tag
    for layer in defs:
        args = _layer_args(layer, overrides, used)
        dockerfile = render_layer(chain, layer, parent, args)
        before = len(missing)
        if context_dir.is_dir():
            files = _layer_inputs(chain, layer, context_dir, missing)
        else:  # no context at all: still name every input each layer needs (all of them at once)
            files = []
            missing.extend(Missing(layer.spec.name, relative, "needed from the build context") for relative in
                           _wanted_inputs(chain, layer))
        complete = len(missing) == before and context_dir.is_dir()
        kind = "variant" if layer.variant else ("patch" if layer.spec.patches else "overlay")
        layers.append(LayerPlan(
            name=layer.spec.name, tag=layer.tag, parent=parent, kind=kind, template=layer.spec.template,
            dockerfile=dockerfile, args=args, files=files,
            inputs_hash=I.inputs_hash(dockerfile, args, files) if complete else None,
        ))
        parent = layer.tag
    unknown = sorted(set(overrides) - used)
    if unknown:
        declared = sorted({k for layer in defs for k in layer.spec.args})
        raise ConfigError(f"no layer declares build argument(s) {', '.join(unknown)} (declared: {', '.join(declared) or 'none'})",
                          field="--build-arg")
    targets = check_patch_targets(chain, base, layers, defs)
    return BuildPlan(chain=chain.name, variant=variant, image=chain.final_tag(variant), context=str(context_dir),
                     base=base, layers=layers, patch_targets=targets, missing=missing)


def format_plan(plan: BuildPlan) -> str:
    lines = [f"image {plan.image}  (chain {plan.chain}{', variant ' + plan.variant if plan.variant else ''}; context {plan.context})"]
    base = plan.base
    if base.kind == "image":
        lines.append(f"  base     {base.image}  (pulled if absent)")
    else:
        lines.append(f"  base     {base.tag}  (imported: {sum(1 for e in base.entries if e.kind == 'file')} files, "
                     f"{_size(sum(e.size for e in base.entries))}; inputs {str(base.inputs_hash)[:12]})")
    for layer in plan.layers:
        files = sum(1 for f in layer.files if f.kind == "file")
        lines.append(f"  {layer.name:<8} {layer.tag}  FROM {layer.parent}; {files} files, {_size(sum(f.size for f in layer.files))}; "
                     f"inputs {str(layer.inputs_hash)[:12]}")
    for target in plan.patch_targets:
        mark = {"present": "ok", "missing": "MISSING", "unknown": "?"}[target.status]
        lines.append(f"  patch {target.name:<24} -> {target.dest}  [{mark}]" + (f" {target.hint}" if target.hint else ""))
    if plan.missing:
        lines.append(f"missing inputs ({len(plan.missing)}; how to get the build context: docs/images.md):")
        lines += [f"  {m.layer:<8} {m.path}  ({m.reason})" for m in plan.missing]
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
