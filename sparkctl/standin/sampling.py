"""A chat or completion request checked the way the engines check it, beyond what ``simulate`` reads.

``simulate.parse_request`` reads the prompt, the model and the token budget; this adds the
sampling parameters and output options clients send, refused like vLLM 0.33.0's protocol models
and ``SamplingParams`` refuse them (a wrong JSON type is a validation error, "Bad Request"; a value
out of range is ``BadRequestError`` with the engine's own sentence, e.g. "temperature must be
non-negative, got -1.0."), and keeps what the stand-in honours: ``n``, ``stop``, ``logprobs`` /
``top_logprobs``, ``response_format``, ``tools`` / ``tool_choice``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from . import tools as T
from .prompts import DEFAULT_COMPLETION_MAX_TOKENS, Prompt, check_logit_bias, completion_prompts
from .simulate import ApiError, Request, check_context, parse_request

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
ROLES = ("system", "user", "assistant", "tool", "developer", "function")


@dataclass(frozen=True)
class ApiRequest:
    base: Request  # prompt tokens, budget, stream, usage, thinking (simulate)
    body: dict
    n: int
    stop: List[str]
    include_stop: bool
    logprobs: Optional[int]  # None: no logprobs; else how many top alternatives per token
    response_format: str  # "text" | "json_object" | "json_schema"
    json_schema: Optional[dict]
    tool: Optional[dict]  # the function the answer calls
    prompts: Tuple[Prompt, ...] = ()  # a completion's prompts (a batch: one choice per prompt and n)
    continuous_usage: bool = False  # stream_options.continuous_usage_stats, as the engine reads it
    model: Optional[str] = None  # the answer's "model" (SGLang echoes the request's)

    @property
    def prompt_tokens(self) -> int:
        """Every prompt's tokens (what the request holds in the KV cache)."""
        return sum(p.tokens for p in self.prompts) if self.prompts else self.base.prompt_tokens


def _type_error(param: str, what: str, value) -> ApiError:
    return ApiError(400, f"1 validation error for request\n{param}\n  Input should be {what} "
                         f"[input_value={value!r}]", kind="Bad Request", param=param)


def _number(body: dict, name: str) -> Optional[float]:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(name, "a valid number", value)
    return float(value)


def _integer(body: dict, name: str) -> Optional[int]:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "a valid integer", value)
    return value


