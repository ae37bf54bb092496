"""``docker save`` archives, read as a stream: which bytes belong to which image layer.

A thin archive is the same stream with the layer tars a host already has left out (manifest.json
unchanged): ``docker load`` on a graph-driver engine (overlay2) only opens the layer file of a
layer whose chain ID it lacks (SANDBOX.md §5). So the stream is cut into segments, each tagged with
the chain IDs it is the content of (or none), and each host's copy drops the segments of layers it
has. Nothing is buffered beyond one tar header group and the small ``json`` files.

Which member is which layer:
- OCI layout (Docker 25+): ``blobs/sha256/<hex>``, where ``sha256:<hex>`` is a layer's diff ID.
- Legacy layout (Docker <= 24): ``<v1id>/layer.tar``. The v1 ID is ``sha256`` over the layer's
  ``<v1id>/json`` (which precedes ``layer.tar`` in the stream) with ``id`` removed and the layer's
  chain ID (and the parent's v1 ID) added (moby image/v1.CreateID). We recompute it for each of the
  image's chain IDs and keep the one that matches exactly: a format we do not recognise matches
  nothing, and its layers are simply sent (a full archive is always correct).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from sparkctl.images.inputs import chain_ids as compute_chain_ids

BLOCK = 512
_JSON_LIMIT = 4 * 1024 * 1024  # a layer's v1 json is a few KB; never buffer more
_LEGACY_JSON = re.compile(r"^([0-9a-f]{64})/json\Z")
_LEGACY_LAYER = re.compile(r"^([0-9a-f]{64})/layer\.tar\Z")
_OCI_BLOB = re.compile(r"^blobs/sha256/([0-9a-f]{64})\Z")


class ArchiveError(Exception):
    pass


@dataclass(frozen=True)
class Segment:
    data: bytes
    layers: frozenset[str] = frozenset()  # chain IDs this segment is the content of (empty: always sent)


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 (sizes of 8 GiB and more)
        value = field[0] & 0x3F
        for byte in field[1:]:
            value = (value << 8) | byte
        return value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax_records(data: bytes) -> dict[str, str]:
    records, pos = {}, 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        record = data[space + 1:pos + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return records


def _split_members(text: str) -> list[tuple[str, str]]:
    """A JSON object's top-level members as (key, raw value text), byte-exact."""
    decoder = json.JSONDecoder()
    text = text.strip()
    if not text.startswith("{"):
        raise ValueError("not an object")
    out, pos = [], 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise ValueError("unterminated object")
        if text[pos] == "}":
            return out
        key, pos = decoder.raw_decode(text, pos)
        while text[pos] in " \t\r\n:":
            pos += 1
        start = pos
        _, pos = decoder.raw_decode(text, pos)
        out.append((key, text[start:pos]))


def legacy_v1_chain(json_bytes: bytes, candidates: Iterable[str]) -> str | None:
    """The chain ID (of ``candidates``) whose v1 ID is the ``id`` this legacy ``json`` file carries."""
    try:
        members = dict(_split_members(json_bytes.decode("utf-8")))
        v1_id = json.loads(members.pop("id"))
    except (ValueError, KeyError, UnicodeDecodeError):
        return None
    parent = members.pop("parent", None)
    if parent is not None:
        value = json.loads(parent)
        members["parent"] = json.dumps(value if value.startswith("sha256:") else "sha256:" + value)
    # Docker adds "os" to the intermediate layers' json after computing their IDs.
    variants = [members] + ([{k: v for k, v in members.items() if k != "os"}] if "os" in members else [])
    for chain in candidates:
        for fields in variants:
            record = dict(fields, layer_id=json.dumps(chain))
            blob = "{" + ",".join(f"{json.dumps(k)}:{record[k]}" for k in sorted(record)) + "}"
            if hashlib.sha256(blob.encode()).hexdigest() == v1_id:
                return chain
    return None


