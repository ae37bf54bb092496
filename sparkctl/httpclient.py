"""httpx, imported without its command-line client (``from sparkctl.httpclient import httpx``), and
``client()``: an ``httpx.Client`` whose TLS context is made once per process.

httpx's package imports its own command-line client (``httpx._main``) whenever click is installed
(it is, for huggingface_hub), and that client pulls in click, pygments and rich's progress and
syntax modules: ~0.08 s of CPU that every status, logs and up paid for a client it never runs.
Imported here, httpx finds its client absent and installs its own stand-in ``httpx.main`` (which
says the client's dependencies are missing); everything sparkctl uses is unchanged. A later
``import httpx._main`` works as usual.

Every ``httpx.Client()`` builds a TLS context of its own and loads the CA bundle into it (~35 ms of
CPU), also for plain-http endpoints, which is all a health wait, a status look or a smoke test
talks to in the sandbox. ``client()`` hands every client the one verifying context this process
made (httpx's own default: certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR when set); an
``SSLContext`` serves any number of connections and threads.
"""

from __future__ import annotations

import functools
import ssl
import sys


def _import_without_cli() -> None:
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        return  # imported already (or its client asked for on purpose): nothing to save
    sys.modules["httpx._main"] = None  # `from ._main import main` now raises ImportError, which httpx expects
    try:
        import httpx  # noqa: F401
    except ImportError:
        pass  # an httpx that needs its client to import: imported below as usual
    finally:
        if "httpx._main" in sys.modules and sys.modules["httpx._main"] is None:
            del sys.modules["httpx._main"]


_import_without_cli()

import httpx  # noqa: E402  (after the step above, which is the point of this module)

__all__ = ["client", "httpx", "tls_context"]


@functools.lru_cache(maxsize=None)
def tls_context() -> ssl.SSLContext:
    """The process's one verifying TLS context, made on first use (what ``httpx.Client()`` makes each time)."""
    return httpx.create_ssl_context()


def client(**options) -> httpx.Client:
    """``httpx.Client(**options)`` with the process's TLS context (``verify=`` given wins)."""
    options.setdefault("verify", tls_context())
    return httpx.Client(**options)
