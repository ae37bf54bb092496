"""Answers the stand-in takes from the conversation itself, where a real model would too.

Two things a validation run asks that a word generator cannot fake, and that need no model:

* **Retrieval of a planted record**: a prompt that holds lines ``Record ID: the vault code is
  VALUE.`` and ends with a question naming one ``record ID`` is answered with that record's value
  (the long-context "needle" checks; a prompt longer than the context never gets here: the engine
  refuses it first, as the real one does).
* **A tool's result**: after a ``tool`` message the model answers from it instead of calling again
  (the second half of a tool round trip): the answer quotes the result.
"""

from __future__ import annotations

import re
from typing import List, Optional

RECORD = re.compile(r"Record ([A-Z]-\d+): the vault code is (\d+)\.")
QUESTION = re.compile(r"\brecord ([A-Z]-\d+)\b", re.IGNORECASE)


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content or "")


def last_is_tool_result(messages) -> bool:
    return bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"


def answer(messages) -> Optional[str]:
    """The grounded answer for this conversation, or None when the generator should answer."""
    if not isinstance(messages, list) or not messages:
        return None
    if last_is_tool_result(messages):
        return f"The tool returned: {_text(messages[-1].get('content'))}"
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    asked = QUESTION.findall(_text(last.get("content")))
    if not asked:
        return None
    planted = {}
    for message in messages:
        if isinstance(message, dict):
            planted.update(RECORD.findall(_text(message.get("content"))))
    value = planted.get(asked[-1].upper())
    return value


def events(text: str) -> List[str]:
    """The answer as token-sized pieces (a word or a punctuation mark, its leading space kept)."""
    return re.findall(r"\s*\S+", text)
