"""Image chains as data: ``images/<name>/chain.yaml`` (+ its patch manifest) -> a validated ``Chain``.

A chain is a base image, ordered layers (each a Dockerfile template plus the inputs it copies), a
patch manifest (patch file -> path inside the engine's package, the TP4 vLLM report §4.3), variants (extra
layers such as ``engram-mem`` that put original files back, the TP8 vLLM report §3) and the final tag.
Errors name the file, the field path and the YAML line, like the inventory and profiles do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkctl.config.fields import Name, matching, scalar_strings
from sparkctl.config.yamlfile import LocatedYaml, load_yaml_file, validation_error
from sparkctl.errors import ConfigError
from sparkctl.resources import images_dir, templates_dir

CHAIN_FILE = "chain.yaml"
IMAGES_ENV = "SPARKCTL_IMAGES"  # ':'-separated folders searched before the built-in images/
CONTEXT_ENV = "SPARKCTL_BUILD_CONTEXT"

# A docker image reference as sparkctl writes it: repo[:tag] (no digest: we build tags).
ImageTag = matching(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?",
                    "{value!r} is not a valid image tag (repository[:tag], lower-case repository)")
VariablePrefix = matching(r"[A-Z][A-Z0-9_]*_", "{value!r} is not a variable prefix (upper case, ending in '_')")
DEFAULT_EXCLUDE = ["__pycache__", "*.pyc", ".git"]


def _relative_path(value: str) -> str:
    """A path inside the build context: relative, no '..', no control characters."""
    if not value or value.startswith("/") or any(ch in value for ch in "\n\r\0"):
        raise ValueError(f"{value!r} must be a relative path inside the build context")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{value!r} must not leave the build context ('..')")
    if not parts:
        raise ValueError(f"{value!r} names the whole build context; name a file or folder in it")
    return value


def _no_space(value: str, what: str) -> str:
    # Dockerfile COPY arguments are whitespace-separated; a space would silently split a path.
    if any(ch.isspace() for ch in value):
        raise ValueError(f"{what} {value!r} contains whitespace")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CopySpec(_Strict):
    src: str  # in the build context; a trailing '/' copies a folder's contents
    dest: str = "."  # absolute, or relative to the chain's package_root ("." = package_root itself)

    @field_validator("src")
    @classmethod
    def _src(cls, value: str) -> str:
        return _no_space(_relative_path(value), "src")

    @field_validator("dest")
    @classmethod
    def _dest(cls, value: str) -> str:
        if ".." in value.split("/"):
            raise ValueError(f"{value!r} must not contain '..'")
        return _no_space(value, "dest")

    @property
    def is_dir(self) -> bool:
        return self.src.endswith("/")


class VerifySpec(_Strict):
    command: str  # run in the layer (RUN); its output must contain `expect`
    expect: str


class LayerSpec(_Strict):
    name: Name
    template: str  # under templates/ (or the chain's own folder)
    tag: ImageTag | None = None  # default: <repository of the final tag>:<name>
    description: str = ""
    args: dict[str, str] = {}
    copy_: list[CopySpec] = Field(default=[], alias="copy")
    run: list[str] = []
    verify: VerifySpec | None = None
    patches: bool = False  # this layer applies the patch manifest
    env: dict[str, str] = {}  # ENV lines (e.g. the PYTHONPATH that makes an adapter's sitecustomize load)
    entrypoint: list[str] | None = None  # ENTRYPOINT (JSON form); [] clears the base's

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        out = scalar_strings(value, name="environment variable", value_is="an environment value", true_false=("true", "false"))
        for key, text in out.items() if isinstance(out, dict) else ():
            if any(ch.isspace() or ch in "\"'$" for ch in text):
                # ENV KEY=VALUE: whitespace would start another pair, quotes and $ are interpreted
                raise ValueError(f"{key}: {text!r} contains whitespace, a quote or '$'")
        return out

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, value: Any) -> Any:
        return scalar_strings(value, name="build argument", value_is="a build argument", true_false=("true", "false"))



class PatchSpec(_Strict):
    file: str  # in the build context
    dest: str  # relative to package_root, as the TP4 vLLM report's "Mount path" column
    name: str | None = None  # what variants call it; default: the file's base name
    purpose: str = ""

    @field_validator("file")
    @classmethod
    def _file(cls, value: str) -> str:
        if value.endswith("/"):
            raise ValueError(f"{value!r}: a patch is one file, not a folder")
        return _no_space(_relative_path(value), "file")

    @field_validator("dest")
    @classmethod
    def _dest(cls, value: str) -> str:
        return _no_space(_relative_path(value), "dest")

    @property
    def key(self) -> str:
        return self.name or self.file.rsplit("/", 1)[-1]


class RootfsSpec(_Strict):
    """A base made here and `docker import`ed: a static busybox and/or a rootfs tarball, plus a tree."""

    busybox: bool = False  # the static busybox of this machine (Debian: busybox-static) with its applets
    standin_engine: bool = False  # this machine's python3 + the stand-in engine (sparkctl/standin/rootfs.py)
    tarball: str | None = None  # e.g. a cached `debootstrap --variant=minbase` rootfs (relative: to the chain)
    tree: str | None = None  # a folder laid over it (relative to the build context)
    changes: list[str] = []  # Dockerfile instructions applied by `docker import --change`

    @model_validator(mode="after")
    def _something(self) -> "RootfsSpec":
        if not (self.busybox or self.standin_engine or self.tarball or self.tree):
            raise ValueError("a rootfs base needs busybox: true, standin_engine: true, a tarball or a tree")
        if self.standin_engine and self.tarball:
            raise ValueError("standin_engine and tarball both make the base's tarball; pick one")
        for change in self.changes:
            if change.split(" ", 1)[0].upper() not in ("ENTRYPOINT", "CMD", "ENV", "WORKDIR", "USER", "LABEL", "EXPOSE", "VOLUME", "ONBUILD", "STOPSIGNAL"):
                raise ValueError(f"{change!r}: docker import accepts only config instructions (ENTRYPOINT, CMD, ENV, ...)")
        return self


class BaseSpec(_Strict):
    image: str | None = None  # a registry image (pulled when absent)
    rootfs: RootfsSpec | None = None
    tag: ImageTag | None = None  # for rootfs bases: the tag of the imported image
    files: str | None = None  # a listing of package files known to exist in the base (for --dry-run)

    @model_validator(mode="after")
    def _one_kind(self) -> "BaseSpec":
        if (self.image is None) == (self.rootfs is None):
            raise ValueError("a base is either `image: REF` or `rootfs: {...}`, exactly one of them")
        if self.rootfs is not None and not self.tag:
            raise ValueError("a rootfs base needs a `tag` for the imported image")
        return self


class VariantSpec(_Strict):
    """Either a revert layer on top of the chain (``template`` + ``originals`` + ``revert``, like
    vllm-dsv41's engram-mem) or a separate line from the same base (``layers``, like the SGLang
    line's TP4 production image, which its source builds from its own Dockerfile)."""

    tag: ImageTag
    description: str = ""
    template: str | None = None
    originals: str | None = None  # folder in the build context holding the unpatched files, at their dest paths
    revert: list[str] = []  # patch names (file base names) to put back
    layers: list[LayerSpec] = []  # instead of the chain's layers, from the same base

    @model_validator(mode="after")
    def _one_kind(self) -> "VariantSpec":
        reverting = self.template is not None or self.originals is not None or bool(self.revert)
        if self.layers and reverting:
            raise ValueError("a variant either reverts patches (template, originals, revert) or has its own layers, not both")
        if not self.layers and not (self.template and self.originals and self.revert):
            raise ValueError("a variant needs its own `layers`, or `template`, `originals` and `revert` (at least one patch)")
        return self


    @field_validator("originals")
    @classmethod
    def _originals(cls, value: str | None) -> str | None:
        return None if value is None else _relative_path(value)


class SwitchesSpec(_Strict):
    """The environment variables an overlay adds to the engine (its adapters' switches)."""

    file: str  # next to chain.yaml: one name a line, '#' comments
    prefixes: list[VariablePrefix] = []  # names under these prefixes belong to the overlay: an unlisted one is refused



class ChainSpec(_Strict):
    description: str = ""
    tag: ImageTag
    base: BaseSpec
    context: str = "."  # where inputs are found (relative: to the chain's folder; ~ expanded)
    package_root: str  # the engine's Python package inside the image; patch dests are relative to it
    exclude: list[str] = DEFAULT_EXCLUDE  # names skipped when copying folders
    layers: list[LayerSpec] = Field(min_length=1)
    patches: list[PatchSpec] = []
    variants: dict[Name, VariantSpec] = {}
    switches: SwitchesSpec | None = None


    @field_validator("package_root")
    @classmethod
    def _package_root(cls, value: str) -> str:
        if not value.startswith("/") or any(ch.isspace() for ch in value):
            raise ValueError(f"{value!r} must be an absolute path without spaces")
        return value.rstrip("/")


@dataclass(frozen=True)
class LayerDef:
    """One layer to build, in chain order (the variant's layer last)."""

    spec: LayerSpec
    tag: str
    index: int  # position in the layers list (for error messages: layers[index])
    variant: VariantSpec | None = None  # set on the variant's revert layer
    line: str | None = None  # the variant whose own `layers` this layer is in (None: the chain's layers)


class Chain:
    """A validated chain plus where it came from."""

    def __init__(self, name: str, spec: ChainSpec, folder: Path, doc: LocatedYaml):
        self.name, self.spec, self.folder, self.doc = name, spec, folder, doc

    @property
    def file(self) -> str:
        return self.doc.file

    def repository(self) -> str:
        return self.spec.tag.rsplit(":", 1)[0] if ":" in self.spec.tag.rsplit("/", 1)[-1] else self.spec.tag

    def final_tag(self, variant: str | None) -> str:
        return self.variant(variant).tag if variant else self.spec.tag

    def variant(self, name: str | None) -> VariantSpec | None:
        if name is None:
            return None
        if name not in self.spec.variants:
            known = ", ".join(self.spec.variants) or "none"
            raise ConfigError(f"unknown variant {name!r} (this chain has: {known})", file=self.file, field="variants")
        return self.spec.variants[name]

    def patch(self, key: str) -> PatchSpec:
        for patch in self.spec.patches:
            if patch.key == key:
                return patch
        raise KeyError(key)

    def layers(self, variant: str | None = None) -> list[LayerDef]:
        chosen = self.variant(variant)
        if chosen is not None and chosen.layers:
            return self._line(chosen.layers, chosen.tag, variant)
        out = self._line(self.spec.layers, self.spec.tag, None)
        count = len(self.spec.layers)
        if chosen is not None:
            spec = LayerSpec(name=variant, template=chosen.template, description=chosen.description or f"variant {variant}")
            out.append(LayerDef(spec=spec, tag=chosen.tag, index=count, variant=chosen))
        return out

    def _line(self, layers: list[LayerSpec], final: str, line: str | None) -> list[LayerDef]:
        """Layers in order, the last one tagged ``final``, the others by their own tag or name."""
        repository = final.rsplit(":", 1)[0] if ":" in final.rsplit("/", 1)[-1] else final
        out = []
        for index, layer in enumerate(layers):
            last = index == len(layers) - 1
            tag = final if last else (layer.tag or f"{repository}:{layer.name}")
            out.append(LayerDef(spec=layer, tag=tag, index=index, line=line))
        return out

    def base_tag(self) -> str:
        return self.spec.base.tag or self.spec.base.image  # type: ignore[return-value]

    def resolve_context(self, override: str | None = None) -> Path:
        raw = override or os.environ.get(CONTEXT_ENV) or self.spec.context
        path = Path(os.path.expanduser(raw))
        if not path.is_absolute():
            path = (self.folder / path) if not override and not os.environ.get(CONTEXT_ENV) else Path.cwd() / path
        return path.resolve()

    def switches(self) -> tuple[frozenset[str], tuple[str, ...]] | None:
        """The overlay's switch names and prefixes, or None when the chain declares none."""
        spec = self.spec.switches
        if spec is None:
            return None
        path = self.folder / spec.file
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"cannot read the switch list {spec.file!r}: {err.strerror or err}", file=self.file,
                              field="switches.file", line=self.doc.line_of(("switches", "file"))) from None
        names = frozenset(line.split("#", 1)[0].strip() for line in text.splitlines()) - {""}
        return names, tuple(spec.prefixes)

    def template_path(self, template: str) -> Path:
        """A chain may ship its own template (next to chain.yaml); otherwise templates/<template>."""
        own = self.folder / template
        return own if own.is_file() else templates_dir() / template


