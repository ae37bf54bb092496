"""Which names carry secrets, and how to show them without their values.

A secret is anything whose value grants access: API keys, tokens, passwords. sparkctl never writes such
a value to a world-readable file, stdout, ``--json``, a log or an audit line; it prints the name with
``MASK`` in place of the value and says where the value lives (the 0600 env file, the environment).

The test is on the *name*, by words (``VLLM_API_KEY`` -> vllm/api/key, ``--hf-token`` -> hf/token), so
that the engines' many token-count options (``--max-num-batched-tokens``, ``--bucket-time-to-first-token``,
``SGLANG_MAX_NEW_TOKENS_LIMIT``) and paths (``--ssl-keyfile``) are not mistaken for secrets.
"""
from __future__ import annotations

import functools
import re
from typing import Iterable, Mapping

MASK = "***"

# Any of these words anywhere in the name makes it a secret (--ssl-keyfile-password, S3_SECRET_ACCESS_KEY).
_ALWAYS = {"password", "passwd", "passphrase", "secret", "secrets",
           "apikey", "bearer"}
# "...key" is a secret only after one of these words: API_KEY, ACCESS_KEY, PRIVATE_KEY, not GRAPH_KEY.
_KEY_KINDS = {"api", "access", "secret", "private", "auth", "admin", "signing", "encryption", "master", "license"}
# "...token" is a secret unless it counts or positions tokens (first token, per token, new token).
_NOT_AUTH_TOKEN = {"first", "last", "next", "new", "per", "each", "of", "to", "max", "min", "special",
                   "eos", "bos", "pad", "unk", "stop", "start", "end", "think", "draft", "output", "input"}

_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_ENV_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", re.DOTALL)


def _words(name: str) -> list[str]:
    # engine_args.api-key -> the option's own name; camelCase -> separate words (apiKey -> api/key).
    last = str(name).rsplit(".", 1)[-1]
    last = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last)
    return [w for w in _WORD_SPLIT.split(last.lower()) if w]


def is_secret_name(name: str) -> bool:
    """True for env var or engine option names that hold a key, token or password (VLLM_API_KEY,
    HF_TOKEN, --api-key, --hf-token, engine_args.api-key), False for counts and paths."""
    return _is_secret_name(str(name))


@functools.lru_cache(maxsize=8192)
def _is_secret_name(name: str) -> bool:
    """Remembered: every argv element and env name of every host is asked on each render and log."""
    words = _words(name)
    if not words:
        return False
    if _ALWAYS.intersection(words):
        return True
    last, before = words[-1], (words[-2] if len(words) > 1 else "")
    if last == "key":
        return not before or before in _KEY_KINDS
    if last == "token":
        return before not in _NOT_AUTH_TOKEN
    return False


def _option_name(arg: str) -> str | None:
    """The option an argv element names (``--api-key`` or ``--api-key=x`` -> ``--api-key``), else None."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    return arg.split("=", 1)[0]


def mask_argv(argv: Iterable[str]) -> list[str]:
    """A copy of ``argv`` with the values of secret options masked, in both ``--opt VALUE`` and
    ``--opt=VALUE`` forms, and of secret ``NAME=VALUE`` assignments (``docker run -e HF_TOKEN=...``,
    ``env VLLM_API_KEY=... vllm serve``)."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        arg = str(arg)
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        option = _option_name(arg)
        if option is not None:
            if is_secret_name(option):
                if "=" in arg:
                    out.append(f"{option}={MASK}")
                else:
                    out.append(arg)
                    mask_next = True
                continue
            out.append(arg)
            continue
        assignment = _ENV_ASSIGNMENT.match(arg)
        if assignment and is_secret_name(assignment.group(1)):
            out.append(f"{assignment.group(1)}={MASK}")
            continue
        out.append(arg)
    return out


def mask_env(env: Mapping[str, object]) -> dict:
    """A copy of ``env`` with the values of secret-named variables replaced by ``MASK`` (empty values
    stay empty, so an unset key still shows as unset)."""
    return {name: (MASK if is_secret_name(name) and value not in (None, "") else value)
            for name, value in env.items()}


# --opt VALUE / --opt=VALUE / NAME=VALUE / NAME: VALUE inside free text (a shell line, a drift line).
_TEXT_PATTERN = re.compile(
    r"""(?P<name>--?[A-Za-z0-9][A-Za-z0-9_.-]*|\b[A-Za-z_][A-Za-z0-9_.-]*)"""
    r"""(?P<sep>=|[ \t]+|:[ \t]*)"""
    r"""(?P<value>'[^']*'|"(?:[^"\\]|\\.)*"|[^\s'"]+)""")


def mask_text(text: str) -> str:
    """``text`` (a shell command line, a YAML or drift line) with the value after every secret name
    masked: ``--api-key sk-1`` / ``--api-key=sk-1`` / ``HF_TOKEN=hf_x`` / ``api_key: sk`` -> ``***``."""
    out, pos = [], 0
    while (match := _TEXT_PATTERN.search(text, pos)) is not None:
        name, sep = match.group("name"), match.group("sep")
        named = name.startswith("-") or sep.strip() in ("=", ":")
        if named and is_secret_name(name):
            out.append(text[pos:match.start("value")] + MASK)
            pos = match.end()
        else:  # not a secret: move on past the name only, so the next word is looked at too
            out.append(text[pos:match.end("name")])
            pos = match.end("name")
    out.append(text[pos:])
    return "".join(out)
