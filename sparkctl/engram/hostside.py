"""The programs pack-engram runs *on a host*: stdlib only (xxhash used when importable).

The same code cuts shards on the control machine (imported) and on the hosts (shipped with
``sparkctl.images.orphan`` as a zip into a temporary folder, run as ``python3 engram.pyz OP ...``),
so a host needs nothing but python3. Operations:

* ``probe``   -- what is already in the engram dir: final size, partial size and spec, manifest (and
  the complete-looking shards re-hashed, as ``verify`` does, when asked).
* ``receive`` -- write one shard from stdin (push mode): temp name, fsync, then rename.
* ``cut``     -- cut shards from the host's own checkpoint copy (``--source on-hosts``).
* ``verify``  -- re-hash shards and compare with their manifests.
* ``describe``-- config.json, index and the safetensors headers that hold Engram tensors.

Hashes: a manifest carries ``xxh3_128`` (the ``xxhash`` module: always on the control machine,
on a host only if installed) and/or ``sha256`` (hashlib, in every python3). Each writer computes
what the *host* can later re-check, and no more (hashing is the CPU cost of packing):

* push: the sender hashes xxh3 always, and sha256 too when the host lacks xxhash; the host's
  receiver hashes with what it has and must agree with the sender before it commits (end-to-end);
* cut on a host or locally: xxh3 when available, else sha256;
* verify: xxh3 when both the manifest and the host have it, else sha256; a shard whose manifest
  has no digest the host can compute is reported ``unverifiable`` (install python3-xxhash there).

Files in the engram dir, per shard NAME (``engram-l{L}-r{R}of{TP}.bin``):
``NAME.partial`` (being written), ``NAME.partial.json`` (the spec it is being written for, so a
resume never continues a different shard), ``NAME`` (complete), ``NAME[:-4].json`` (the manifest,
written last: a shard with a manifest is complete). ``.pack-engram.lock`` serialises writers.
"""

import base64
import fcntl
import hashlib
import json
import os
import queue
import re
import select
import struct
import sys
import threading
import time

from sparkctl.images.orphan import controller_gone, remove_shipped_folder  # at import: our zip may be gone when they are needed

CHUNK = 8 * 1024 * 1024
TRAILER_LEN = struct.Struct("<Q")

# Exit codes of the host programs (the control side maps them to messages).
EXIT_MISMATCH = 3  # the bytes written do not hash to what the sender sent: partial removed, restart
EXIT_SHORT = 4  # stdin ended early (sender gone): partial kept for a resume
EXIT_BAD_OFFSET = 5  # asked to resume past what is on disk: restart from 0
EXIT_SOURCE = 6  # the host's checkpoint copy is not the one planned
EXIT_ORPHANED = 7  # the command that started us is gone (its channel closed): stopped, partial kept for a resume


class HostError(Exception):
    def __init__(self, message, code=1):
        Exception.__init__(self, message)
        self.code = code


def have_xxhash():
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


class Digests:
    """xxh3-128 and/or sha256 of one byte stream. ``xxh3`` is ignored when xxhash is missing."""

    def __init__(self, xxh3=True, sha256=False):
        self.sha = hashlib.sha256() if sha256 else None
        self.xx = None
        if xxh3:
            try:
                import xxhash

                self.xx = xxhash.xxh3_128()
            except ImportError:
                pass

    @classmethod
    def preferred(cls):
        """What this machine hashes its own shards with: xxh3 when it can, else sha256."""
        return cls(xxh3=True, sha256=not have_xxhash())

    def update(self, data):
        if self.sha is not None:
            self.sha.update(data)
        if self.xx is not None:
            self.xx.update(data)

    def result(self):
        return {"sha256": self.sha.hexdigest() if self.sha is not None else None,
                "xxh3_128": self.xx.hexdigest() if self.xx is not None else None}


def manifest_name(name):
    return name[:-4] + ".json" if name.endswith(".bin") else name + ".json"


def plan_part(doc):
    """The part of a spec/manifest that says what the shard is (everything but the hashes)."""
    return {k: v for k, v in doc.items() if k not in ("sha256", "xxh3_128")}


# -- buffers, reading, hashing ---------------------------------------------------------------


class RingClosed(Exception):
    pass