# ---------------------------------------------------------------------------------------------
# Loading


def chain_folders() -> list[Path]:
    folders = [Path(p) for p in os.environ.get(IMAGES_ENV, "").split(":") if p]
    folders.append(images_dir())
    return folders


def available_chains() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in chain_folders():
        if folder.is_dir():
            for sub in sorted(folder.iterdir()):
                if (sub / CHAIN_FILE).is_file():
                    found.setdefault(sub.name, sub)
    return found


def load_chain(name_or_path: str) -> Chain:
    """``NAME`` (searched in $SPARKCTL_IMAGES, then images/) or a path to a chain folder / chain.yaml."""
    path = Path(os.path.expanduser(name_or_path))
    if "/" in name_or_path or name_or_path.endswith(".yaml"):
        folder = path.parent if path.name == CHAIN_FILE or path.suffix == ".yaml" else path
        if not (folder / CHAIN_FILE).is_file():
            raise ConfigError(f"no {CHAIN_FILE} in this folder", file=str(folder))
    else:
        chains = available_chains()
        if name_or_path not in chains:
            raise ConfigError(f"unknown image chain {name_or_path!r} (known: {', '.join(chains) or 'none'})", field="--image")
        folder = chains[name_or_path]
    folder = folder.resolve()
    doc = load_yaml_file(folder / CHAIN_FILE)
    if not isinstance(doc.data, dict):
        raise ConfigError("an image chain is a YAML mapping", file=doc.file, line=doc.line_of(()))
    data = dict(doc.data)
    patches_doc = doc
    if isinstance(data.get("patches"), str):
        # The patch manifest in its own file (the TP4 vLLM report's table): a list of {file, dest, purpose}.
        manifest = folder / data["patches"]
        if not manifest.is_file():
            raise ConfigError(f"patch manifest {data['patches']!r} not found", file=doc.file, field="patches",
                              line=doc.line_of(("patches",)))
        patches_doc = load_yaml_file(manifest)
        if not isinstance(patches_doc.data, list):
            raise ConfigError("a patch manifest is a YAML list of {file, dest, purpose}", file=patches_doc.file,
                              line=patches_doc.line_of(()))
        data["patches"] = patches_doc.data
    try:
        spec = ChainSpec.model_validate(data)
    except ValidationError as err:
        first = _Errors(err).errors()[0]
        if first["loc"] and first["loc"][0] == "patches" and patches_doc is not doc:
            raise validation_error(_Errors(err, drop_first=True), patches_doc) from None
        raise validation_error(_Errors(err), doc) from None
    chain = Chain(folder.name, spec, folder, doc)
    _check_cross_fields(chain, patches_doc)
    return chain