def _check_sampling(body: dict) -> None:
    """``SamplingParams._verify_args``: the same checks, the same sentences."""
    temperature = _number(body, "temperature")
    if temperature is not None and temperature < 0:
        raise ApiError(400, f"temperature must be non-negative, got {temperature}.", param="temperature")
    top_p = _number(body, "top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    top_k = _integer(body, "top_k")
    if top_k is not None and top_k < -1:
        raise ApiError(400, f"top_k must be 0 (disable), or at least 1, got {top_k}.", param="top_k")
    min_p = _number(body, "min_p")
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise ApiError(400, f"min_p must be in [0, 1], got {min_p}.", param="min_p")
    for name in ("presence_penalty", "frequency_penalty"):
        value = _number(body, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise ApiError(400, f"{name} must be in [-2, 2], got {value}.", param=name)
    repetition = _number(body, "repetition_penalty")
    if repetition is not None and repetition <= 0:
        raise ApiError(400, f"repetition_penalty must be greater than zero, got {repetition}.",
                       param="repetition_penalty")
    for name in ("max_tokens", "max_completion_tokens"):
        value = _integer(body, name)
        if value is not None and value < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {value}.", param=name)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _type_error("seed", "a valid integer", seed)
    if seed is not None and not -2 ** 63 <= seed < 2 ** 63:  # the OpenAPI's bounds: a 64-bit integer
        bound = "greater than or equal to -9223372036854775808" if seed < 0 else \
            "less than or equal to 9223372036854775807"
        raise _type_error("seed", bound, seed)


def _stop(body: dict) -> List[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > 4:
            raise ApiError(400, "1 validation error for request\nstop\n  List should have at most 4 items after "
                                f"validation, not {len(stop)}", kind="Bad Request", param="stop")
        return [s for s in stop if s]
    raise _type_error("stop", "a valid string or a list of strings", stop)


def _logprobs(kind: str, body: dict) -> Optional[int]:
    if kind == "chat":
        wanted = body.get("logprobs")
        if wanted is not None and not isinstance(wanted, bool):
            raise _type_error("logprobs", "a valid boolean", wanted)
        top = _integer(body, "top_logprobs")
        if top is not None and top < 0 and top != -1:
            raise ApiError(400, "`top_logprobs` must be a positive value or -1.", param="top_logprobs")
        if top and not wanted:
            raise ApiError(400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
        if not wanted:
            return None
        count = top or 0
    else:
        count = _integer(body, "logprobs")
        if count is None:
            return None
        if count < 0 and count != -1:
            raise ApiError(400, "`logprobs` must be a positive value or -1.", param="logprobs")
    if count > MAX_LOGPROBS:
        raise ApiError(400, f"Requested sample logprobs of {count}, which is greater than max allowed: "
                            f"{MAX_LOGPROBS}", param="logprobs")
    return MAX_LOGPROBS if count == -1 else count


def _response_format(body: dict):
    fmt = body.get("response_format")
    if fmt is None:
        return "text", None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise _type_error("response_format.type", "'text', 'json_object' or 'json_schema'", kind)
    if kind != "json_schema":
        return kind, None
    spec = fmt.get("json_schema")
    schema = spec.get("schema", spec.get("json_schema")) if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise ApiError(400, "response_format of type 'json_schema' needs json_schema.schema (a JSON Schema object)",
                       param="response_format")
    return kind, schema


def _messages(body: dict) -> None:
    for index, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") not in ROLES:
            raise _type_error(f"messages.{index}.role", "'system', 'user', 'assistant', 'tool' or 'developer'",
                              message.get("role"))


def _continuous_usage(body: dict, engine: str) -> bool:
    """vLLM sends usage on every chunk only with include_usage too (its ``should_include_usage``);
    SGLang's reads continuous_usage_stats alone."""
    options = body.get("stream_options")
    if not body.get("stream") or not isinstance(options, dict) or not options.get("continuous_usage_stats"):
        return False
    return engine == "sglang" or bool(options.get("include_usage"))


def _completion_base(body: dict, vocab_size: Optional[int], max_model_len: int, **parse) -> tuple:
    """A completion's prompts (each checked against the context) and the request as its first prompt."""
    engine = parse["engine"]
    prompts = completion_prompts(body, engine=engine, vocab_size=vocab_size)
    if body.get("max_tokens") is None:
        body = dict(body, max_tokens=DEFAULT_COMPLETION_MAX_TOKENS)
    base = parse_request("completion", dict(body, n=1, model=None if engine == "sglang" else body.get("model")),
                         max_model_len=max_model_len, prompt_tokens=prompts[0].tokens, **parse)
    for prompt in prompts[1:]:
        check_context(prompt.tokens, base.max_tokens, max_model_len, engine)
    return tuple(prompts), base


def parse_api_request(kind: str, body, *, served_model_name: str, max_model_len: int, default_chat_kwargs,
                      engine: str, auto_tool_choice: bool, tool_call_parser: Optional[str],
                      vocab_size: Optional[int] = None) -> ApiRequest:
    """Every check, in the engine's order (types first, then values); ApiError on the first refusal."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    n = _integer(body, "n")
    n = 1 if n is None else n
    if n < 1:
        raise ApiError(400, f"n must be at least 1, got {n}.", param="n")
    _check_sampling(body)
    stop = _stop(body)
    if body.get("stream_options") is not None and not body.get("stream"):
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    logprobs = _logprobs(kind, body)
    fmt, schema = _response_format(body)
    check_logit_bias(body, engine=engine, vocab_size=vocab_size)
    tool = None
    parse = {"served_model_name": served_model_name, "default_chat_kwargs": default_chat_kwargs, "engine": engine}
    prompts: tuple = ()
    if kind == "chat":
        _messages(body)
        T.check_tools(body, auto_tool_choice=auto_tool_choice, tool_call_parser=tool_call_parser, engine=engine)
        # SGLang 0.5.23 serves whatever "model" names (it only reads it for a LoRA adapter)
        base = parse_request(kind, dict(body, n=1, model=None if engine == "sglang" else body.get("model")),
                             max_model_len=max_model_len, **parse)
        tool = T.choose_tool(body)
    else:
        prompts, base = _completion_base(body, vocab_size, max_model_len, **parse)
    model = (body.get("model") or "default") if engine == "sglang" else None
    return ApiRequest(base, body, n, stop, bool(body.get("include_stop_str_in_output")), logprobs, fmt, schema, tool,
                      prompts, _continuous_usage(body, engine), model)
