"""Profiles: a named deployment (engine, TP size, engine arguments, env, container limits, memory data).

A profile is ``recipes/<name>.yaml``. It may ``extends:`` another (deep merge, child wins; a child
value of ``null`` removes the inherited key). Names starting with ``_`` are abstract bases: they
are listed by nobody and cannot be served. ``--set a.b=VALUE`` and ``--env NAME=VALUE`` change a
loaded profile without writing a file; the plan, render and serve all see the result.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkctl.config.fields import VARIABLE_RE, Address, HostPath, Name, matching, not_huge, scalar_strings
from sparkctl.config.inventory import pick_hosts
from sparkctl.config.singlebox import Native, SingleBox
from sparkctl.config.suggest import did_you_mean, model_fields_at
from sparkctl.config.yamlfile import LocatedYaml, format_loc, load_yaml_file, parse_yaml_text
from sparkctl.errors import ConfigError
from sparkctl.resources import recipes_dir
from sparkctl.secrets import MASK, is_secret_name

Capability = matching(r"[A-Z_]+", "{value!r} is not a capability name (e.g. IPC_LOCK)")
_FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*\Z")
_ULIMIT_NAMES = {"core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio", "rttime", "sigpending", "stack"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, protected_namespaces=())  # model_* fields are ours, not pydantic's

    @field_validator("*")
    @classmethod
    def _not_huge(cls, value):
        return not_huge(value)


class ImageRef(_Strict):
    name: Name  # the image chain in images/<name>/
    variant: Name | None = None
    tag: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
    size_gb: float = Field(default=0, ge=0)  # on-disk size, for doctor's free-space check


class Serving(_Strict):
    host: Address = "0.0.0.0"  # where the engine binds: an address or a name, never a word of a shell line
    port: int = Field(default=8000, ge=1, le=65535, strict=True)
    served_model_name: str = Field(default="model", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$")
    health_timeout_s: int = Field(default=1200, ge=1)
    # The API key: the name of an environment variable on the control machine, or a key file
    # (sparkctl/config/apikey.py). Never the key itself: recipes are shared and committed.
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_key_file: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_key_source(self) -> "Serving":
        if self.api_key_env and self.api_key_file:
            raise ValueError("set api_key_env or api_key_file, not both")
        return self


class Distributed(_Strict):
    launcher: Literal["native", "ray"] = "native"  # native: the engine's own multi-node rendezvous
    master_port: int = Field(default=29501, ge=1, le=65535, strict=True)
    ray_port: int = Field(default=6379, ge=1, le=65535, strict=True)


class Router(_Strict):
    """The router in front of ``replicas`` (the SGLang line's scripts/router.sh, docs/router.md):
    sglang_router 0.3.2 on the first replica's head, as a container."""

    # round_robin by default: with cache_aware every stream of one shared prompt went to one
    # replica, which queued behind its slots while the other idled (the SGLang line's "TP8 or 2 x TP4?").
    policy: Literal["round_robin", "power_of_two", "cache_aware"] = "round_robin"
    port: int = Field(default=8889, ge=1, le=65535, strict=True)
    prometheus_port: int = Field(default=29000, ge=1, le=65535, strict=True)
    request_timeout_s: int = Field(default=1800, ge=1)
    max_payload_bytes: int = Field(default=536870912, ge=1024)
    # How often the router asks each replica's /health; 3 misses take a replica out of rotation.
    health_check_interval_s: int = Field(default=10, ge=1)
    # The image the router runs from: null = the serving image (SGLang images ship sglang_router);
    # otherwise a tag, e.g. the router image `sparkctl build-router` makes for vLLM images.
    image: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
    container: str = Field(default="sparkctl-router", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    version: str = Field(default="0.3.2", pattern=r"^[0-9][0-9A-Za-z.+-]*$")


class Engram(_Strict):
    mode: Literal["disk", "memory"]  # disk: rows on local NVMe (pack-engram); memory: pinned host RAM
    disk_threads: int = Field(default=32, ge=1)
    disk_chunk: int = Field(default=16, ge=1)


class Ulimit(_Strict):
    soft: int = Field(ge=-1)
    hard: int = Field(ge=-1)

    @model_validator(mode="after")
    def _soft_below_hard(self) -> "Ulimit":
        if self.hard != -1 and (self.soft == -1 or self.soft > self.hard):
            raise ValueError(f"soft limit {self.soft} exceeds hard limit {self.hard}")
        return self

    def docker_value(self) -> str:
        return f"{self.soft}:{self.hard}"


class Container(_Strict):
    name: str = Field(default="sparkctl-engine", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    gpus: str | None = "all"  # "none": no --gpus (hosts without the NVIDIA runtime, e.g. the sandbox)
    network: str = "host"
    ipc: str = "host"
    shm_size: str | None = Field(default=None, pattern=r"^[0-9]+[bkmg]?$")
    memory: str | None = Field(default=None, pattern=r"^[0-9]+[bkmg]?$")
    ulimits: dict[str, Ulimit] = {}
    cap_add: list[Capability] = []
    model_mount: HostPath = "/model"  # where the checkpoint appears inside the container
    engram_mount: HostPath = "/engram"

    @field_validator("ulimits", mode="before")
    @classmethod
    def _parse_ulimits(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for name, limit in value.items():
            if name not in _ULIMIT_NAMES:
                raise ValueError(f"unknown ulimit {name!r} (one of {', '.join(sorted(_ULIMIT_NAMES))})")
            if isinstance(limit, int):
                out[name] = {"soft": limit, "hard": limit}
            elif isinstance(limit, str) and re.fullmatch(r"-?\d+(:-?\d+)?", limit):
                soft, _, hard = limit.partition(":")
                out[name] = {"soft": int(soft), "hard": int(hard or soft)}
            else:
                out[name] = limit
        return out

    @field_validator("gpus", mode="before")
    @classmethod
    def _no_gpus(cls, value: Any) -> Any:
        # `null` in a child profile removes the key (and brings the default back), so "none" says it.
        return None if isinstance(value, str) and value.strip().lower() in ("", "none") else value



class NcclMemory(_Strict):
    """NCCL's per-rank buffer memory: peers × (fixed + per_channel_mib × channels × buffsize/MiB)."""

    default_channels: int = Field(ge=1)
    default_buffsize: int = Field(ge=1)
    fixed_gb_per_peer: float = Field(ge=0)
    gb_per_channel_mib_per_peer: float = Field(ge=0)


class SglangMemory(_Strict):
    """What SGLang's own memory accounting on a unified-memory box needs (sparkctl/ops/plan_sglang.py;
    sources in recipes/_dsv41-sglang.yaml)."""

    node_memory_gib: float = Field(gt=0)
    experts_gib: float = Field(ge=0)
    dense_gib: float = Field(ge=0)
    dense_pad: dict[int, float] = {}  # TP -> factor on the dense weights per rank (padded heads)
    draft_gib: float = Field(default=0, ge=0)
    head_extra_gib: float = Field(default=0, ge=0)
    runtime_gb: float = Field(default=0, ge=0)
    kept_back_fraction: float = Field(default=0.05, ge=0, lt=1)
    kept_back_gb: float = Field(default=0.1, ge=0)
    nccl_connections: int = Field(ge=0)
    nccl_connections_at_channels: int = Field(ge=1)
    nccl_connections_at_peers: int = Field(ge=1)
    nccl_ll_mib: float = Field(default=0.5, ge=0)
    nccl_ll128_default_bytes: int = Field(ge=0)
    indexer_bytes_per_chunk_token: float = Field(ge=0)
    indexer_logits_budget_bytes: int = Field(ge=1)


class MemoryData(_Strict):
    """Model and hardware facts the memory plan computes with (sources in the recipe comments)."""

    unified_memory_gb: float = Field(gt=0)
    weights_total_gb: float = Field(ge=0)
    engram_total_gb: float = Field(ge=0)
    engram_memory_gpu_total_gb: float = Field(default=0, ge=0)
    kv_bytes_per_token: float = Field(gt=0)
    activation_bytes_per_batched_token: float = Field(default=0, ge=0)
    cuda_graphs_gb: float = Field(default=0, ge=0)
    autotune_spike_gb: float = Field(default=0, ge=0)
    nccl: NcclMemory
    sglang: SglangMemory | None = None  # SGLang's own budget (the SGLang line); None: the generic plan


class Slo(_Strict):
    ttft_ms: float = Field(default=1000, gt=0)
    tokens_per_s: float = Field(default=20, gt=0)


class Profile(_Strict):
    name: Name
    description: str = ""
    extends: str | None = None
    engine: Literal["vllm", "sglang", "single-box"]
    engine_version: str = Field(pattern=r"^[0-9][0-9A-Za-z.+-]*$")
    image: ImageRef
    tensor_parallel: int = Field(ge=1, le=64)
    # Independent copies of the deployment, each on its own tensor_parallel hosts, behind one router.
    replicas: int = Field(default=1, ge=1, le=64)
    router: Router = Router()
    gpu_memory_utilization: float = Field(gt=0, le=1)
    max_model_len: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    block_size: int = Field(ge=1)
    engine_args: dict[str, Any] = {}
    engram: Engram
    autotune: bool = True
    env: dict[str, str] = {}
    container: Container = Container()
    serving: Serving = Serving()
    distributed: Distributed = Distributed()
    memory: MemoryData
    slo: Slo = Slo()
    # docker: the engine in a container (every engine); native: a process on the host from
    # ``native:`` (the single-box engine, one host)
    launcher: Literal["docker", "native"] = "docker"
    native: Native | None = None
    single_box: SingleBox | None = None

    @model_validator(mode="after")
    def _launcher_needs(self) -> "Profile":
        if self.launcher == "native" and self.native is None:
            raise ValueError("launcher native needs a native: section (workdir, command)")
        if self.launcher == "native" and self.engine != "single-box":
            raise ValueError(f"launcher native starts the single-box engine; engine {self.engine} runs in containers")
        if self.launcher == "native" and self.tensor_parallel != 1:
            raise ValueError("launcher native runs one process on one host: tensor_parallel must be 1")
        if self.engine == "single-box" and self.single_box is None:
            raise ValueError("engine single-box needs a single_box: section")
        if self.replicas > 1 and self.launcher == "native":
            raise ValueError("replicas run in containers behind the router; launcher native serves one box")
        if self.replicas > 1 and self.router.port in (self.serving.port, self.distributed.master_port):
            raise ValueError(f"router.port {self.router.port} is taken by the first replica's head "
                             "(serving.port or distributed.master_port)")
        return self

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        return scalar_strings(value, name="environment variable", value_is="an environment value", true_false=("1", "0"))

    @field_validator("engine_args")
    @classmethod
    def _flag_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _FLAG_NAME.match(key):
                raise ValueError(f"{key!r}: engine_args keys are flag names without dashes, e.g. 'max-model-len'")
        return value


class LoadedProfile:
    """A validated profile plus where it came from (for messages and for ``profiles --json``)."""

    def __init__(self, profile: Profile, path: str, chain: list[str], overrides: list[str]):
        self.profile, self.path, self.chain, self.overrides = profile, path, chain, overrides

    @property
    def recorded_overrides(self) -> list[str]:
        """The overrides as hosts may keep them (deployment record, audit log): ``--env`` values
        are left out — they are often tokens, and only engine.env (mode 0600) may hold them."""
        recorded = []
        for override in self.overrides:
            key = override.partition("=")[0]
            if override.startswith(("env ", "env.")):  # --env NAME=V, --set env.NAME=V
                recorded.append(key + "=(not recorded)")
            elif is_secret_name(key.strip()):
                recorded.append(f"{key}={MASK}")
            else:
                recorded.append(override)
        return recorded


def available_profiles(recipes: Path | None = None) -> dict[str, Path]:
    """Profile name -> file. ``$SPARKCTL_RECIPES`` (a ':'-separated list of folders) is searched
    before the built-in recipes, so a user adds or shadows a profile by adding a file."""
    folders = [Path(p) for p in os.environ.get("SPARKCTL_RECIPES", "").split(":") if p]
    folders.append(recipes or recipes_dir())
    found: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def _deep_merge(base: dict, child: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in child.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _resolve(name: str, recipes: dict[str, Path], seen: list[str]) -> tuple[dict, list[str], dict[str, LocatedYaml]]:
    if name in seen:
        raise ConfigError(f"profile inheritance loops: {' -> '.join(seen + [name])}", file=str(recipes[seen[-1]]), field="extends")
    if name not in recipes:
        known = ", ".join(n for n in recipes if not n.startswith("_"))
        where = {"file": str(recipes[seen[-1]]), "field": "extends"} if seen else {}
        raise ConfigError(f"unknown profile {name!r}{did_you_mean(name, recipes)} (known: {known})", **where)
    doc = load_yaml_file(recipes[name])
    if not isinstance(doc.data, dict):
        raise ConfigError("a profile is a YAML mapping", file=doc.file, line=doc.line_of(()))
    data = doc.data
    docs = {name: doc}
    parent = data.get("extends")
    if parent is None:
        return data, [name], docs
    if not isinstance(parent, str):
        raise ConfigError("must be a profile name", file=doc.file, field="extends", line=doc.line_of(("extends",)))
    base, chain, parent_docs = _resolve(parent, recipes, seen + [name])
    docs.update(parent_docs)
    merged = _deep_merge(base, data)
    return merged, [name] + chain, docs


def parse_assignment(text: str, option: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{option} expects KEY=VALUE, got {text!r}")
    return key.strip(), value


def apply_set(data: dict, assignment: str) -> None:
    """``engine_args.max-model-len=524288``: the value is read as YAML, so numbers and booleans keep their type."""
    key, raw = parse_assignment(assignment, "--set")
    try:
        value = parse_yaml_text(raw, "--set").data if raw.strip() else ""
    except ConfigError as err:  # the value's own YAML: name the option, not a pseudo-file
        raise ConfigError(err.detail, field=f"--set {key}") from None
    parts = key.split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {key!r}: {'.'.join(parts[: depth + 1])} is not a mapping", field=key)
        node = child
    if value is None:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value


def load_profile(
    name: str,
    *,
    sets: list[str] = (),
    envs: list[str] = (),
    recipes: Path | None = None,
) -> LoadedProfile:
    """Resolve ``extends``, apply ``--set`` then ``--env``, validate. Errors name file, field and line."""
    available = available_profiles(recipes)
    if name.endswith((".yaml", ".yml")) or "/" in name:
        # A profile given as a file: its siblings may be extended too, then the known profiles.
        path = Path(name)
        if not path.is_file():  # a folder or a device named here is no profile either, but it is there
            raise ConfigError("not a regular file (a folder, device, pipe or socket)" if path.exists() else
                              "a symbolic link to a file that is not there" if path.is_symlink() else
                              "profile file not found", file=name)
        siblings = {p.stem: p for p in sorted(path.parent.glob("*.yaml"))}
        available = {**available, **siblings, path.stem: path}
        name = path.stem
    if name.startswith("_") and name in available:
        raise ConfigError(f"profile {name!r} is an abstract base; pick one that extends it")
    data, chain, docs = _resolve(name, available, [])
    data.pop("extends", None)
    data.setdefault("name", name)
    for assignment in sets:
        key = assignment.partition("=")[0].strip()
        if key in ("name", "extends"):  # read before any --set: a --set of them would be silently ignored
            raise ConfigError(f"a profile's {key} is not a setting --set can change; name another profile with "
                              "--profile (a file works too: --profile path/to/profile.yaml)", field=f"--set {key}")
        apply_set(data, assignment)
    env_overrides = {}
    for assignment in envs:
        key, value = parse_assignment(assignment, "--env")
        if not VARIABLE_RE.match(key):
            raise ConfigError(f"{key!r} is not a valid environment variable name", field="--env")
        env_overrides[key] = value
    if env_overrides:
        env = data.get("env") or {}
        if not isinstance(env, dict):  # a --set env=... that is no mapping: --env has nothing to add to
            raise ConfigError(f"must be a mapping of variable names to values, not {type(env).__name__} (--env adds to it)",
                              field="env")
        data["env"] = {**env, **env_overrides}
    try:
        profile = Profile.model_validate(data)
    except ValidationError as err:
        raise _profile_error(err, chain, docs, available, sets) from None
    profile.name = name
    return LoadedProfile(profile, str(available[name]), chain, list(sets) + [f"env {e}" for e in envs])


def _profile_error(err: ValidationError, chain: list[str], docs: dict[str, LocatedYaml], available, sets) -> ConfigError:
    first = err.errors()[0]
    loc = tuple(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    elif first["type"] == "missing":
        message = "required field is missing"
    field = format_loc(loc)
    # A --set on this path (or under it, or above it) is the likeliest culprit, and the last one of the
    # same key is the one that counts; otherwise the nearest file in the chain that says it.
    if first["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
        message += did_you_mean(loc[-1], model_fields_at(Profile, [str(p) for p in loc[:-1]]))
    for assignment in reversed(list(sets)):
        if _overlaps(loc, assignment.partition("=")[0].strip().split(".")):
            return ConfigError(f"{message} (from --set {_shown(assignment)})", field=field)
    for profile_name in chain:
        doc = docs[profile_name]
        if loc in doc.lines:
            return ConfigError(message, file=doc.file, field=field, line=doc.lines[loc])
    doc = docs[chain[0]]
    return ConfigError(message, file=doc.file, field=field, line=doc.line_of(loc))


def _overlaps(loc: tuple, parts: list[str]) -> bool:
    """Whether a validation error at ``loc`` concerns a ``--set`` of ``parts``: one is a prefix of the other."""
    shown = [str(p) for p in loc]
    common = min(len(shown), len(parts))
    return shown[:common] == parts[:common]


def _shown(assignment: str) -> str:
    """A --set as an error may show it: the value of a secret-looking key masked."""
    key, _, value = assignment.partition("=")
    return f"{key}={MASK}" if is_secret_name(key.strip()) and value else assignment


def select_hosts(profile: Profile, hosts: list, wanted: list[str] | None):

    """The hosts a profile runs on, rank order: the head first, then workers in inventory order.

    With ``--hosts`` the named hosts are used (the head among them, if named, is rank 0).
    Returns (hosts, note) where note says which were picked when the inventory has more.
    """
    tp = profile.tensor_parallel
    if wanted:
        picked = pick_hosts(hosts, wanted)
        picked.sort(key=lambda h: (not h.is_head, wanted.index(h.name)))
        if len(picked) != tp:
            raise ConfigError(f"profile {profile.name!r} needs {tp} hosts (tensor_parallel={tp}); --hosts names {len(picked)}", field="--hosts")
        return picked, None
    if len(hosts) < tp:
        raise ConfigError(
            f"profile {profile.name!r} needs {tp} hosts (tensor_parallel={tp}) but the inventory has {len(hosts)}",
            field="hosts",
        )
    ordered = sorted(hosts, key=lambda h: not h.is_head)
    picked = ordered[:tp]
    note = None
    if len(hosts) > tp:
        note = f"profile {profile.name!r} uses {tp} of {len(hosts)} hosts: {', '.join(h.name for h in picked)} (pick others with --hosts)"
    return picked, note
