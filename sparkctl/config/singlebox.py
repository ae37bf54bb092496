"""The profile sections of the single-box engine: how it is started natively, and its arena settings.

The single-box engine (the single-box engine's README) is one process on one DGX Spark: a plain
PyTorch engine that keeps a hot set of experts resident in an "arena" and streams the rest from
NVMe. ``native:`` says how to start it on the host (a venv's python, a server script, a working
directory, a ``.env``-style settings file rendered from the profile); ``single_box:`` holds the
settings the README documents (SPEC, DEFAULT_THINKING, ARENA_GB, PRUNE_KEEP, ...) and the
facts its arena arithmetic uses, including the measured points (one of them killed).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkctl.config.fields import not_huge

_ABSOLUTE = re.compile(r"^/[^\0\n]*\Z")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, protected_namespaces=())  # model_* fields are ours, not pydantic's

    @field_validator("*")
    @classmethod
    def _not_huge(cls, value):
        return not_huge(value)


class Native(_Strict):
    """The engine as a process on the host (no container)."""

    workdir: str  # the engine's checkout on the host; the command runs there
    # the program and its arguments; a relative program path (.venv/bin/python) is under workdir
    command: list[str] = [".venv/bin/python", "server/app.py", "--engine", "v41"]
    stop_grace_s: int = Field(default=30, ge=1)  # SIGTERM, then SIGKILL after this many seconds
    memory_back_timeout_s: int = Field(default=120, ge=0)  # stop waits this long for MemAvailable >= min_free_gib

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not _ABSOLUTE.match(value):
            raise ValueError(f"{value!r} must be an absolute path on the host")
        return value.rstrip("/") or "/"

    @field_validator("command")
    @classmethod
    def _no_empty(cls, value: list[str]) -> list[str]:
        if not value or any(not isinstance(a, str) or a == "" for a in value):
            raise ValueError("a non-empty list of non-empty arguments")
        return value


class MeasuredPoint(_Strict):
    """One arena setting the README reports, and what happened to it."""

    prune_keep: float = Field(gt=0, le=1)
    arena_gb: float = Field(gt=0)
    max_seq: int = Field(ge=1)
    outcome: Literal["served", "killed"]
    # killed points: a configuration is refused from this context length up (the README: "0.40 is
    # for prompts under roughly 80k tokens")
    safe_below_tokens: int | None = Field(default=None, ge=1)
    note: str = ""


class SingleBox(_Strict):
    """Settings of the single-box engine (rendered to its .env) and the facts of its arena plan."""

    model_dir: str  # the checkpoint on the host (MODEL_DIR); MAX_SEQ is the profile's max_model_len
    spec: bool = True  # SPEC: DSpark speculative decoding
    default_thinking: Literal["on", "off"] = "off"  # DEFAULT_THINKING
    default_effort: int = Field(default=75, ge=1, le=100)  # DEFAULT_EFFORT
    expert_format: Literal["fp4", "cb3"] = "cb3"  # EXPERT_FORMAT
    prune_keep: float | None = Field(default=None, gt=0, le=1)  # PRUNE_KEEP (cb3: the routable keep-set)
    arena_gb: float | None = Field(default=None, gt=0)  # ARENA_GB
    arena_slots: int | None = Field(default=None, ge=1)  # fp4: an arena given as slots (the engine reports both)
    prune_rank: str = "maxmin"  # DSV41_PRUNE_RANK
    prune_source: str = "saliency"  # DSV41_PRUNE_SOURCE
    kernel: str = "triton-fp4"
    min_free_gib: float = Field(default=90, gt=0)  # MIN_FREE_GIB: the start guard
    # facts of the arena arithmetic (sources in the recipe)
    visible_gib: float = Field(gt=0)
    moe_layers: int = Field(ge=1)
    experts_per_layer: int = Field(ge=1)
    expert_weights: int = Field(ge=1)  # weights of one routed expert (3 matrices)
    fp4_bits_per_weight: float = Field(gt=0)  # e2m1 + one UE8M0 scale per 32
    cb3_slot_mb: float = Field(gt=0)  # one cb3 expert in the arena
    non_expert_gb: float = Field(ge=0)
    runtime_gb: float = Field(ge=0)  # KV, activations, CUDA context beside the arena
    prefill_chunk_gb: float = Field(ge=0)  # what one prefill chunk needs on top
    measured: list[MeasuredPoint] = []

    @field_validator("default_thinking", mode="before")
    @classmethod
    def _on_off(cls, value):
        # YAML 1.1 reads a bare on/off as a boolean
        return ("on" if value else "off") if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _arena_given(self) -> "SingleBox":
        if self.expert_format == "cb3" and self.prune_keep is None:
            raise ValueError("expert_format cb3 needs prune_keep (the keep fraction)")
        if self.expert_format == "fp4" and self.arena_gb is None and self.arena_slots is None:
            raise ValueError("expert_format fp4 needs arena_gb or arena_slots")
        return self
