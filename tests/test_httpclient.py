"""sparkctl.httpclient: httpx without its command-line client, and nothing else changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
from sparkctl.httpclient import httpx
cli_loaded = sorted(m for m in ("click", "pygments", "httpx._main") if m in sys.modules)
def answer(request):
    return httpx.Response(200, json={"path": request.url.path})
with httpx.Client(transport=httpx.MockTransport(answer)) as client:
    got = client.get("http://engine.invalid/v1/models").json()
import httpx._main  # asked for on purpose, the client still imports
print(json.dumps({"cli_loaded": cli_loaded, "got": got, "main_later": callable(httpx._main.main)}))
"""


def test_httpx_comes_without_its_command_line_client():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found == {"cli_loaded": [], "got": {"path": "/v1/models"}, "main_later": True}


def test_clients_share_one_verifying_tls_context(monkeypatch):
    import ssl

    from sparkctl import httpclient

    made = []
    real = httpclient.httpx.create_ssl_context
    monkeypatch.setattr(httpclient.httpx, "create_ssl_context", lambda *a, **k: made.append(a or k) or real(*a, **k))
    httpclient.tls_context.cache_clear()
    given = []
    real_client = httpclient.httpx.Client
    monkeypatch.setattr(httpclient.httpx, "Client", lambda **options: given.append(options) or real_client(**options))
    try:
        clients = [httpclient.client(timeout=1) for _ in range(3)]
        for c in clients:
            c.close()
        assert len(made) == 1  # made once, not per client (each costs a CA-bundle load)
        context = httpclient.tls_context()
        assert [options["verify"] for options in given] == [context] * 3
        assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname  # still verifying
        with httpclient.client(verify=False):  # a verify given by the caller wins
            pass
        assert given[-1]["verify"] is False and len(made) == 1
    finally:
        httpclient.tls_context.cache_clear()