class Ring:
    """A fixed set of reusable buffers: memory stays at ``count x size`` however much data flows
    (no per-chunk allocation either, so no page faults or zeroing on the hot path)."""

    def __init__(self, count=4, size=CHUNK):
        self.size = size
        self.closed = False
        self.free = queue.Queue()
        for _ in range(count):
            self.free.put(bytearray(size))

    def take(self):
        while True:
            if self.closed:
                raise RingClosed()
            try:
                return self.free.get(timeout=0.2)
            except queue.Empty:
                continue

    def give(self, buf):
        self.free.put(buf)

    def close(self):
        """Wake up and stop whoever waits for a buffer (a consumer failed)."""
        self.closed = True


class Slot:
    """One filled buffer shared by ``users`` consumers; back to the ring once all released it."""

    __slots__ = ("ring", "buf", "n", "users", "lock")

    def __init__(self, ring, buf, n, users):
        self.ring, self.buf, self.n, self.users = ring, buf, n, users
        self.lock = threading.Lock()

    @property
    def view(self):
        return memoryview(self.buf)[: self.n]

    def release(self):
        with self.lock:
            self.users -= 1
            last = self.users == 0
        if last:
            self.ring.give(self.buf)


def read_slots(root, pieces, ring, users, start=0, end=None):
    """The shard's bytes [start, end) from the source files, as Slots of ``ring`` (each shared by
    ``users`` consumers, who must release it)."""
    for piece in pieces:
        p_start = piece["offset"]
        p_end = p_start + piece["nbytes"]
        lo = max(start, p_start)
        hi = p_end if end is None else min(end, p_end)
        if lo >= hi:
            continue
        path = os.path.join(root, piece["source_file"]) if root else piece["source_file"]
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            position = piece["source_offset"] + (lo - p_start)
            remaining = hi - lo
            while remaining:
                buf = ring.take()
                got = os.preadv(fd, [memoryview(buf)[: min(ring.size, remaining)]], position)
                if not got:
                    ring.give(buf)
                    raise HostError("%s ends early: tensor %s needs bytes up to %d" % (
                        path, piece["name"], piece["source_offset"] + piece["nbytes"]), EXIT_SOURCE)
                position += got
                remaining -= got
                yield Slot(ring, buf, got, users)
        finally:
            os.close(fd)


def hash_ranges(root, spec, digests, start, end, chunk=CHUNK):
    """Feed bytes [start, end) of the shard to ``digests`` (what a resume does not resend)."""
    ring = Ring(1, chunk)
    for slot in shard_slots(root, spec, ring, 1, start, end):
        digests.update(slot.view)
        slot.release()


PACKED_LAYOUT = "sglang-packed"  # sparkctl.engram.packed.LAYOUT (this file imports only sparkctl.images.orphan)


def shard_slots(root, spec, ring, users, start=0, end=None):
    """The shard's bytes [start, end) as Slots, whichever layout the spec says."""
    if spec.get("layout") == PACKED_LAYOUT:
        return packed_slots(root, spec, ring, users, start, end)
    return read_slots(root, spec["tensors"], ring, users, start, end)


IOV_MAX = 1024  # buffers per preadv call (Linux's UIO_MAXIOV)


def record_views(buf, rows, offset, width, record):
    """One memoryview per row into ``buf``: the ``width`` bytes at ``offset`` of each ``record``-byte
    record (where one tensor's bytes of that row go)."""
    view = memoryview(buf)
    return [view[r * record + offset: r * record + offset + width] for r in range(rows)]


def scatter_read(fd, views, width, position, path):
    """Fill ``views`` (consecutive rows of ``width`` bytes each) from the file's contiguous bytes at
    ``position``: the kernel scatters each read into the rows' places in the records, up to
    IOV_MAX rows per call, so interleaving costs no Python loop over bytes or rows."""
    done = 0
    while done < len(views):
        batch = views[done: done + IOV_MAX]
        got = os.preadv(fd, batch, position + done * width)
        if got == len(batch) * width:
            done += len(batch)
            continue
        if got <= 0:
            raise HostError("%s ends early: needs bytes up to %d" % (path, position + len(views) * width), EXIT_SOURCE)
        full, rest = divmod(got, width)
        done += full
        if rest:  # a short read inside a row: finish that row, then go on
            _read_exact(fd, views[done][rest:], position + done * width + rest, path)
            done += 1


