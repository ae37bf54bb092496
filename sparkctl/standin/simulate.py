"""Simulated serving: how long a prefill and a decode step take, and what text comes out.

The timing model is processor sharing, shaped like the TP4 vLLM report §6.1 / the TP8 vLLM report §7 (TTFT ~x3 and ITL ~x3.4
from C=1 to C=8): a request's prefill is ``ttft_base_ms + ttft_per_token_ms * prompt_tokens`` of
work, each decode step ``itl_ms``; while ``active`` requests run, work advances
``1 + coefficient * (active - 1)`` times slower (``ttft_concurrency`` for prefill,
``itl_concurrency`` for decode). ``active`` is read again every slice, so a request that starts
alone and is joined later slows down from then on. At most ``max_num_seqs`` run; the rest wait,
and their wait counts in their TTFT, as in a real engine.

Tokens are words: ``count_tokens`` splits on words and punctuation, so a client that sends N
words gets about N prompt tokens, and every generated token is one word.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, fields
from typing import Callable, List, Mapping, Optional, Tuple

_TOKEN = re.compile(r"\w+|[^\w\s]")
# Per message the chat template adds role markers and separators (DeepSeek's template: a few tokens).
CHAT_TOKENS_PER_MESSAGE = 3
CHAT_TOKENS_PER_PROMPT = 2
IMAGE_TOKENS = 256

VOCAB = (
    "the model answers in plain words so that every token is one word and the benchmark can count "
    "them exactly while the timing follows prompt length and concurrency like a real engine on four "
    "sparks with tensor parallel ranks sharing memory bandwidth across the fabric"
).split()


def env_number(env: Mapping[str, str], key: str, kind, default, error: type):
    """The non-negative number in ``env[key]`` (``default`` when unset or empty); a bad value raises
    ``error`` naming the variable (each stand-in has its own startup error)."""
    raw = env.get(key, "")
    if raw == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise error(f"{key}={raw!r} is not a valid {kind.__name__}") from None
    if value < 0:
        raise error(f"{key}={raw!r} must not be negative")
    return value


@dataclass
class Timing:
    ttft_base_ms: float = 25.0
    ttft_per_token_ms: float = 0.02
    ttft_concurrency: float = 0.3
    itl_ms: float = 10.0
    itl_concurrency: float = 0.35
    answer_tokens: int = 48  # a natural answer's length (finish_reason "stop")
    reasoning_tokens: int = 16  # thinking before the answer when thinking is on

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Timing":
        from .settings import StartupError

        timing = cls()
        for f in fields(cls):
            key = "SPARKCTL_STANDIN_" + f.name.upper()
            if env.get(key, "") == "":
                continue
            setattr(timing, f.name, env_number(env, key, int if f.type in (int, "int") else float, None, StartupError))
        return timing

    def prefill_ms(self, prompt_tokens: int) -> float:
        return self.ttft_base_ms + self.ttft_per_token_ms * prompt_tokens

    @staticmethod
    def slowdown(coefficient: float, active: int) -> float:
        return 1.0 + coefficient * max(0, active - 1)

    def expected_ttft_ms(self, prompt_tokens: int, active: int) -> float:
        """TTFT when ``active`` requests stay running the whole time (no queueing)."""
        return self.prefill_ms(prompt_tokens) * self.slowdown(self.ttft_concurrency, active)

    def expected_itl_ms(self, active: int) -> float:
        return self.itl_ms * self.slowdown(self.itl_concurrency, active)


class Scheduler:
    """Admission (at most ``max_running`` at once) and the simulated clock of prefill and decode."""

    SLICE_MS = 5.0

    def __init__(self, timing: Timing, max_running: int, sleep: Callable[[float], None] = time.sleep):
        self.timing = timing
        self.max_running = max(1, max_running)
        self._sleep = sleep
        self._cond = threading.Condition()
        self.running = 0
        self.waiting = 0

    def admit(self) -> None:
        with self._cond:
            self.waiting += 1
            try:
                while self.running >= self.max_running:
                    self._cond.wait()
            finally:
                self.waiting -= 1
            self.running += 1

    def release(self) -> None:
        with self._cond:
            self.running -= 1
            self._cond.notify()

    def prefill(self, prompt_tokens: int) -> None:
        remaining = self.timing.prefill_ms(prompt_tokens)
        while remaining > 0:
            step = min(remaining, self.SLICE_MS)
            self._sleep(step * self.timing.slowdown(self.timing.ttft_concurrency, self.running) / 1000.0)
            remaining -= step

    def decode_step(self) -> None:
        self._sleep(self.timing.itl_ms * self.timing.slowdown(self.timing.itl_concurrency, self.running) / 1000.0)


# ---------------------------------------------------------------------------------------------
# Tokens


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def message_tokens(content) -> int:
    """Tokens of one chat message's content: a string, or OpenAI content parts (text and images)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return count_tokens(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict):
                if part.get("type") == "text":
                    total += count_tokens(str(part.get("text", "")))
                elif part.get("type") in ("image_url", "input_image", "image"):
                    total += IMAGE_TOKENS
        return total
    raise ValueError("message content must be a string or a list of content parts")


def chat_prompt_tokens(messages: list) -> int:
    return CHAT_TOKENS_PER_PROMPT + sum(CHAT_TOKENS_PER_MESSAGE + message_tokens(m.get("content")) for m in messages)


