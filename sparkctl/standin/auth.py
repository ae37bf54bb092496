"""The API key check of each engine's HTTP server, as its middleware does it.

vLLM (``--api-key`` or ``VLLM_API_KEY``): only paths under ``/v1`` need ``Authorization: Bearer
KEY`` (scheme case-insensitive, keys compared as SHA-256 digests in constant time); ``/health``,
``/ping``, ``/version``, ``/metrics``, ``/tokenize``... stay open. SGLang (``--api-key``): every
path but ``/health*`` and ``/metrics`` needs it, compared as the exact header text. Both answer
401 ``{"error": "Unauthorized"}``; ``OPTIONS`` requests pass.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Optional, Sequence

UNAUTHORIZED = {"error": "Unauthorized"}


def guarded(engine: str, method: str, path: str) -> bool:
    if method == "OPTIONS":
        return False
    if engine == "sglang":
        return not (path.startswith("/health") or path.startswith("/metrics"))
    return path.startswith("/v1")


def _vllm_token_ok(header: Optional[str], keys: Sequence[str]) -> bool:
    if not header:
        return False
    scheme, _, param = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    digest = hashlib.sha256(param.encode("utf-8")).digest()
    match = False
    for key in keys:  # every key is compared, as vLLM does: no early exit to time
        match |= hmac.compare_digest(digest, hashlib.sha256(key.encode("utf-8")).digest())
    return match


def allowed(engine: str, keys: Sequence[str], method: str, path: str, authorization: Optional[str]) -> bool:
    """May this request pass? Always, when the server has no key."""
    if not keys or not guarded(engine, method, path):
        return True
    if engine == "sglang":
        return any(hmac.compare_digest((authorization or "").encode(), ("Bearer " + key).encode()) for key in keys)
    return _vllm_token_ok(authorization, keys)


def server_keys(engine: str, api_key_option, env) -> list:
    """The keys a server was started with: vLLM takes ``--api-key`` (repeatable) or else
    ``VLLM_API_KEY``; SGLang only ``--api-key``."""
    given = api_key_option if isinstance(api_key_option, list) else ([api_key_option] if api_key_option else [])
    given = [k for k in given if k]
    if not given and engine == "vllm" and env.get("VLLM_API_KEY"):
        given = [env["VLLM_API_KEY"]]
    return given
