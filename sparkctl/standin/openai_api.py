"""What the answer is (``plan_choices``) and how each engine writes it (responses, stream chunks, errors).

Field names follow the engine the stand-in stands in for: vLLM 0.33.0 sends the thinking as
``reasoning`` (message and delta), SGLang 0.5.23 as ``reasoning_content``; vLLM's choices carry
``stop_reason`` (the matched stop string), SGLang's ``matched_stop``; vLLM's errors are
``{"error": {"message", "type", "param", "code"}}``, SGLang's ``{"object": "error", "message",
"type", "param", "code"}``. Every document validates against the engine's response schemas.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from . import tools as T
from .sampling import ApiRequest
from .simulate import ApiError, Timing, output_pieces, plan_output

Event = Tuple[str, object]  # ("reasoning" | "content", text) or ("tool", streamed tool-call delta)


def reasoning_field(engine: str) -> str:
    return "reasoning_content" if engine == "sglang" else "reasoning"


def error_body(err: ApiError, engine: str) -> dict:
    if engine == "sglang":
        kind = "BadRequest" if err.status == 400 else err.kind
        return {"object": "error", "message": err.message, "type": kind, "param": err.param, "code": err.status}
    return err.body()


@dataclass
class ChoicePlan:
    index: int
    events: List[Event]
    finish_reason: str
    stop_reason: Optional[str] = None  # the stop string that ended it
    tool_call: Optional[T.ToolCall] = None
    logprobs: List[dict] = field(default_factory=list)  # one entry per text event, when asked
    prompt_tokens: int = 0  # of the prompt this choice answers (a batch has one per prompt)
    echo: str = ""  # a completion's prompt text, put before its answer (``echo: true``)

    @property
    def tokens(self) -> int:
        return len(self.events)

    def text(self, kind: str) -> str:
        return "".join(str(payload) for k, payload in self.events if k == kind)


def _apply_stop(events: List[Event], stops: List[str], include: bool):
    """Cut the content at the first stop string (vLLM checks the detokenized text after each token)."""
    if not stops:
        return events, None
    content = ""
    for position, (kind, text) in enumerate(events):
        if kind != "content":
            continue
        before = len(content)
        content += str(text)
        hits = [(content.find(s, max(0, before - len(s) + 1)), s) for s in stops]
        hits = [(at, s) for at, s in hits if at >= 0]
        if hits:
            at, stop = min(hits)
            end = at + (len(stop) if include else 0)
            kept = content[before:end] if end > before else ""
            return events[:position] + ([("content", kept)] if kept else []), stop
    return events, None


def _json_events(text: str) -> List[Event]:
    return [("content", text[i:i + 4]) for i in range(0, len(text), 4)]


def _logprob_entry(token: str, seed: int, top: int) -> dict:
    digest = hashlib.blake2b(f"{seed}:{token}".encode(), digest_size=4).digest()
    logprob = -round(0.05 + digest[0] / 256.0, 4)
    entry = {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}
    for rank in range(top):
        alt = token if rank == 0 else f"{token.strip()}{rank}"
        entry["top_logprobs"].append({"token": alt, "logprob": logprob - rank * 0.7,
                                      "bytes": list(alt.encode("utf-8"))})
    return entry


def plan_choices(req: ApiRequest, *, engine: str, max_model_len: int, timing: Timing,
                 reasoning_parser: bool) -> List[ChoicePlan]:
    """Every choice: for each prompt (a chat has one), ``n`` of them, indexed ``prompt * n + i``."""
    base = req.base
    prompts = [(p.tokens, p.seed) for p in req.prompts] or [(base.prompt_tokens, base.seed)]
    plans = []
    for number, (prompt_tokens, prompt_seed) in enumerate(prompts):
        for i in range(req.n):
            index = number * req.n + i
            plan = _plan_one(req, index, prompt_seed + 7919 * i, prompt_tokens, engine=engine,
                             max_model_len=max_model_len, timing=timing, reasoning_parser=reasoning_parser)
            plan.prompt_tokens = prompt_tokens
            plans.append(plan)
    return plans


def _plan_one(req: ApiRequest, index: int, seed: int, prompt_tokens: int, *, engine: str, max_model_len: int,
              timing: Timing, reasoning_parser: bool) -> ChoicePlan:
    base = req.base
    out = plan_output(prompt_tokens=prompt_tokens, max_tokens=base.max_tokens, max_model_len=max_model_len,
                      thinking=base.thinking, ignore_eos=base.ignore_eos, timing=timing)
    pieces = output_pieces(out, seed=seed, reasoning_parser=reasoning_parser)
    reasoning = [("reasoning", text) for kind, text in pieces if kind != "content"]
    plan: Optional[ChoicePlan] = None
    if req.tool is not None:
        call = T.make_call(req.tool, engine)
        events = reasoning + [("tool", delta) for delta in T.call_deltas(call, 0)]
        if base.max_tokens is None or len(events) <= base.max_tokens:
            plan = ChoicePlan(index, events, T.finish_reason_for(req.body), tool_call=call)
    if plan is None and req.response_format != "text":
        doc = T.sample_value(req.json_schema, 0) if req.json_schema else {"answer": "the model answers"}
        events = reasoning + _json_events(json.dumps(doc))
        if base.max_tokens is None or len(events) <= base.max_tokens:
            plan = ChoicePlan(index, events, "stop")
    if plan is None and req.response_format == "text":
        plan = _grounded_plan(req, index, reasoning)
    if plan is None:
        events = [("reasoning" if kind != "content" else "content", text) for kind, text in pieces]
        events, stop = _apply_stop(events, req.stop, req.include_stop)
        plan = ChoicePlan(index, events, "stop" if stop else out.finish_reason, stop_reason=stop)
    if req.logprobs is not None:
        plan.logprobs = [_logprob_entry(str(text), seed, req.logprobs) for kind, text in plan.events
                         if kind in ("content", "reasoning")]
    return plan


def _grounded_plan(req: ApiRequest, index: int, reasoning: List[Event]) -> Optional[ChoicePlan]:
    """A planted record's value or a tool result's summary (``grounded``), cut at max_tokens."""
    from . import grounded

    text = grounded.answer(req.body.get("messages")) if req.base.kind == "chat" else None
    if text is None:
        return None
    events = reasoning + [("content", piece) for piece in grounded.events(text)]
    budget = req.base.max_tokens
    if budget is not None and len(events) > budget:
        return ChoicePlan(index, events[:budget], "length")
    return ChoicePlan(index, events, "stop")


def usage(prompt_tokens: int, plans: List[ChoicePlan], n: int = 1) -> dict:
    """The whole request's: each prompt counted once (a batch's ``n`` choices share theirs), every choice's output."""
    if len(plans) > n:
        prompt_tokens = sum(p.prompt_tokens for p in plans[::n])
    completion = sum(p.tokens for p in plans)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": None}


