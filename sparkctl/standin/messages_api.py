"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic's Messages API, which both
engines serve): the request read as a chat request, the answer written as a ``message``, or
streamed as its events (``message_start``, ``content_block_start`` / ``_delta`` / ``_stop`` for
the thinking and the text, ``message_delta`` with the stop reason, ``message_stop``).

``model``, ``messages`` and ``max_tokens`` are required (the engines' ``AnthropicMessagesRequest``);
``system`` becomes the first message, ``stop_sequences`` the stop strings, ``thinking: {"type":
"enabled"}`` turns thinking on. Errors are ``{"type": "error", "error": {"type", "message"}}``
(their ``AnthropicErrorResponse``). Tool use is refused (501) rather than answered wrongly.
"""

from __future__ import annotations

import uuid
from typing import List, Optional

from .simulate import ApiError

PASSED = ("model", "temperature", "top_p", "top_k", "stream", "chat_template_kwargs", "max_tokens")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def error_body(err: ApiError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message}}


def _missing(name: str) -> ApiError:
    return ApiError(400, f"1 validation error for request\n{name}\n  Field required", param=name)


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"1 validation error for request\n{where}\n  Input should be a valid string or a list "
                            f"of content blocks [input_value={content!r}]", param=where)
    texts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise ApiError(501, f"content blocks of type {kind!r} are not served by this stand-in engine", param=where)
        texts.append(str(block.get("text", "")))
    return " ".join(texts)


def chat_body(body, counting: bool = False) -> dict:
    """The chat request a Messages request amounts to (ApiError for what is refused)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for name in ("model", "messages") + (() if counting else ("max_tokens",)):
        if body.get(name) is None:
            raise _missing(name)
    if body.get("tools"):
        raise ApiError(501, "tools in /v1/messages are not served by this stand-in engine", param="tools")
    if not isinstance(body["messages"], list) or not body["messages"]:
        raise ApiError(400, "messages must be a non-empty list of message objects", param="messages")
    chat = {key: body[key] for key in PASSED if body.get(key) is not None}
    messages = [{"role": "system", "content": _text(body["system"], "system")}] if body.get("system") else []
    for index, message in enumerate(body["messages"]):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise ApiError(400, f"1 validation error for request\nmessages.{index}.role\n  Input should be 'user', "
                                "'assistant' or 'system'", param=f"messages.{index}.role")
        messages.append({"role": message["role"], "content": _text(message.get("content"), f"messages.{index}")})
    chat["messages"] = messages
    if isinstance(body.get("stop_sequences"), list):
        chat["stop"] = body["stop_sequences"]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        chat["chat_template_kwargs"] = dict(chat.get("chat_template_kwargs") or {}, thinking=True)
    return chat


class Answer:
    """One message being built: its thinking and its text, and the stream's events."""

    def __init__(self, body: dict, model: str, prompt_tokens: int, max_tokens: Optional[int]):
        self.id = "msg_" + uuid.uuid4().hex
        self.model, self.prompt_tokens = model, prompt_tokens
        self.thinking, self.text = "", ""
        self.tokens = 0
        self.blocks = 0  # content blocks opened so far
        self.open_kind: Optional[str] = None

    def add(self, kind: str, text: str) -> None:
        self.tokens += 1
        if kind == "reasoning":
            self.thinking += text
        else:
            self.text += text

    def _content(self) -> List[dict]:
        blocks = [{"type": "thinking", "thinking": self.thinking, "signature": ""}] if self.thinking else []
        return blocks + [{"type": "text", "text": self.text}]

    def _usage(self) -> dict:
        return {"input_tokens": self.prompt_tokens, "output_tokens": self.tokens}

    def final(self, finish: str, stop: Optional[str] = None) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": self._content(), "stop_reason": "stop_sequence" if stop else STOP_REASONS.get(finish, finish),
                "stop_sequence": stop, "usage": self._usage()}

    # -- the stream's events ----------------------------------------------------------------------

    def opening(self) -> List[dict]:
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": self.prompt_tokens,
                                                                         "output_tokens": 0}}
        return [{"type": "message_start", "message": message}]

    def _switch(self, kind: Optional[str]) -> List[dict]:
        """Close the open block and open one for ``kind`` (None: just close)."""
        events = []
        if self.open_kind is not None:
            events.append({"type": "content_block_stop", "index": self.blocks - 1})
        self.open_kind = kind
        if kind is not None:
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "reasoning" else \
                {"type": "text", "text": ""}
            events.append({"type": "content_block_start", "index": self.blocks, "content_block": block})
            self.blocks += 1
        return events

    def token(self, kind: str, text: str) -> List[dict]:
        events = self._switch(kind) if kind != self.open_kind else []
        self.add(kind, text)
        delta = {"type": "thinking_delta", "thinking": text} if kind == "reasoning" else \
            {"type": "text_delta", "text": text}
        return events + [{"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}]

    def closing(self, finish: str, stop: Optional[str] = None) -> List[dict]:
        events = self._switch("content") + self._switch(None) if self.open_kind in (None, "reasoning") \
            else self._switch(None)
        final = self.final(finish, stop)
        return events + [{"type": "message_delta", "delta": {"stop_reason": final["stop_reason"],
                                                             "stop_sequence": stop},
                          "usage": {"output_tokens": self.tokens}},
                         {"type": "message_stop"}]