class SaveStreamParser:
    """Feed ``docker save`` bytes in any chunking; get back ``Segment``s (same bytes, in order)."""

    def __init__(self, diff_ids: list[str]):
        self.diff_ids = list(diff_ids)
        self.chains = compute_chain_ids(self.diff_ids)
        self._by_diff: dict[str, set[str]] = {}
        for diff, chain in zip(self.diff_ids, self.chains):
            self._by_diff.setdefault(diff, set()).add(chain)
        self._legacy: dict[str, str] = {}  # v1 dir -> chain ID
        self._pending = b""  # header bytes not yet complete
        self._group = b""  # meta headers (pax/gnu) waiting for their member's header
        self._meta_left = 0  # data bytes of a meta header still to collect into _meta
        self._meta = b""
        self._meta_type = b""
        self._meta_size = 0
        self._pax: dict[str, str] = {}
        self._longname: str | None = None
        self._data_left = 0  # bytes (incl. padding) of the current member's data to pass on
        self._data_tag: frozenset[str] = frozenset()
        self._capture: bytearray | None = None  # a legacy json being read
        self._capture_name = ""
        self._capture_size = 0
        self.ended = False  # the end-of-archive blocks were seen
        self.members: list[tuple[str, frozenset[str]]] = []  # (name, layers) in stream order
        self.total = 0

    @property
    def identified(self) -> dict[str, str]:
        """Legacy layer folders recognised so far: v1 ID -> chain ID."""
        return dict(self._legacy)

    def feed(self, chunk: bytes) -> list[Segment]:
        self.total += len(chunk)
        out: list[Segment] = []
        view = memoryview(chunk)
        pos = 0
        while pos < len(view):
            if self.ended:
                out.append(Segment(bytes(view[pos:])))
                break
            if self._data_left:
                take = min(self._data_left, len(view) - pos)
                piece = view[pos:pos + take]
                if self._capture is not None and len(self._capture) < self._capture_size:
                    self._capture += piece[: self._capture_size - len(self._capture)]
                out.append(Segment(bytes(piece), self._data_tag))
                self._data_left -= take
                pos += take
                if not self._data_left and self._capture is not None:
                    self._finish_capture()
                continue
            if self._meta_left:
                take = min(self._meta_left, len(view) - pos)
                piece = bytes(view[pos:pos + take])
                self._group += piece
                self._meta += piece
                self._meta_left -= take
                pos += take
                if not self._meta_left:
                    self._finish_meta()
                continue
            need = BLOCK - len(self._pending)
            take = min(need, len(view) - pos)
            self._pending += bytes(view[pos:pos + take])
            pos += take
            if len(self._pending) == BLOCK:
                header, self._pending = self._pending, b""
                segment = self._header(header)
                if segment is not None:
                    out.append(segment)
        return _coalesce(out)

    def _header(self, header: bytes) -> Segment | None:
        if header == b"\0" * BLOCK:
            self.ended = True
            data, self._group = self._group + header, b""
            return Segment(data)
        kind = header[156:157]
        size = _octal(header[124:136])
        if kind in (b"x", b"L", b"K"):  # describes the next member: keep with it
            self._group += header
            self._meta_type, self._meta = kind, b""
            self._meta_left = _padded(size)
            self._meta_size = size
            if not self._meta_left:
                self._finish_meta()
            return None
        name = self._longname or _name(header)
        if "path" in self._pax:
            name = self._pax["path"]
        if "size" in self._pax:
            size = int(self._pax["size"])
        self._pax, self._longname = {}, None
        tag = self._layers_of(name, kind) if kind in (b"0", b"\0") else frozenset()
        data, self._group = self._group + header, b""
        self.members.append((name, tag))
        self._data_left = _padded(size)
        self._data_tag = tag
        if _LEGACY_JSON.match(name) and size <= _JSON_LIMIT:
            self._capture, self._capture_name, self._capture_size = bytearray(), name, size
        if not self._data_left and self._capture is not None:
            self._finish_capture()
        return Segment(data, tag)

    def _finish_meta(self) -> None:
        body = self._meta[: self._meta_size]
        if self._meta_type == b"x":
            self._pax.update(_pax_records(body))
        elif self._meta_type == b"L":
            self._longname = body.split(b"\0", 1)[0].decode("utf-8", "replace")
        self._meta = b""

    def _finish_capture(self) -> None:
        assert self._capture is not None
        folder = self._capture_name.split("/", 1)[0]
        chain = legacy_v1_chain(bytes(self._capture[: self._capture_size]), self.chains)
        if chain is not None:
            self._legacy[folder] = chain
        self._capture = None

    def _layers_of(self, name: str, kind: bytes) -> frozenset[str]:
        legacy = _LEGACY_LAYER.match(name)
        if legacy:
            chain = self._legacy.get(legacy.group(1))
            return frozenset([chain]) if chain else frozenset()
        blob = _OCI_BLOB.match(name)
        if blob:
            return frozenset(self._by_diff.get("sha256:" + blob.group(1), ()))
        return frozenset()


def _name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
        if prefix:
            name = f"{prefix}/{name}"
    return name


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _coalesce(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for segment in segments:
        if out and out[-1].layers == segment.layers:
            out[-1] = Segment(out[-1].data + segment.data, segment.layers)
        else:
            out.append(segment)
    return out


def thin_copy(segments: Iterable[Segment], present: set[str]) -> Iterator[bytes]:
    """The bytes a host with layers ``present`` (chain IDs) needs."""
    for segment in segments:
        if not segment.layers or not segment.layers <= present:
            yield segment.data