def running_usage(plan: ChoicePlan, sent: int) -> dict:
    """One choice's usage so far (``continuous_usage_stats``): its prompt, its ``sent`` tokens."""
    return {"prompt_tokens": plan.prompt_tokens, "completion_tokens": sent, "total_tokens": plan.prompt_tokens + sent,
            "prompt_tokens_details": None}


# -- chat --------------------------------------------------------------------------------------------


def _stop_fields(engine: str, plan: Optional[ChoicePlan]) -> dict:
    value = plan.stop_reason if plan is not None else None
    return {"matched_stop": value} if engine == "sglang" else {"stop_reason": value}


def chat_message(engine: str, plan: ChoicePlan) -> dict:
    reasoning = plan.text("reasoning") or None
    message = {"role": "assistant", "content": plan.text("content") or (None if plan.tool_call else ""),
               reasoning_field(engine): reasoning}
    if plan.tool_call is not None:
        message["tool_calls"] = [T.call_json(plan.tool_call, engine, 0)]
    elif engine == "vllm":
        message["tool_calls"] = []
    return message


def chat_response(engine: str, rid: str, created: int, model: str, plans: List[ChoicePlan], use: dict,
                  want_logprobs: bool) -> dict:
    choices = []
    for plan in plans:
        logprobs = {"content": plan.logprobs} if want_logprobs else None
        choices.append({"index": plan.index, "message": chat_message(engine, plan), "logprobs": logprobs,
                        "finish_reason": plan.finish_reason, **_stop_fields(engine, plan)})
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": use}


def chat_chunk(engine: str, base: dict, index: int, delta: dict, *, finish: Optional[str] = None,
               plan: Optional[ChoicePlan] = None, logprobs: Optional[dict] = None) -> dict:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    if finish is not None:
        choice.update(_stop_fields(engine, plan))
    return dict(base, choices=[choice])


def event_delta(engine: str, event: Event) -> dict:
    kind, payload = event
    if kind == "tool":
        return {"tool_calls": [payload]}
    return {reasoning_field(engine) if kind == "reasoning" else "content": payload}


# -- completions -------------------------------------------------------------------------------------


def completion_logprobs(entries: List[dict], engine: str = "vllm") -> dict:
    """A completion's logprobs; SGLang 0.5.23 does not compute text offsets (each is -1)."""
    offsets, offset = [], 0
    for entry in entries:
        offsets.append(-1 if engine == "sglang" else offset)
        offset += len(entry["token"])
    return {"text_offset": offsets, "token_logprobs": [e["logprob"] for e in entries],
            "tokens": [e["token"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} or None for e in entries]}


def completion_response(engine: str, rid: str, created: int, model: str, plans: List[ChoicePlan], use: dict,
                        want_logprobs: bool) -> dict:
    choices = []
    for plan in plans:
        choices.append({"index": plan.index, "text": plan.echo + plan.text("content"),
                        "logprobs": completion_logprobs(plan.logprobs, engine) if want_logprobs else None,
                        "finish_reason": plan.finish_reason, **_stop_fields(engine, plan)})
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": use}


def completion_chunk(engine: str, base: dict, index: int, text: str, *, finish: Optional[str] = None,
                     plan: Optional[ChoicePlan] = None, logprobs: Optional[dict] = None) -> dict:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
              **_stop_fields(engine, plan if finish else None)}
    return dict(base, choices=[choice])
