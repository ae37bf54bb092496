"""``POST /v1/responses`` (the OpenAI Responses API both engines serve): the request read as a chat
request, the answer written as a ``response`` object, or streamed as its typed events.

The request's ``input`` (a string, or a list of messages whose content is a string or
``input_text`` / ``output_text`` parts) and ``instructions`` become chat messages,
``max_output_tokens`` the token budget; sampling options are checked as for a chat request. The
answer has a ``reasoning`` item (the thinking, when there is any) and a ``message`` item with one
``output_text`` part; ``usage`` counts ``input_tokens`` / ``output_tokens`` (reasoning included,
as ``output_tokens_details.reasoning_tokens``). A stream is ``event: TYPE`` / ``data: {...}`` pairs
from ``response.created`` to ``response.completed``, without a ``[DONE]``.

Function tools, ``previous_response_id`` and stored responses are not served here: each is refused
in the engine's error shape (501 / 404) rather than answered wrongly.
"""

from __future__ import annotations

import time
import uuid
from typing import List, Optional

from .simulate import ApiError

PASSED = ("model", "temperature", "top_p", "top_k", "min_p", "stream", "seed", "stop", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "chat_template_kwargs", "logit_bias", "ignore_eos", "user")


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    raise ApiError(400, "1 validation error for request\ninput\n  Input should be a valid string or a list of "
                        f"input items [input_value={content!r}]", kind="Bad Request", param="input")


def _messages(body: dict) -> List[dict]:
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError(400, "1 validation error for request\ninput\n  Field required", kind="Bad Request",
                       param="input")
    messages = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    for item in items:
        if not isinstance(item, dict) or item.get("type", "message") != "message" or "role" not in item:
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise ApiError(501, f"input items of type {kind!r} are not served by this stand-in engine",
                           kind="NotImplementedError", param="input")
        messages.append({"role": item["role"], "content": _text(item.get("content"))})
    return messages


def chat_body(body) -> dict:
    """The chat request a Responses request amounts to (ApiError for what is refused)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("tools"):
        raise ApiError(501, "tools in /v1/responses are not served by this stand-in engine", kind="NotImplementedError",
                       param="tools")
    if body.get("previous_response_id"):
        raise ApiError(404, f"Response with id '{body['previous_response_id']}' not found.",
                       kind="invalid_request_error", param="previous_response_id")
    chat = {key: body[key] for key in PASSED if body.get(key) is not None}
    chat["messages"] = _messages(body)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


def _reasoning_item(item_id: str, text: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "status": None, "encrypted_content": None,
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def _message_item(item_id: str, text: Optional[str], status: str = "completed") -> dict:
    content = [] if text is None else [_part(text)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": None}


class Answer:
    """One response being built: its id, its items' ids, its text so far."""

    def __init__(self, body: dict, model: str, prompt_tokens: int, max_tokens: Optional[int]):
        self.id = "resp_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.body, self.model, self.prompt_tokens, self.max_tokens = body, model, prompt_tokens, max_tokens
        self.reasoning_id, self.message_id = "rs_" + uuid.uuid4().hex, "msg_" + uuid.uuid4().hex
        self.reasoning, self.content = "", ""
        self.reasoning_tokens = self.content_tokens = 0
        self.sequence = 0

    def add(self, kind: str, text: str) -> None:
        if kind == "reasoning":
            self.reasoning, self.reasoning_tokens = self.reasoning + text, self.reasoning_tokens + 1
        else:
            self.content, self.content_tokens = self.content + text, self.content_tokens + 1

    def output(self) -> List[dict]:
        items = [_reasoning_item(self.reasoning_id, self.reasoning)] if self.reasoning else []
        return items + [_message_item(self.message_id, self.content)]

    def doc(self, status: str, finish: str = "stop") -> dict:
        done = status != "in_progress"
        output_tokens = self.reasoning_tokens + self.content_tokens
        b = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": "incomplete" if done and finish == "length" else status,
            "incomplete_details": {"reason": "max_output_tokens"} if done and finish == "length" else None,
            "output": self.output() if done else [], "instructions": b.get("instructions"),
            "max_output_tokens": self.max_tokens, "metadata": b.get("metadata"), "parallel_tool_calls": True,
            "previous_response_id": None, "reasoning": b.get("reasoning"), "temperature": b.get("temperature"),
            "top_p": b.get("top_p"), "tool_choice": b.get("tool_choice", "auto"), "tools": [],
            "text": b.get("text") or {"format": {"type": "text"}}, "truncation": b.get("truncation", "disabled"),
            "background": False, "service_tier": "auto", "store": False, "user": b.get("user"), "error": None,
            "usage": {"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": output_tokens,
                      "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                      "total_tokens": self.prompt_tokens + output_tokens} if done else None,
        }

    # -- the stream's events ----------------------------------------------------------------------

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def opening(self) -> List[dict]:
        return [self._event("response.created", response=self.doc("in_progress")),
                self._event("response.in_progress", response=self.doc("in_progress"))]

    def token(self, kind: str, text: str) -> List[dict]:
        """The events of one token (an item's opening before its first)."""
        events = []
        if kind == "reasoning":
            if not self.reasoning:
                events.append(self._event("response.output_item.added", output_index=0,
                                          item=_reasoning_item(self.reasoning_id, "")))
            self.add(kind, text)
            events.append(self._event("response.reasoning_text.delta", item_id=self.reasoning_id, output_index=0,
                                      content_index=0, delta=text))
            return events
        if not self.content_tokens:
            events += self._close_reasoning() + self._open_message()
        self.add(kind, text)
        events.append(self._event("response.output_text.delta", item_id=self.message_id,
                                  output_index=self._message_index(), content_index=0, delta=text, logprobs=[]))
        return events

    def _message_index(self) -> int:
        return 1 if self.reasoning else 0

    def _close_reasoning(self) -> List[dict]:
        if not self.reasoning:
            return []
        return [self._event("response.reasoning_text.done", item_id=self.reasoning_id, output_index=0,
                            content_index=0, text=self.reasoning),
                self._event("response.output_item.done", output_index=0,
                            item=_reasoning_item(self.reasoning_id, self.reasoning))]

    def _open_message(self) -> List[dict]:
        index = self._message_index()
        return [self._event("response.output_item.added", output_index=index,
                            item=_message_item(self.message_id, None, "in_progress")),
                self._event("response.content_part.added", item_id=self.message_id, output_index=index,
                            content_index=0, part=dict(_part(""), logprobs=[]))]

    def final(self, finish: str, stop: Optional[str] = None) -> dict:
        return self.doc("completed", finish)

    def closing(self, finish: str, stop: Optional[str] = None) -> List[dict]:
        events = [] if self.content_tokens else self._close_reasoning() + self._open_message()
        index = self._message_index()
        events += [
            self._event("response.output_text.done", item_id=self.message_id, output_index=index, content_index=0,
                        text=self.content, logprobs=[]),
            self._event("response.content_part.done", item_id=self.message_id, output_index=index, content_index=0,
                        part=_part(self.content)),
            self._event("response.output_item.done", output_index=index,
                        item=_message_item(self.message_id, self.content)),
        ]
        doc = self.doc("completed", finish)
        events.append(self._event("response.incomplete" if doc["status"] == "incomplete" else "response.completed",
                                  response=doc))
        return events
