"""A local stand-in for the Hugging Face hub's HTTP API, enough for ``huggingface_hub``'s
``model_info(files_metadata=True)`` and ``snapshot_download``: the repo info, the tree listing and
``resolve`` with the headers the client reads (``X-Repo-Commit``, ``ETag``/``X-Linked-Etag``,
``X-Linked-Size``) and range requests. It serves one folder as one repo at one commit and records
every request (method, path, whether an Authorization header came, the Range asked).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repo: str, folder: str, lfs_suffix: str = ".safetensors"):
        self.repo, self.folder, self.lfs_suffix = repo, folder, lfs_suffix
        self.requests: list[dict] = []
        self.lie_about: dict[str, str] = {}  # file -> the sha256 to advertise instead of the real one
        self.stop_after: dict[str, int] = {}  # file -> bytes to send before dropping the connection (once)
        self.files = {}
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, folder)
                data = open(path, "rb").read()
                self.files[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                   "sha1": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def is_lfs(self, name: str) -> bool:
        return name.endswith(self.lfs_suffix)

    def sha256(self, name: str) -> str:
        return self.lie_about.get(name, self.files[name]["sha256"])

    def _json(self, handler, doc, head=False, status=200):
        body = json.dumps(doc).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.end_headers()
        if not head:
            handler.wfile.write(body)

    def _handle(self, handler, head: bool):
        url = urlparse(handler.path)
        path = unquote(url.path)
        self.requests.append({"method": handler.command, "path": path, "query": url.query,
                              "auth": handler.headers.get("Authorization"), "range": handler.headers.get("Range")})
        info_prefix = f"/api/models/{self.repo}/revision/"
        tree_prefix = f"/api/models/{self.repo}/tree/"
        resolve_prefix = f"/{self.repo}/resolve/"
        if path.startswith(info_prefix) or path == f"/api/models/{self.repo}":
            siblings = []
            for name, meta in sorted(self.files.items()):
                entry = {"rfilename": name, "size": meta["size"], "blobId": meta["sha1"]}
                if self.is_lfs(name):
                    entry["lfs"] = {"sha256": self.sha256(name), "size": meta["size"], "pointerSize": 134}
                siblings.append(entry)
            return self._json(handler, {"id": self.repo, "modelId": self.repo, "sha": COMMIT, "private": False,
                                        "siblings": siblings}, head)
        if path.startswith(tree_prefix):
            entries = []
            for name, meta in sorted(self.files.items()):
                entry = {"type": "file", "path": name, "size": meta["size"], "oid": meta["sha1"]}
                if self.is_lfs(name):
                    entry["lfs"] = {"oid": self.sha256(name), "size": meta["size"], "pointerSize": 134}
                entries.append(entry)
            return self._json(handler, entries, head)
        if path.startswith(resolve_prefix):
            name = path[len(resolve_prefix):].split("/", 1)[1]
            if name not in self.files:
                handler.send_response(404)
                handler.send_header("X-Error-Code", "EntryNotFound")
                handler.send_header("X-Repo-Commit", COMMIT)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            data = open(os.path.join(self.folder, name), "rb").read()
            start = 0
            asked = handler.headers.get("Range")
            if asked and asked.startswith("bytes="):
                start = int(asked[6:].split("-")[0] or 0)
            body = data[start:]
            handler.send_response(206 if start else 200)
            handler.send_header("X-Repo-Commit", COMMIT)
            etag = self.sha256(name) if self.is_lfs(name) else self.files[name]["sha1"]
            handler.send_header("ETag", f'"{etag}"')
            if self.is_lfs(name):
                handler.send_header("X-Linked-Etag", f'"{etag}"')
                handler.send_header("X-Linked-Size", str(len(data)))
            handler.send_header("Accept-Ranges", "bytes")
            if start:
                handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            if head:
                return
            cut = self.stop_after.pop(name, None) if not start else None
            if cut is not None:
                handler.wfile.write(body[:cut])
                handler.wfile.flush()
                handler.close_connection = True
                import socket

                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            handler.wfile.write(body)
            return
        self._json(handler, {"error": f"not served here: {path}"}, head, status=404)
