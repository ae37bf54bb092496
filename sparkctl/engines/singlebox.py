"""The single-box engine: its own OpenAI-compatible server on one host (``commands/singlebox.py``,
``commands/native.py``), natively or in its README's container; no vLLM/SGLang flag surface."""

from __future__ import annotations

from sparkctl.engines.base import Engine


class SingleBox(Engine):
    name, label = "single-box", "the single-box engine"
    has_flag_surface = False
    reasoning_field = "reasoning_content"
    # Its README ("Open WebUI"): thinking is off by default and any of three switches turns it on
    # for one request (ops/smoke.THINKING_SWITCHES); each is checked on its own.
    smoke_checks = ("thinking_default_off", "thinking_kwargs", "thinking_enable", "thinking_effort", "completions")
    listens_on_serving_host = True  # its README keeps the port on 127.0.0.1: it has no authentication

    def min_free_gb(self, profile) -> float:
        # no GMU: its start guard is MIN_FREE_GIB (the single-box engine's README)
        return profile.single_box.min_free_gib * 2**30 / 1e9


ENGINE = SingleBox()