class _Errors:
    """A ValidationError view for ``validation_error``: unknown fields first (a typo in a key also
    makes the real key "missing"; the typo is the message that helps), and optionally without the
    leading 'patches' (errors inside a separate manifest file)."""

    def __init__(self, err: ValidationError, drop_first: bool = False):
        self._err, self._drop = err, drop_first

    def errors(self):
        out = []
        for entry in self._err.errors():
            entry = dict(entry)
            if self._drop:
                entry["loc"] = tuple(entry["loc"][1:])
            out.append(entry)
        return sorted(out, key=lambda e: e["type"] != "extra_forbidden")


def _check_cross_fields(chain: Chain, patches_doc: LocatedYaml) -> None:
    spec, doc = chain.spec, chain.doc
    names: dict[str, int] = {}
    for index, layer in enumerate(spec.layers):
        if layer.name in names:
            raise ConfigError(f"duplicate layer name {layer.name!r} (also layers[{names[layer.name]}])", file=doc.file,
                              field=f"layers[{index}].name", line=doc.line_of(("layers", index, "name")))
        names[layer.name] = index
    patch_layers = [i for i, layer in enumerate(spec.layers) if layer.patches]
    if spec.patches and patch_layers != [len(spec.layers) - 1]:
        where = patch_layers[0] if patch_layers else len(spec.layers) - 1
        raise ConfigError("the last layer, and only it, applies the patch manifest (patches: true)", file=doc.file,
                          field=f"layers[{where}].patches", line=doc.line_of(("layers", where)))
    if patch_layers and not spec.patches:
        raise ConfigError("a layer applies patches but the chain has no patch manifest", file=doc.file, field="patches")
    tags: dict[str, str] = {}
    for layer in chain.layers():
        if layer.tag in tags:
            raise ConfigError(f"tag {layer.tag!r} is used by layers {tags[layer.tag]!r} and {layer.spec.name!r}",
                              file=doc.file, field=f"layers[{layer.index}].tag", line=doc.line_of(("layers", layer.index)))
        tags[layer.tag] = layer.spec.name
    if spec.base.tag and spec.base.tag in tags:
        raise ConfigError(f"the base tag {spec.base.tag!r} is also a layer's tag", file=doc.file, field="base.tag",
                          line=doc.line_of(("base", "tag")))
    keys: dict[str, int] = {}
    dests: dict[str, int] = {}
    for index, patch in enumerate(spec.patches):
        for seen, value, what in ((keys, patch.key, "name"), (dests, patch.dest, "destination")):
            if value in seen:
                raise ConfigError(f"duplicate patch {what} {value!r} (also [{seen[value]}])", file=patches_doc.file,
                                  field=_patch_field(patches_doc, doc, index), line=patches_doc.line_of(_patch_loc(patches_doc, doc, index)))
            seen[value] = index
    for vname, variant in spec.variants.items():
        _check_variant_layers(chain, vname, variant, tags)
        for position, key in enumerate(variant.revert):
            if key not in keys:
                raise ConfigError(f"reverts {key!r}, which is not in the patch manifest (patches: {', '.join(keys)})",
                                  file=doc.file, field=f"variants.{vname}.revert[{position}]",
                                  line=doc.line_of(("variants", vname, "revert", position)))
        if variant.tag in tags or variant.tag == spec.base.tag:
            raise ConfigError(f"variant tag {variant.tag!r} is already used in this chain", file=doc.file,
                              field=f"variants.{vname}.tag", line=doc.line_of(("variants", vname, "tag")))


