"""The prompts of a ``/v1/completions`` request and the token ids a request names, checked as the engines check them.

Both engines' ``CompletionRequest.prompt`` (their OpenAPI) takes a string, a list of strings, a
list of token ids or a list of token-id lists; a list is a batch, answered with one choice per
prompt and ``n`` (``index = prompt * n + i``, in order). vLLM 0.33.0 refuses an empty token list
("The decoder prompt cannot be empty") and a token id past the vocabulary ("Token id X is out of
vocabulary"), a ``suffix`` and, without ``--enable-prompt-embeds``, ``prompt_embeds``; SGLang 0.5.23
refuses an empty prompt of any kind ("Prompt cannot be empty"). With ``echo`` each choice's text
starts with its prompt (token ids read back as words).

``logit_bias`` (vLLM's ``SamplingParams``): every key is a token id (``int(key)``), every id must
be inside the vocabulary, else 400 naming them all ("token_id(s) [...] in logit_bias contain
out-of-vocab token ids. Vocabulary size: N").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .simulate import ApiError, count_tokens

DEFAULT_COMPLETION_MAX_TOKENS = 16  # CompletionRequest.max_tokens's default in both engines' OpenAPI


@dataclass(frozen=True)
class Prompt:
    tokens: int
    seed: int  # what varies the answer from one prompt to the next
    given: object = None  # the prompt as sent (text or token ids), kept when the answer echoes it


def _type_error(value) -> ApiError:
    return ApiError(400, "1 validation error for request\nprompt\n  Input should be a valid string, a list of "
                         f"strings, a list of integers or a list of lists of integers [input_value={value!r}]",
                    kind="Bad Request", param="prompt")


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _batch(prompt) -> List[object]:
    """The prompts a ``prompt`` field holds (a string or a token-id list alone is one prompt)."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list):
        raise _type_error(prompt)
    if all(_is_id(t) for t in prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) and all(_is_id(t) for t in p)
                                                      for p in prompt):
        return list(prompt)
    raise _type_error(prompt)


def completion_prompts(body: dict, *, engine: str, vocab_size: Optional[int]) -> List[Prompt]:
    """Each prompt of the request, in order; ApiError as the engine refuses a prompt."""
    if engine == "vllm" and body.get("prompt_embeds") is not None:  # the stand-in serves without --enable-prompt-embeds
        raise ApiError(400, "You must set `--enable-prompt-embeds` to input `prompt_embeds`.", param="prompt_embeds")
    if engine == "vllm" and body.get("suffix") is not None:
        raise ApiError(400, "suffix is not currently supported", param="suffix")
    if body.get("prompt") is None and engine == "vllm":
        raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    batch = _batch(body.get("prompt"))
    if engine == "sglang" and (not batch or all(not p for p in batch)):
        raise ApiError(400, "Prompt cannot be empty")
    if not batch:
        raise ApiError(400, "The decoder prompt cannot be empty")
    prompts = []
    for index, item in enumerate(batch):
        if isinstance(item, str):
            tokens = count_tokens(item)
        else:
            if not item and engine == "vllm":
                raise ApiError(400, "The decoder prompt cannot be empty")
            if vocab_size is not None and engine == "vllm" and item and max(item) >= vocab_size:
                raise ApiError(400, f"Token id {max(item)} is out of vocabulary")
            tokens = len(item)
        prompts.append(Prompt(tokens, tokens + 104729 * index, item if body.get("echo") else None))
    return prompts


def check_logit_bias(body: dict, *, engine: str, vocab_size: Optional[int]) -> None:
    bias = body.get("logit_bias")
    if bias is None:
        return
    if not isinstance(bias, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                             for v in bias.values()):
        raise ApiError(400, "1 validation error for request\nlogit_bias\n  Input should be a valid dictionary of "
                            f"numbers [input_value={bias!r}]", kind="Bad Request", param="logit_bias")
    if engine != "vllm":
        return
    ids = []
    for key in bias:
        try:
            ids.append(int(key))
        except ValueError:
            raise ApiError(400, f"invalid literal for int() with base 10: {key!r}", param="logit_bias") from None
    outside = [i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)]
    if outside:
        raise ApiError(400, f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids. "
                            f"Vocabulary size: {vocab_size}", param="logit_bias")
