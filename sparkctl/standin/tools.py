"""Tool calls and structured output: what the model "decides" and the JSON it writes.

A request with ``tools`` gets a call to one of them when ``tool_choice`` asks for it: ``required``
or a named function always, ``auto`` when the last user message names a tool (or a word of its
name, "weather" for ``get_weather``) or says "tool" (a real model decides; this keeps it predictable), ``none`` never. The arguments are a
JSON object that satisfies the function's ``parameters`` schema (``sample_value``), the same
generator answers ``response_format`` ``json_object`` / ``json_schema``.

Formats: vLLM ids are ``chatcmpl-tool-<hex>``, SGLang's ``call_<hex>`` and SGLang puts ``index``
in non-streamed calls too. Streamed, the first delta of a call carries id, type and name with
empty arguments, then the arguments arrive in pieces (both engines' parsers stream this way).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import List, Optional

from .simulate import ApiError

SAMPLE_STRING = "Paris"
_GENERIC = {"get", "set", "call", "tool", "function", "make", "find", "list", "read", "fetch"}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


def check_tools(body: dict, *, auto_tool_choice: bool, tool_call_parser: Optional[str], engine: str) -> None:
    """400 for the tool requests the engine refuses."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is not None:
        if not isinstance(tools, list) or not all(_function_of(t) for t in tools):
            raise ApiError(400, "tools must be a list of {\"type\": \"function\", \"function\": {\"name\": ...}}",
                           param="tools")
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ApiError(400, f"Invalid value for `tool_choice`: {choice!r} (none, auto, required or a function)",
                           param="tool_choice")
        if choice != "none" and not tools:
            raise ApiError(400, "When using `tool_choice`, `tools` must be set.", param="tool_choice")
        if choice == "auto" and engine == "vllm" and not (auto_tool_choice and tool_call_parser):
            raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                           param="tool_choice")
        return
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": "
                            "{\"name\": ...}}", param="tool_choice")
    if not tools:
        raise ApiError(400, "When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if name not in [_function_of(t)["name"] for t in tools]:
        raise ApiError(400, f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")


def _function_of(tool) -> Optional[dict]:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return None
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    return function


def _last_user_text(messages: list) -> str:
    for message in reversed(messages or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def choose_tool(body: dict) -> Optional[dict]:
    """The function the model calls, or None for a plain answer."""
    tools = [f for f in (_function_of(t) for t in body.get("tools") or []) if f]
    choice = body.get("tool_choice", "auto" if tools else "none")
    if not tools or choice == "none":
        return None
    messages = body.get("messages") or []
    if choice == "auto" and messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
        return None  # the tool answered: the model answers from its result (grounded.answer)
    if isinstance(choice, dict):
        wanted = choice["function"]["name"]
        return next(f for f in tools if f["name"] == wanted)
    if choice == "required":
        return tools[0]
    # auto: the user's last message names a tool (or a word of its name: "weather" for get_weather)
    # or says "tool"
    words = set(re.findall(r"[a-z0-9]+", _last_user_text(body.get("messages")).lower()))
    for function in tools:
        name = function["name"].lower()
        parts = [p for p in re.split(r"[^a-z0-9]+", name) if len(p) >= 4 and p not in _GENERIC]
        if name in words or any(p in words for p in parts):
            return function
    return tools[0] if words & {"tool", "tools"} else None


def finish_reason_for(body: dict) -> str:
    """Calls made because the model chose them end with "tool_calls"; a named function is forced
    output and ends with "stop", as in the engines."""
    return "stop" if isinstance(body.get("tool_choice"), dict) else "tool_calls"


def make_call(function: dict, engine: str) -> ToolCall:
    call_id = ("call_" if engine == "sglang" else "chatcmpl-tool-") + uuid.uuid4().hex[:24]
    arguments = sample_value(function.get("parameters") or {"type": "object"}, 0)
    return ToolCall(call_id, function["name"], json.dumps(arguments, separators=(", ", ": ")))


def call_json(call: ToolCall, engine: str, index: int = 0) -> dict:
    doc = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    if engine == "sglang":
        doc["index"] = index
    return doc


def call_deltas(call: ToolCall, index: int = 0, pieces: int = 3) -> List[dict]:
    """The streamed form: header delta, then the arguments in ``pieces`` fragments."""
    deltas = [{"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}]
    text = call.arguments
    step = max(1, -(-len(text) // pieces))
    for start in range(0, len(text), step):
        deltas.append({"index": index, "function": {"arguments": text[start:start + step]}})
    return deltas


def sample_value(schema, depth: int):
    """A value satisfying a (simple) JSON schema: enum/const, type, required properties, items."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return sample_value(schema[key][0], depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        return {name: sample_value(sub, depth + 1) for name, sub in props.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 1) or 1))
        return [sample_value(schema.get("items") or {}, depth + 1) for _ in range(count)]
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return SAMPLE_STRING