def _check_variant_layers(chain: Chain, vname: str, variant: VariantSpec, chain_tags: dict[str, str]) -> None:
    """A variant's own line: unique layer names, no patch manifest (it is the chain's), tags of its own."""
    doc = chain.doc
    seen: dict[str, int] = {}
    for index, layer in enumerate(variant.layers):
        where = ("variants", vname, "layers", index)
        if layer.name in seen:
            raise ConfigError(f"duplicate layer name {layer.name!r} (also layers[{seen[layer.name]}])", file=doc.file,
                              field=f"variants.{vname}.layers[{index}].name", line=doc.line_of(where + ("name",)))
        seen[layer.name] = index
        if layer.patches:
            raise ConfigError("a variant's own layers do not apply the chain's patch manifest", file=doc.file,
                              field=f"variants.{vname}.layers[{index}].patches", line=doc.line_of(where))
    if variant.layers:
        for layer in chain.layers(vname):
            if layer.tag in chain_tags or layer.tag == chain.spec.base.tag:
                raise ConfigError(f"tag {layer.tag!r} of variant {vname!r} is already used in this chain", file=doc.file,
                                  field=f"variants.{vname}.layers[{layer.index}].tag",
                                  line=doc.line_of(("variants", vname, "layers", layer.index)))


def _patch_loc(patches_doc: LocatedYaml, doc: LocatedYaml, index: int) -> tuple:
    return (index,) if patches_doc is not doc else ("patches", index)


def _patch_field(patches_doc: LocatedYaml, doc: LocatedYaml, index: int) -> str:
    return f"[{index}]" if patches_doc is not doc else f"patches[{index}]"


def chain_for_profile(profile) -> tuple[Chain, str | None]:
    """The chain and variant a profile runs; its ``image.tag`` must be the tag that chain builds."""
    chain = load_chain(profile.image.name)
    variant = profile.image.variant
    expected = chain.final_tag(variant)
    if profile.image.tag != expected:
        what = f"variant {variant!r} of " if variant else ""
        raise ConfigError(f"profile {profile.name!r} runs {profile.image.tag!r} but {what}image chain "
                          f"{chain.name!r} builds {expected!r}", file=chain.file, field="image.tag")
    return chain, variant
