"""``smoke --full``: what the sources checked before calling a line good, each a named, timed check.

After the ordinary smoke (``sparkctl.ops.smoke``), one after another (they load the engine):

* ``vision_1_image`` / ``vision_4_images``: a chat with one and with four images (PNG data URLs) is
  answered with text (the SGLang line serves up to four images a request);
* ``json_schema``: ``response_format: json_schema`` gives content that parses and fits the schema;
* ``tool_round_trip``: the model calls ``get_weather``, gets the tool's result back in a ``tool``
  message and answers from it with text (no second call);
* ``concurrency_wave_1`` / ``concurrency_wave_2``: eight chats at once, twice; all eight answer;
* ``retrieval_32k`` / ``retrieval_128k`` / ``retrieval_300k`` (and ``retrieval_1m`` when the profile
  serves 1,048,576 tokens): a prompt of that many tokens of filler with three planted records
  (``Record K-1234: the vault code is 583920.``) at different depths, then a question about one of
  them; the answer must hold exactly that record's code and no other's. The prompt sizes are the
  sources' (32,768 / 131,072 / 299,000 tokens; the SGLang TP4 report's 1M needle), counted as one
  token per filler word or mark. A context shorter than the prompt fails the check with the
  engine's own refusal.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

from sparkctl.ops.smoke import TOOL_PROMPT, WEATHER_TOOL, SmokeFailure, _error_text

RETRIEVAL = {"retrieval_32k": 32_768, "retrieval_128k": 131_072, "retrieval_300k": 299_000, "retrieval_1m": 1_000_000}
ONE_MILLION_CONTEXT = 1_048_576
WAVE = 8
CITY_WEATHER = {"city": "Paris", "temperature_c": 18, "sky": "clear"}
ANSWER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"},
                                                  "capital": {"type": "boolean"}},
                 "required": ["city", "population", "capital"]}
_FILLER = ("the", "quiet", "river", "runs", "past", "old", "stone", "walls", "and", "green", "fields", "under",
           "a", "wide", "grey", "sky", "while", "small", "boats", "drift", "toward", "the", "harbour", "slowly")


def full_names(context: int | None) -> list[str]:
    names = ["vision_1_image", "vision_4_images", "json_schema", "tool_round_trip", "concurrency_wave_1",
             "concurrency_wave_2", "retrieval_32k", "retrieval_128k", "retrieval_300k"]
    return names + (["retrieval_1m"] if context is not None and context >= ONE_MILLION_CONTEXT else [])


def png(rgb: tuple[int, int, int], size: int = 16) -> str:
    """A real PNG (solid colour, ``size`` x ``size``) as a data URL."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\0" + bytes(rgb) * size for _ in range(size))
    raw = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def haystack(tokens: int, seed: int) -> tuple[str, str, str, list[str]]:
    """(prompt text, the question, the asked code, the other codes): ``tokens`` tokens of filler
    sentences (11 words and a full stop) with three records planted at 20 %, 50 % and 80 % depth."""
    sentences = max(6, (tokens - 40) // 12)
    records = []
    for i in range(3):
        ident, code = f"K-{(seed * 7 + i * 1301) % 9000 + 1000}", str((seed * 7919 + i * 104729) % 900000 + 100000)
        records.append((int(sentences * (0.2 + 0.3 * i)), f"Record {ident}: the vault code is {code}.", ident, code))
    at = {depth: line for depth, line, _, _ in records}
    parts = []
    for n in range(sentences):
        if n in at:
            parts.append(at[n])
        words = [_FILLER[(n * 11 + k + seed) % len(_FILLER)] for k in range(11)]
        parts.append(" ".join(words) + ".")
    asked = records[(seed % 3)]
    question = f"What is the vault code of record {asked[2]}? Answer with the number only."
    return " ".join(parts), question, asked[3], [r[3] for r in records if r is not asked]


def fits(value, schema: dict) -> str | None:
    """Why ``value`` does not fit ANSWER_SCHEMA's shape (object, required keys, their types), or None."""
    kinds = {"string": str, "integer": int, "boolean": bool, "number": (int, float), "object": dict, "array": list}
    if not isinstance(value, dict):
        return f"not a JSON object: {json.dumps(value)[:80]}"
    for key in schema.get("required", []):
        if key not in value:
            return f"lacks the required key {key!r}"
        want = schema["properties"][key]["type"]
        if not isinstance(value[key], kinds[want]) or (want == "integer" and isinstance(value[key], bool)):
            return f"{key!r} is {json.dumps(value[key])}, not {want}"
    return None


class FullChecks:
    """The checks of ``--full``; mixed into smoke's ``_Smoke`` (client, model, post, chat_body)."""

    def _image_chat(self, count: int) -> str:
        colours = [(200, 30, 30), (30, 160, 60), (40, 60, 200), (230, 200, 40)][:count]
        content = [{"type": "text", "text": f"Describe the {count} image(s) in one short sentence."}]
        content += [{"type": "image_url", "image_url": {"url": png(c)}} for c in colours]
        doc = self.post("/v1/chat/completions", {"model": self.model, "messages": [{"role": "user", "content": content}],
                                                 "max_tokens": 48, "chat_template_kwargs": {"thinking": False}})
        text = (self.first_choice(doc).get("message") or {}).get("content")
        if not isinstance(text, str) or not text.strip():
            raise SmokeFailure(f"no text for {count} image(s)")
        return f"{count} image(s): {(doc.get('usage') or {}).get('prompt_tokens', '?')} prompt tokens, answered"

    def check_vision_1_image(self) -> str:
        return self._image_chat(1)

    def check_vision_4_images(self) -> str:
        return self._image_chat(4)

    def check_json_schema(self) -> str:
        body = self.chat_body("Give the city, population and whether it is a capital, for Paris.", max_tokens=128,
                              chat_template_kwargs={"thinking": False},
                              response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": ANSWER_SCHEMA}})
        content = (self.first_choice(self.post("/v1/chat/completions", body)).get("message") or {}).get("content")
        try:
            value = json.loads(content or "")
        except ValueError:
            raise SmokeFailure(f"content is not JSON: {str(content)[:80]!r}") from None
        problem = fits(value, ANSWER_SCHEMA)
        if problem:
            raise SmokeFailure(f"the answer does not fit the schema: {problem}")
        return f"fits the schema: {json.dumps(value)[:60]}"

    def check_tool_round_trip(self) -> str:
        messages = [{"role": "user", "content": TOOL_PROMPT}]
        first = self.first_choice(self.post("/v1/chat/completions", {"model": self.model, "messages": messages,
                                                                     "tools": [WEATHER_TOOL], "tool_choice": "auto",
                                                                     "max_tokens": 256}))
        calls = (first.get("message") or {}).get("tool_calls") or []
        if not calls:
            raise SmokeFailure("the first turn made no tool call")
        call = calls[0]
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call.get("id"), "content": json.dumps(CITY_WEATHER)}]
        second = self.first_choice(self.post("/v1/chat/completions", {"model": self.model, "messages": messages,
                                                                      "tools": [WEATHER_TOOL], "max_tokens": 128,
                                                                      "chat_template_kwargs": {"thinking": False}}))
        message = second.get("message") or {}
        if message.get("tool_calls"):
            raise SmokeFailure("the model called a tool again instead of answering from the result")
        text = str(message.get("content") or "")
        if not text.strip():
            raise SmokeFailure(f"no answer after the tool result (finish_reason {second.get('finish_reason')!r})")
        return f"called {call['function']['name']}, answered from the result ({len(text.split())} words)"

    def _wave(self) -> str:
        def one(i: int) -> float:
            started = time.monotonic()
            doc = self.post("/v1/chat/completions", self.chat_body(f"Write one sentence about the number {i}.",
                                                                   max_tokens=48, chat_template_kwargs={"thinking": False}))
            if not str((self.first_choice(doc).get("message") or {}).get("content") or "").strip():
                raise SmokeFailure(f"request {i} of the wave got no text")
            return time.monotonic() - started

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=WAVE, thread_name_prefix="wave") as pool:
            times = list(pool.map(one, range(WAVE)))
        return f"{WAVE}/{WAVE} answered in {time.monotonic() - started:.2f} s (slowest {max(times):.2f} s)"

    def check_concurrency_wave_1(self) -> str:
        return self._wave()

    def check_concurrency_wave_2(self) -> str:
        return self._wave()

    def _retrieval(self, name: str) -> str:
        tokens = RETRIEVAL[name]
        text, question, code, others = haystack(tokens, seed=tokens % 9973)
        body = self.chat_body(f"{text}\n\n{question}", max_tokens=16, temperature=0,
                              chat_template_kwargs={"thinking": False})
        response = self.client.post("/v1/chat/completions", json=body, timeout=max(self.timeout_s, tokens / 2000))
        if response.status_code != 200:
            raise SmokeFailure(f"{tokens:,}-token prompt answered {response.status_code}: {_error_text(response)}")
        doc = response.json()
        answer = str((self.first_choice(doc).get("message") or {}).get("content") or "")
        if code not in answer or any(other in answer for other in others):
            raise SmokeFailure(f"asked for {code}, got {answer.strip()[:60]!r}")
        return f"{(doc.get('usage') or {}).get('prompt_tokens', '?')} prompt tokens: found {code}"

    def check_retrieval_32k(self) -> str:
        return self._retrieval("retrieval_32k")

    def check_retrieval_128k(self) -> str:
        return self._retrieval("retrieval_128k")

    def check_retrieval_300k(self) -> str:
        return self._retrieval("retrieval_300k")

    def check_retrieval_1m(self) -> str:
        return self._retrieval("retrieval_1m")