class RecordFiller:
    """Puts rows ``row .. row+count`` of every piece into their places in a buffer of records.

    With numpy (when the host's python3 has it): each tensor's rows are one contiguous read, then
    one strided copy per tensor (~1 GB/s). Without: the kernel scatters each read straight into the
    records (``scatter_read``), which costs a system-call iovec per row (~5x slower, no extra module)."""

    def __init__(self, pieces, record, per_block):
        self.pieces, self.record, self.per_block = pieces, record, per_block
        try:
            import numpy
        except ImportError:
            numpy = None
        self.numpy = numpy
        self.scratch = [bytearray(per_block * p["row_bytes"]) for p in pieces] if numpy else None
        self.views = {}  # id(buffer) -> per piece, its rows' places in it (the ring's buffers are reused)

    def __call__(self, target, fds, paths, row, count):
        if self.numpy is not None:
            out = self.numpy.frombuffer(target, dtype=self.numpy.uint8, count=count * self.record).reshape(count, self.record)
            for fd, path, piece, data in zip(fds, paths, self.pieces, self.scratch):
                width = piece["row_bytes"]
                _read_exact(fd, memoryview(data)[: count * width], piece["source_offset"] + row * width, path)
                rows = self.numpy.frombuffer(data, dtype=self.numpy.uint8, count=count * width).reshape(count, width)
                out[:, piece["offset"]: piece["offset"] + width] = rows
            return
        if id(target) not in self.views:
            self.views[id(target)] = [record_views(target, self.per_block, p["offset"], p["row_bytes"], self.record)
                                      for p in self.pieces]
        for fd, path, piece, rows in zip(fds, paths, self.pieces, self.views[id(target)]):
            width = piece["row_bytes"]
            scatter_read(fd, rows[:count], width, piece["source_offset"] + row * width, path)


def _read_exact(fd, view, position, path):
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], position + got)
        if not n:
            raise HostError("%s ends early: needs bytes up to %d" % (path, position + len(view)), EXIT_SOURCE)
        got += n


def _packed_header(spec):
    return bytes.fromhex(spec["header"]).ljust(spec["header_bytes"], b"\0")


