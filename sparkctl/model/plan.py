"""``model sync``'s decisions, pure: what each host lacks, whether it has room, which files can stay
behind (the Engram tables when the profile reads Engram from disk)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sparkctl.errors import ConfigError
from sparkctl.output import size_text as human  # noqa: F401  (bytes for people, as every report says them)

HUB_PREFIX = "hf:"
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# The Engram lookup tables (fp8 rows and their ue8m0 scales); the small gate is loaded as usual.
_ENGRAM_TABLE = re.compile(r"(?:^|\.)layers\.\d+\.engram\.embed\.(?:weight|scale)\Z")
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class Source:
    kind: str  # "hub" or "dir"
    repo: str | None = None
    revision: str | None = None
    path: str | None = None

    def __str__(self) -> str:
        if self.kind == "hub":
            return f"{HUB_PREFIX}{self.repo}" + (f"@{self.revision}" if self.revision else "")
        return str(self.path)


def parse_source(text: str) -> Source:
    """``hf:OWNER/NAME[@REVISION]`` or a directory path."""
    if text.startswith(HUB_PREFIX):
        repo, _, revision = text[len(HUB_PREFIX):].partition("@")
        if not _REPO_ID.match(repo) or ".." in repo:
            raise ConfigError(f"expects hf:OWNER/NAME[@REVISION], got {text!r}", field="--source")
        if "@" in text[len(HUB_PREFIX):] and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*\Z", revision):
            raise ConfigError(f"bad revision {revision!r}", field="--source")
        return Source("hub", repo=repo, revision=revision or None)
    if not text.startswith("/") and not text.startswith("."):
        text = "./" + text
    return Source("dir", path=text)


def engram_table_files(weight_map: dict[str, str]) -> list[str]:
    """The files that hold nothing but Engram tables: the ones an Engram-on-disk host can skip."""
    by_file: dict[str, list[str]] = {}
    for tensor, name in weight_map.items():
        by_file.setdefault(name, []).append(tensor)
    return sorted(name for name, tensors in by_file.items() if all(_ENGRAM_TABLE.search(t) for t in tensors))


def weight_map_of(index_text: str, where: str) -> dict[str, str]:
    try:
        data = json.loads(index_text)
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{INDEX_NAME} has no weight_map", file=where) from None
    return {str(k): str(v) for k, v in weight_map.items()}


def without(manifest: dict, names: list[str]) -> dict:
    """The manifest a host keeps when ``names`` stay behind (recorded, so doctor knows why they are absent)."""
    skipped = set(names)
    out = dict(manifest, files={n: e for n, e in manifest["files"].items() if n not in skipped})
    # A name the source lacks too (a copy that left them out already) is recorded without a size.
    left_out = {n: (manifest["files"].get(n) or {}).get("size") for n in sorted(skipped)}
    if left_out:
        out["left_out"] = left_out
    return out


@dataclass
class HostPlan:
    name: str
    send: list[dict] = field(default_factory=list)  # {"file", "offset"}
    bytes_to_send: int = 0
    resumed_bytes: int = 0  # already there in part files
    free: int = 0
    refused: str | None = None  # why nothing is sent (no room, a refused name)
    needs_manifest: bool = False  # every file is right but the kept manifest is not this one
    states: dict[str, str] = field(default_factory=dict)  # file -> ok | missing | size | content

    @property
    def unchanged(self) -> bool:
        return not self.send and not self.needs_manifest and self.refused is None


def plan_host(name: str, manifest: dict, check: dict, margin: int = 0) -> HostPlan:
    """What ``name`` must receive, from its ``check`` answer (sparkctl.model.agent.check)."""
    plan = HostPlan(name, free=int(check["free"]))
    for file in sorted(manifest["files"]):
        state = check["files"][file]
        plan.states[file] = state["state"]
        if state["state"] == "refused":
            plan.refused = f"refusing file name {file!r} (outside the checkpoint folder)"
            return plan
        if state["state"] == "ok":
            continue
        size = manifest["files"][file]["size"]
        part = int(state.get("part") or 0)
        offset = part if 0 < part <= size else 0  # a part longer than the file cannot be a prefix of it
        plan.send.append({"file": file, "offset": offset})
        plan.bytes_to_send += size - offset
        plan.resumed_bytes += offset
    kept = check.get("kept")
    plan.needs_manifest = not plan.send and (kept or {}).get("files") != manifest["files"]
    if plan.bytes_to_send + margin > plan.free:
        plan.refused = (f"not enough room: it lacks {human(plan.bytes_to_send)} ({plan.bytes_to_send} bytes) "
                        f"and its filesystem has {human(plan.free)} ({plan.free} bytes) free")
    return plan


def kept_manifest_problem(host: str, root: str, kept: dict | None, sizes: dict[str, int | None]) -> str | None:
    """Why ``host``'s checkpoint copy cannot serve as a source for its Engram shards, judged by the
    manifest ``model sync`` kept with it (None: no manifest, or nothing wrong). ``sizes``: the files
    the shards are cut from, with their size on the host (None: absent)."""
    if not kept:
        return None
    left_out = set(kept.get("left_out") or ())
    files = kept.get("files") or {}
    for name, size in sorted(sizes.items()):
        if name in left_out:
            return (f"{host}: {root}/{name} was left out by `model sync --without-engram-tables`; cut the shards "
                    f"from a full copy (pack-engram --source local --checkpoint DIR)")
        want = (files.get(name) or {}).get("size")
        if want is not None and size != want:
            return (f"{host}: {root}/{name} is {size if size is not None else 'missing'} bytes, model sync's manifest "
                    f"says {want}; run `sparkctl model sync` to repair it")
    return None