def word(index: int, seed: int = 0) -> str:
    return " " + VOCAB[(seed + index * 7) % len(VOCAB)]


@dataclass(frozen=True)
class OutputPlan:
    reasoning: int  # tokens of thinking (reasoning_content), first
    content: int  # tokens of the answer
    finish_reason: str  # "stop" or "length"

    @property
    def total(self) -> int:
        return self.reasoning + self.content


def plan_output(*, prompt_tokens: int, max_tokens: Optional[int], max_model_len: int, thinking: bool,
                ignore_eos: bool, timing: Timing) -> OutputPlan:
    """How many tokens a request gets and why it stops. ``max_tokens`` None: up to the context end."""
    natural = (timing.reasoning_tokens if thinking else 0) + timing.answer_tokens
    limit = max_tokens if max_tokens is not None else max(0, max_model_len - prompt_tokens)
    if ignore_eos and max_tokens is not None:
        total, finish = max_tokens, "length"
    elif natural <= limit:
        total, finish = natural, "stop"
    else:
        total, finish = limit, "length"
    reasoning = min(timing.reasoning_tokens if thinking else 0, total)
    return OutputPlan(reasoning, total - reasoning, finish)


def output_pieces(plan: OutputPlan, *, seed: int, reasoning_parser: bool) -> List[Tuple[str, str]]:
    """Every generated token as (field, text): field is "reasoning_content" or "content".

    Without a reasoning parser the thinking stays in the content between <think> markers, as the
    real engines return it.
    """
    pieces: List[Tuple[str, str]] = []
    for i in range(plan.reasoning):
        text = word(i, seed + 1)
        if reasoning_parser:
            pieces.append(("reasoning_content", text))
        else:
            prefix = "<think>" if i == 0 else ""
            suffix = "</think>" if i == plan.reasoning - 1 else ""
            pieces.append(("content", prefix + text + suffix))
    for i in range(plan.content):
        pieces.append(("content", word(i, seed)))
    return pieces


# ---------------------------------------------------------------------------------------------
# Requests


class ApiError(Exception):
    """An OpenAI-style error response: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class Request:
    kind: str  # "chat" | "completion"
    prompt_tokens: int
    max_tokens: Optional[int]
    stream: bool
    include_usage: bool
    thinking: bool
    ignore_eos: bool
    seed: int


def _positive_int(body: dict, *names: str) -> Optional[int]:
    for name in names:
        if body.get(name) is not None:
            raw = body[name]
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
                raise ApiError(400, f"{name} must be a positive integer, got {raw!r}", param=name)
            return raw
    return None


def parse_request(kind: str, body, *, served_model_name: str, max_model_len: int,
                  default_chat_kwargs: Mapping[str, object], prompt_tokens: Optional[int] = None,
                  engine: str = "vllm") -> Request:
    """Validate an OpenAI request body the way vLLM does (400 / 404 ApiError). A completion's
    ``prompt_tokens``, when given, is its prompt already counted (``prompts.completion_prompts``)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_model_name:
        raise ApiError(404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model")
    if body.get("n", 1) != 1:
        raise ApiError(400, "the stand-in engine serves n=1 only", param="n")
    thinking = False
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of message objects", param="messages")
        try:
            prompt_tokens = chat_prompt_tokens(messages)
        except ValueError as err:
            raise ApiError(400, str(err), param="messages") from None
        kwargs = dict(default_chat_kwargs)
        request_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(request_kwargs, dict):
            raise ApiError(400, "chat_template_kwargs must be an object", param="chat_template_kwargs")
        kwargs.update(request_kwargs)
        thinking = bool(kwargs.get("thinking", kwargs.get("enable_thinking", False)))
        text_seed = sum(len(str(m.get("content", ""))) for m in messages)
    elif prompt_tokens is not None:
        text_seed = prompt_tokens
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_tokens = count_tokens(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_tokens = len(prompt)  # token ids
        else:
            raise ApiError(400, "prompt must be a string, a list of one string, or a list of token ids", param="prompt")
        text_seed = prompt_tokens
    max_tokens = _positive_int(body, "max_completion_tokens", "max_tokens")
    check_context(prompt_tokens, max_tokens, max_model_len, engine)
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    include_usage = bool(stream and isinstance(options, dict) and options.get("include_usage"))
    return Request(kind, prompt_tokens, max_tokens, stream, include_usage, thinking,
                   bool(body.get("ignore_eos", False)), text_seed)


def check_context(prompt_tokens: int, max_tokens: Optional[int], max_model_len: int, engine: str = "vllm") -> None:
    """The engine's refusal of a prompt (and budget) that does not fit the context, in its words
    (SGLang's tokenizer manager refuses a prompt that fills the context exactly, too)."""
    if engine == "sglang":
        if prompt_tokens >= max_model_len:
            raise ApiError(400, f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                                f"({max_model_len} tokens).")
        if max_tokens is not None and prompt_tokens + max_tokens >= max_model_len:
            raise ApiError(400, f"Requested token count exceeds the model's maximum context length of {max_model_len} "
                                f"tokens. You requested a total of {prompt_tokens + max_tokens} tokens: {prompt_tokens} "
                                f"tokens from the input messages and {max_tokens} tokens for the completion. Please "
                                "reduce the number of tokens in the input messages or the completion to fit within "
                                "the limit.", param="max_tokens")
        return
    if prompt_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
        )
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
            f"length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens}).",
            param="max_tokens",
        )