def packed_slots(root, spec, ring, users, start=0, end=None):
    """The SGLang packed shard's bytes [start, end): the header, then per row its weight and scale
    bytes side by side, read a block of rows at a time from the two source tensors."""
    head, record, size = spec["header_bytes"], spec["record_bytes"], spec["size"]
    end = size if end is None else min(end, size)
    position = start
    header = _packed_header(spec)
    while position < min(end, head):
        buf = ring.take()
        n = min(ring.size, min(end, head) - position)
        buf[:n] = header[position: position + n]
        position += n
        yield Slot(ring, buf, n, users)
    if position >= end:
        return
    pieces = spec["tensors"]
    paths = [os.path.join(root, p["source_file"]) if root else p["source_file"] for p in pieces]
    fds = [os.open(path, os.O_RDONLY) for path in paths]
    per_block = max(1, ring.size // record)
    block = bytearray(per_block * record) if ring.size < record else None
    fill = RecordFiller(pieces, record, per_block)
    try:
        while position < end:
            row, skip = divmod(position - head, record)
            count = min(per_block, -(-(end - head) // record) - row)
            target = block if block is not None else ring.take()
            fill(target, fds, paths, row, count)
            length = min(count * record - skip, end - position)
            if block is not None:  # a record larger than a ring buffer: hand it out piece by piece
                done = 0
                while done < length:
                    buf = ring.take()
                    n = min(ring.size, length - done)
                    buf[:n] = block[skip + done: skip + done + n]
                    done += n
                    yield Slot(ring, buf, n, users)
            else:
                if skip:  # a resume that starts mid-record: move the wanted bytes to the front
                    target[:length] = bytes(target[skip: skip + length])
                yield Slot(ring, target, length, users)
            position += length
    finally:
        for fd in fds:
            os.close(fd)


def prefetch(iterable, depth=4):
    """Run ``iterable`` in a thread, up to ``depth`` items ahead: reads overlap hashing and writing."""
    items = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def pump():
        try:
            for item in iterable:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(done)
        except RingClosed:
            return
        except BaseException as err:  # handed to the consumer
            items.put(err)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


class BackgroundDigests:
    """Digests updated in a thread of their own, so hashing overlaps reading and writing
    (hashlib and xxhash release the GIL on large buffers). Fed Slots, releases them when hashed."""

    def __init__(self, digests=None):
        self.digests = digests if digests is not None else Digests.preferred()
        self.items = queue.Queue()
        self.error = None
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            slot = self.items.get()
            if slot is None:
                return
            try:
                if self.error is None:
                    self.digests.update(slot.view)
            except BaseException as err:  # reported by result()
                self.error = err
            finally:
                slot.release()

    def feed(self, slot):
        self.items.put(slot)

    def close(self):
        """No more data (idempotent): the thread finishes what is queued and ends."""
        if not self.closed:
            self.closed = True
            self.items.put(None)

    def result(self):
        self.close()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.digests.result()


# -- writing --------------------------------------------------------------------------------


def write_all(fd, data):
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path, doc):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


LOCK_NAME = ".pack-engram.lock"


class ShardLock:
    """An exclusive flock on the engram dir's lock file: one writer at a time, even when runs
    overlap (a killed run's receiver may still be flushing when the next run starts)."""

    def __init__(self, dest, name, timeout=60.0):
        self.path = os.path.join(dest, LOCK_NAME)
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise HostError("another writer holds %s for more than %ds" % (self.path, self.timeout))
                time.sleep(0.1)

    def __exit__(self, *exc):
        os.close(self.fd)


def commit(dest, spec, digests):
    """NAME.partial -> NAME, then the manifest (the commit record) last."""
    name = spec["file"]
    final = os.path.join(dest, name)
    manifest_path = os.path.join(dest, manifest_name(name))
    remove(manifest_path)  # an old manifest must never describe the new bytes
    os.replace(final + ".partial", final)
    remove(final + ".partial.json")
    fsync_dir(dest)
    manifest = dict(spec)
    manifest.update(digests)
    write_json_atomic(manifest_path, manifest)
    fsync_dir(dest)
    return manifest


def start_partial(dest, spec, offset):
    """Open NAME.partial for writing at ``offset`` (0: new file). Returns (fd, digests of the prefix)."""
    name = spec["file"]
    partial = os.path.join(dest, name + ".partial")
    digests = Digests.preferred()
    if offset:
        try:
            with open(partial + ".json") as f:
                same = json.load(f) == spec
        except (OSError, ValueError):
            same = False
        if not same or not os.path.exists(partial) or os.path.getsize(partial) < offset:
            raise HostError("cannot resume %s at byte %d: the partial file is shorter or belongs to another plan" % (name, offset), EXIT_BAD_OFFSET)
        fd = os.open(partial, os.O_RDWR)
        os.ftruncate(fd, offset)
        buf = bytearray(CHUNK)
        position = 0
        while position < offset:
            got = os.preadv(fd, [memoryview(buf)[: min(CHUNK, offset - position)]], position)
            if not got:
                os.close(fd)
                raise HostError("partial file of %s shrank while resuming" % name, EXIT_BAD_OFFSET)
            digests.update(memoryview(buf)[:got])
            position += got
        os.lseek(fd, offset, os.SEEK_SET)
    else:
        write_json_atomic(partial + ".json", spec)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    return fd, digests


# -- operations -----------------------------------------------------------------------------


def probe(request):
    """What the engram dir holds of ``names``; with ``verify`` (specs), the ones whose file and manifest
    say they are complete for that spec are re-hashed too (``verified``, as ``verify`` answers), so one
    run of this program answers what pack-engram looks at first."""
    dest, names = request["dest"], request["names"]
    shards = {}
    for name in names:
        path = os.path.join(dest, name)
        entry = {"final": None, "partial": None, "partial_spec": None, "manifest": None}
        if os.path.isfile(path):
            entry["final"] = os.path.getsize(path)
        if os.path.isfile(path + ".partial"):
            entry["partial"] = os.path.getsize(path + ".partial")
            try:
                with open(path + ".partial.json") as f:
                    entry["partial_spec"] = json.load(f)
            except (OSError, ValueError):
                pass
        try:
            with open(os.path.join(dest, manifest_name(name))) as f:
                entry["manifest"] = json.load(f)
        except (OSError, ValueError):
            pass
        shards[name] = entry
    answer = {"python": sys.version.split()[0], "xxhash": have_xxhash(), "shards": shards}
    complete = [spec for spec in request.get("verify") or [] if looks_complete(spec, shards.get(spec["file"]))]
    if complete:
        answer["verified"] = verify({"dest": dest, "specs": complete})["shards"]
    return answer


def looks_complete(spec, entry):
    """A manifest for this exact spec next to a file of its size (the manifest is written only after the
    file was hashed, fsynced and renamed): worth re-hashing before it is trusted."""
    entry = entry or {}
    manifest = entry.get("manifest")
    return isinstance(manifest, dict) and plan_part(manifest) == spec and entry.get("final") == spec.get("size")


def read_into(stream, view):
    """Fill ``view`` from ``stream`` (a pipe may return less per call); fewer bytes only at EOF."""
    got = 0
    while got < len(view):
        n = stream.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def read_exactly(stream, n):
    parts, got = [], 0
    while got < n:
        data = stream.read(min(CHUNK, n - got))
        if not data:
            break
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def receive(dest, spec, offset, stream):
    """stdin: the shard's bytes [offset, size), then an 8-byte length and a JSON trailer with the
    sender's sha256/xxh3 of the whole file. Commit only when our own hash of the file agrees."""
    os.makedirs(dest, exist_ok=True)
    name, size = spec["file"], spec["size"]
    started = time.monotonic()
    with ShardLock(dest, name):
        fd, digests = start_partial(dest, spec, offset)
        hasher = BackgroundDigests(digests)
        ring = Ring(4, CHUNK)
        received = 0
        try:
            remaining = size - offset
            while remaining:
                buf = ring.take()
                got = read_into(stream, memoryview(buf)[: min(CHUNK, remaining)])
                if not got:
                    ring.give(buf)
                    os.fsync(fd)
                    raise HostError("input ended after %d of %d bytes of %s; partial kept for a resume" % (
                        offset + received, size, name), EXIT_SHORT)
                slot = Slot(ring, buf, got, 2)
                hasher.feed(slot)
                write_all(fd, slot.view)
                slot.release()
                received += got
                remaining -= got
            os.fsync(fd)
        finally:
            os.close(fd)
            hasher.close()
        header = read_exactly(stream, TRAILER_LEN.size)
        if len(header) != TRAILER_LEN.size:
            raise HostError("input ended before the trailer of %s; partial kept for a resume" % name, EXIT_SHORT)
        (length,) = TRAILER_LEN.unpack(header)
        sent = json.loads(read_exactly(stream, length).decode())
        ours = hasher.result()
        common = [k for k in ("xxh3_128", "sha256") if ours[k] is not None and sent.get(k) is not None]
        bad = [k for k in common if sent[k] != ours[k]]
        if bad or not common:
            remove(os.path.join(dest, name + ".partial"))
            remove(os.path.join(dest, name + ".partial.json"))
            what = ("%s of the written file differs from the sender's" % bad[0]) if bad else \
                "the sender sent no digest this host can compute"
            raise HostError("%s: %s (%s); partial removed" % (
                name, what, "resumed at byte %d" % offset if offset else "fresh write"), EXIT_MISMATCH)
        manifest = commit(dest, spec, {k: ours[k] or sent.get(k) for k in ("sha256", "xxh3_128")})
    return {"file": name, "bytes": received, "resumed_from": offset, "seconds": time.monotonic() - started,
            "sha256": manifest["sha256"], "xxh3_128": manifest["xxh3_128"]}


SAMPLE_BLOCKS = 16
SAMPLE_BYTES = 64 * 1024


def sample_sha256(f, data_start, size):
    """sha256 of SAMPLE_BLOCKS blocks of SAMPLE_BYTES spread evenly over a safetensors file's data
    (the first and last included): a fingerprint of the tensor bytes that costs 1 MiB of reads
    whatever the file's size, so a re-downloaded file with the same header but other contents (a new
    revision of the tables) is not taken for the planned one. It is part of every shard's spec."""
    digest = hashlib.sha256()
    span = max(0, size - data_start)
    if span <= SAMPLE_BLOCKS * SAMPLE_BYTES:
        offsets, length = [data_start], span
    else:
        last = span - SAMPLE_BYTES  # the last block ends at the file's end
        offsets = [data_start + i * last // (SAMPLE_BLOCKS - 1) for i in range(SAMPLE_BLOCKS)]
        length = SAMPLE_BYTES
    for offset in offsets:
        f.seek(offset)
        digest.update(f.read(length))
    return digest.hexdigest()


def engram_content_sha256(f, data_start, header_bytes, pattern):
    """sha256 of every byte of the Engram tensors in one safetensors file (in offset order): the full
    content check, where sample_sha256 reads 1 MiB. Reads the tables once, sequentially."""
    header = json.loads(header_bytes.decode("utf-8"))
    spans = sorted(tuple(entry["data_offsets"]) for name, entry in header.items()
                   if name != "__metadata__" and pattern.search(name))
    digest = hashlib.sha256()
    for begin, end in spans:
        f.seek(data_start + begin)
        left = end - begin
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                raise HostError("%s ends inside an Engram tensor (truncated?)" % f.name, EXIT_SOURCE)
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def file_identity(path):
    """(size, header bytes, sample_sha256) of a safetensors file; raises OSError or struct.error."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = f.read(min(length, 100 * 1024 * 1024))
        return size, header, sample_sha256(f, 8 + length, size)


def check_sources(root, sources):
    """The checkpoint copy at ``root`` has the planned files: same size, header and sampled contents."""
    for rel, want in sorted(sources.items()):
        path = os.path.join(root, rel) if root else rel
        try:
            size, header, sample = file_identity(path)
        except (OSError, struct.error) as err:
            raise HostError("%s: cannot read (%s)" % (path, err), EXIT_SOURCE)
        if size != want["size"] or hashlib.sha256(header).hexdigest() != want["header_sha256"]:
            raise HostError("%s is not the planned file (size %d, expected %d, or a different header): "
                            "this host's checkpoint copy differs" % (path, size, want["size"]), EXIT_SOURCE)
        if sample != want.get("sample_sha256"):
            raise HostError("%s has the planned header but other tensor bytes (a different download or "
                            "revision): this host's checkpoint copy differs" % path, EXIT_SOURCE)


def cut_one(root, dest, spec, chunk=CHUNK):
    """Cut one shard from local source files: temp name, fsync, rename, manifest. Restarts an
    interrupted shard from byte 0 (reading local disk is cheaper than trusting a stale prefix)."""
    os.makedirs(dest, exist_ok=True)
    started = time.monotonic()
    with ShardLock(dest, spec["file"]):
        fd, digests = start_partial(dest, spec, 0)
        hasher = BackgroundDigests(digests)
        ring = Ring(4, chunk)
        written = 0
        try:
            for slot in prefetch(shard_slots(root, spec, ring, 2)):
                hasher.feed(slot)
                write_all(fd, slot.view)
                slot.release()
                written += slot.n
            os.fsync(fd)
        except BaseException:
            ring.close()
            raise
        finally:
            os.close(fd)
            hasher.close()
        if written != spec["size"]:
            raise HostError("%s: wrote %d bytes, planned %d" % (spec["file"], written, spec["size"]))
        manifest = commit(dest, spec, hasher.result())
    return {"file": spec["file"], "bytes": written, "resumed_from": 0, "seconds": time.monotonic() - started,
            "sha256": manifest["sha256"], "xxh3_128": manifest["xxh3_128"]}


def cut(request):
    root, dest = request["root"], request["dest"]
    specs = request["specs"]
    sources = {}
    for spec in specs:
        sources.update(spec.get("sources", {}))
    check_sources(root, sources)
    return {"shards": [cut_one(root, dest, spec, request.get("chunk", CHUNK)) for spec in specs]}


def hash_file(path, xxh3, sha256):
    digests = Digests(xxh3=xxh3, sha256=sha256)
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(CHUNK)
        position = 0
        while True:
            got = os.preadv(fd, [buf], position)
            if not got:
                break
            digests.update(memoryview(buf)[:got])
            position += got
    finally:
        os.close(fd)
    return digests.result(), position


def verify(request):
    dest = request["dest"]
    out = []
    for spec in request["specs"]:
        name = spec["file"]
        path = os.path.join(dest, name)
        entry = {"file": name, "status": "ok", "detail": "", "algorithms": []}
        try:
            with open(os.path.join(dest, manifest_name(name))) as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            manifest = None
        if not os.path.isfile(path):
            entry["status"] = "incomplete" if os.path.isfile(path + ".partial") else "missing"
        elif manifest is None:
            entry["status"], entry["detail"] = "incomplete", "no manifest (interrupted before the commit)"
        elif plan_part(manifest) != plan_part(spec):
            entry["status"], entry["detail"] = "stale", "the manifest describes another plan (checkpoint, TP or hosts changed)"
        else:
            use_xxh3 = manifest.get("xxh3_128") is not None and have_xxhash()
            use_sha = not use_xxh3 and manifest.get("sha256") is not None
            started = time.monotonic()
            if use_xxh3 or use_sha:
                ours, size = hash_file(path, use_xxh3, use_sha)
            else:
                ours, size = {}, os.path.getsize(path)
            entry["seconds"] = time.monotonic() - started
            entry["algorithms"] = [k for k in ("xxh3_128", "sha256") if ours.get(k) is not None]
            if not entry["algorithms"]:
                entry["status"] = "unverifiable"
                entry["detail"] = "the manifest has only xxh3_128 and this host's python3 has no xxhash module (install python3-xxhash)"
            elif size != spec["size"]:
                entry["status"], entry["detail"] = "corrupt", "size %d, expected %d" % (size, spec["size"])
            else:
                for key in entry["algorithms"]:
                    if ours[key] != manifest.get(key):
                        entry["status"] = "corrupt"
                        entry["detail"] = "%s %s... differs from the manifest's %s..." % (key, ours[key][:12], str(manifest.get(key))[:12])
                        break
        out.append(entry)
    return {"xxhash": have_xxhash(), "shards": out}


def describe(request):
    """What the control side needs to plan from a host's checkpoint copy, without the tensors."""
    root = request["root"]
    out = {"root": root, "config": None, "index": None, "headers": {}}
    config_path = os.path.join(root, "config.json")
    if not os.path.isdir(root):
        raise HostError("checkpoint directory %s not found" % root, EXIT_SOURCE)
    if not os.path.isfile(config_path):
        raise HostError("no config.json in %s" % root, EXIT_SOURCE)
    with open(config_path, encoding="utf-8") as f:
        out["config"] = f.read()
    pattern = re.compile(r"(?:^|\.)layers\.\d+\.engram\.")
    index_path = os.path.join(root, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            out["index"] = f.read()
        try:
            weight_map = json.loads(out["index"]).get("weight_map") or {}
        except (ValueError, AttributeError):
            weight_map = {}  # the control side parses it again and names the problem
        files = sorted({f for n, f in weight_map.items() if isinstance(f, str) and pattern.search(n)})
    elif os.path.isfile(os.path.join(root, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        files = []
    for rel in files:
        path = os.path.join(root, rel)
        if "/" in rel or rel.startswith("..") or not os.path.isfile(path):
            continue  # the control side reports it, with the same message as for a local checkpoint
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            header = f.read(min(length, 100 * 1024 * 1024))
            sample = sample_sha256(f, 8 + length, size)
            entry = {"size": size, "prefix": base64.b64encode(head).decode(),
                     "header": base64.b64encode(header).decode(), "sample_sha256": sample}
            if request.get("full"):
                try:
                    entry["content_sha256"] = engram_content_sha256(f, 8 + length, header, pattern)
                except (ValueError, KeyError, TypeError, AttributeError) as err:  # a header that is not JSON
                    entry["content_error"] = "unreadable header (%s)" % err.__class__.__name__
        out["headers"][rel] = entry
    return out


OPERATIONS = {"probe": probe, "cut": cut, "verify": verify, "describe": describe}


def exit_when_orphaned(fd=1, every_s=1.0):
    """Watch our stdout, the SSH channel back to pack-engram: when nobody reads it any more (Ctrl-C or
    kill of the command there), stop cutting at once instead of running to the end, removing the
    folder we were shipped to. Partial shards stay for a resume; the writers' lock is an flock,
    released with the process."""
    def watch():
        poller = select.poll()
        poller.register(fd, select.POLLERR | select.POLLHUP)
        while True:
            if poller.poll(int(every_s * 1000)):
                controller_gone(EXIT_ORPHANED)

    threading.Thread(target=watch, daemon=True, name="orphan-watch").start()


def main(argv):
    """One operation, then the folder this program was shipped to is removed (each run ships its own)."""
    try:
        return _operation(argv)
    finally:
        remove_shipped_folder()


def _operation(argv):
    exit_when_orphaned()
    try:
        if argv and argv[0] == "receive":
            dest, spec, offset = argv[1], json.loads(argv[2]), int(argv[3])
            result = receive(dest, spec, offset, sys.stdin.buffer)
        elif argv and argv[0] in OPERATIONS:
            result = OPERATIONS[argv[0]](json.loads(sys.stdin.buffer.read().decode()))
        else:
            raise HostError("unknown operation %r" % (argv[:1],), 2)
    except HostError as err:
        sys.stderr.write("%s\n" % err)
        return err.code
    except OSError as err:
        sys.stderr.write("%s\n" % err)
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
