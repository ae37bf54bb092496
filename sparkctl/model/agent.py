"""What ``sparkctl model sync`` runs on a host (and in-process on the control machine): standard
library only (``xxhash`` used when importable), shipped as a zip like ``distribute --from``'s relay.

    python3 agent.pyz probe DIR            -> {"has_xxhash", "free", "python"}
    python3 agent.pyz build DIR ALGO       -> the manifest of the checkpoint in DIR (every file hashed)
    python3 agent.pyz check DIR  < MANIFEST -> what DIR holds of it: each file ok / missing / size / content,
                                              the partial bytes kept for a resume, the free space, the kept manifest
    python3 agent.pyz receive DIR < FRAMES -> writes files sent by ``send`` (below), one JSON line per file
    python3 agent.pyz send SPEC_FILE       -> streams the files each target lacks to its ``receive`` (over ssh)

A file is written as ``NAME.sparkctl-part`` and renamed to NAME only once its whole content hashes
to the manifest's digest (so a half-written file never carries its final name); a part left by a
killed transfer is continued from its last byte. The manifest is kept with the copy as
``.sparkctl-manifest.json``; the receiver writes it last, after every file of it has been verified.

Hashes: ``xxh3_128`` when every party has the ``xxhash`` module, else ``sha256`` (hashlib, in
every python3, and what the hub's LFS metadata gives). Files are hashed on several threads
(hashlib and xxhash release the GIL on large buffers).
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# Shipped in the same zip (standard library underneath): the per-host rate limit and ssh's exit
# status for a failed connection, as ``distribute``'s streams use them.
from sparkctl.images.orphan import emit, remove_shipped_folder, remove_when_orphaned
from sparkctl.images.pipe import SSH_FAILED, Rate, finish, last_line, write_all

MANIFEST_NAME = ".sparkctl-manifest.json"
PART_SUFFIX = ".sparkctl-part"
CHUNK = 4 * 1024 * 1024
HASH_THREADS = 8
STOP_WAIT_S = 30  # an interrupted send waits this long for its streams to end (their receivers keep the part)
KNOWN_HOSTS_PLACEHOLDER = "{known_hosts}"  # in a target's argv: the file ``send`` writes the spec's host keys to


def has_xxhash():
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


def new_hasher(algo):
    if algo == "xxh3_128":
        import xxhash  # here, not at the top: a host's python3 may not have it (has_xxhash decides)

        return xxhash.xxh3_128()
    if algo == "sha256":
        return hashlib.sha256()
    raise ValueError("unknown hash %r" % algo)


def hash_file(path, algo, limit=None, on_read=None):
    """The hex digest of ``path`` (its first ``limit`` bytes when given)."""
    hasher = new_hasher(algo)
    remaining = limit
    with open(path, "rb") as handle:
        while remaining is None or remaining > 0:
            block = handle.read(CHUNK if remaining is None else min(CHUNK, remaining))
            if not block:
                break
            hasher.update(block)
            if on_read is not None:
                on_read(len(block))
            if remaining is not None:
                remaining -= len(block)
    return hasher.hexdigest()


def safe_relative(name):
    """A manifest's file name must stay inside the checkpoint folder."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def checkpoint_files(root):
    """Every regular file under ``root`` (relative names), without our own bookkeeping files and
    hidden folders (a hub download's ``.cache``)."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name == MANIFEST_NAME or name.endswith(PART_SUFFIX) or name.startswith("."):
                continue
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                out.append(os.path.relpath(path, root).replace(os.sep, "/"))
    return out


def free_bytes(path):
    """Bytes an unprivileged writer may still use on the filesystem that holds ``path`` (or would)."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    stat = os.statvfs(probe)
    return stat.f_bavail * stat.f_frsize


def read_kept(root):
    try:
        with open(os.path.join(root, MANIFEST_NAME)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_atomic(path, data):
    tmp = path + PART_SUFFIX
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- ops


def probe(root):
    return {"has_xxhash": has_xxhash(), "free": free_bytes(root), "python": sys.version.split()[0]}


def build(root, algo, expected=None, on_read=None):
    """The manifest of ``root``: each file's size and digest. ``expected`` (name -> sha256, the hub's
    LFS metadata) is checked on the way: a file that differs is reported, not trusted. ``on_read``
    (optional) is told the size of every block read, for a progress line."""
    if not os.path.isdir(root):
        raise FileNotFoundError("no such folder: %s" % root)
    names = checkpoint_files(root)

    def one(name):
        path = os.path.join(root, name)
        size = os.path.getsize(path)
        if algo == "sha256" or not (expected and expected.get(name)):
            return name, {"size": size, algo: hash_file(path, algo, on_read=on_read)}
        # Both digests in one read: ours for the fan-out, sha256 against the hub's.
        fast, sha = new_hasher(algo), hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(CHUNK), b""):
                fast.update(block)
                sha.update(block)
                if on_read is not None:
                    on_read(len(block))
        return name, {"size": size, algo: fast.hexdigest(), "sha256": sha.hexdigest()}

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        files = dict(pool.map(one, names))
    problems = []
    for name, sha in (expected or {}).items():
        if not sha:
            continue
        if name not in files:
            problems.append("%s: missing" % name)
        elif files[name].get("sha256") != sha:
            problems.append("%s: sha256 %s, the hub says %s" % (name, files[name].get("sha256"), sha))
    return {"version": 1, "algo": algo, "files": files, "problems": problems}


def build_told(root, algo, expected, emit, every=0.5):
    """``build`` on a host, telling ``emit`` how far it is: ``{"hashing": {"done", "total"}}`` at most
    every ``every`` seconds (and once at the end), then ``{"manifest": ...}``. The total is known
    before the first read, so sparkctl can say a percent and a time left for a remote source too."""
    names = checkpoint_files(root) if os.path.isdir(root) else []
    total = sum(os.path.getsize(os.path.join(root, name)) for name in names)
    state = {"done": 0, "last": time.monotonic()}
    lock = threading.Lock()

    def on_read(n):
        with lock:  # the hashing threads share it; one line at a time
            state["done"] += n
            now = time.monotonic()
            if now - state["last"] >= every:
                state["last"] = now
                emit({"hashing": {"done": state["done"], "total": total}})

    manifest = build(root, algo, expected, on_read)
    emit({"hashing": {"done": state["done"], "total": total}})
    emit({"manifest": manifest})
    return manifest


def check(root, manifest):
    """What ``root`` holds of ``manifest``: per file ``ok``, ``missing``, ``size`` (wrong size) or
    ``content`` (right size, wrong digest), and the bytes of a part file kept for a resume."""
    algo = manifest["algo"]
    files = manifest["files"]

    def one(name):
        if not safe_relative(name):
            return name, {"state": "refused", "size": None, "part": 0}
        path = os.path.join(root, name)
        part_path = path + PART_SUFFIX
        part = os.path.getsize(part_path) if os.path.isfile(part_path) else 0
        if not os.path.isfile(path):
            return name, {"state": "missing", "size": None, "part": part}
        size = os.path.getsize(path)
        if size != files[name]["size"]:
            return name, {"state": "size", "size": size, "part": part}
        same = hash_file(path, algo) == files[name][algo]
        return name, {"state": "ok" if same else "content", "size": size, "part": part}

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        states = dict(pool.map(one, sorted(files)))
    return {"has_xxhash": has_xxhash(), "free": free_bytes(root), "kept": read_kept(root), "files": states}


def _emit(doc, out=None):
    emit(doc, out)  # a write that fails means sparkctl is gone: clean up and end (sparkctl.images.orphan)


def receive(root, stream, out=None):
    """Write the frames on ``stream`` under ``root``. A frame is a JSON header line then, for a file,
    ``size - offset`` raw bytes: ``{"file", "offset", "size", "algo", "digest"}``; or the closing
    ``{"manifest": {...}}``, kept as ``.sparkctl-manifest.json``. Returns the exit status.

    A stream that ends before its closing frame means the sender is gone (sparkctl killed or
    interrupted, the sending agent ended, the link dropped): the receiver then removes the folder it
    was shipped to, as when its own reader goes (``sparkctl.images.orphan``). A sparkctl that is still
    running ships the agent again for its retry; one that is gone could not remove it."""
    os.makedirs(root, exist_ok=True)
    # One writer per copy: the folder itself is flock()ed (no lock file among the checkpoint's files).
    guard = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(guard)
        _emit({"ok": False, "error": "another model sync is writing into %s" % root}, out)
        return 4
    try:
        status, closed = _receive_frames(root, stream, out)
    finally:
        os.close(guard)
    if not closed:
        remove_shipped_folder()
    return status


def _receive_frames(root, stream, out):
    """(exit status, whether the sender closed the stream with its manifest frame)."""
    failed = closed = False
    while True:
        line = stream.readline()
        if not line:
            return (1 if failed else 0), closed
        header = json.loads(line)
        if "manifest" in header:
            closed = True
            if failed:
                _emit({"manifest": "not written: a file failed"}, out)
                return 1, closed
            os.makedirs(root, exist_ok=True)
            write_atomic(os.path.join(root, MANIFEST_NAME), json.dumps(header["manifest"], indent=1).encode())
            _emit({"manifest": "written"}, out)
            continue
        result = _receive_file(root, header, stream)
        _emit(result, out)
        if result.get("ended"):
            return 3, False  # the sender went away mid-file: the part stays for a resume
        failed = failed or not result["ok"]


def _receive_file(root, header, stream):
    name, offset, size = header["file"], int(header["offset"]), int(header["size"])
    if not safe_relative(name):
        raise SystemExit("refusing file name %r" % name)
    path = os.path.join(root, name)
    part = path + PART_SUFFIX
    os.makedirs(os.path.dirname(path), exist_ok=True)
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    if have < offset:  # the part shrank since it was checked: drop it and these bytes; the next round resends
        left = size - offset
        while left:
            block = stream.read(min(CHUNK, left))
            if not block:
                break
            left -= len(block)
        if os.path.exists(part):
            os.unlink(part)
        return {"file": name, "ok": False, "ended": bool(left),
                "error": "the partial file shrank to %d bytes, below the %d it was sent from; it will be resent"
                % (have, offset)}
    hasher = new_hasher(header["algo"])
    with open(part, "r+b" if os.path.exists(part) else "wb") as handle:
        if offset:
            handle.seek(0)
            left = offset
            while left:  # the kept prefix counts towards the digest too
                block = handle.read(min(CHUNK, left))
                if not block:
                    break
                hasher.update(block)
                left -= len(block)
        handle.seek(offset)
        handle.truncate(offset)
        left = size - offset
        while left:
            block = stream.read(min(CHUNK, left))
            if not block:
                handle.flush()
                os.fsync(handle.fileno())
                return {"file": name, "ok": False, "ended": True, "kept": size - left,
                        "error": "the stream ended at byte %d of %d (kept for a resume)" % (size - left, size)}
            handle.write(block)
            hasher.update(block)
            left -= len(block)
        handle.flush()
        os.fsync(handle.fileno())
    digest = hasher.hexdigest()
    if digest != header["digest"]:
        os.unlink(part)
        return {"file": name, "ok": False, "error": "%s %s after the transfer, expected %s (resent from the start next time)"
                % (header["algo"], digest, header["digest"])}
    os.replace(part, path)
    return {"file": name, "ok": True, "bytes": size - offset, "resumed_from": offset}


# ---------------------------------------------------------------------------------------------- send


def send_one(root, target, algo, manifest, bwlimit, sent, stop=None):
    """Stream ``target["files"]`` (each ``{"file", "offset"}``) then the manifest into ``target["argv"]``
    (ssh HOST python3 agent receive DIR). Returns ``{"ok", "error", "files": [receiver lines]}``."""
    proc = subprocess.Popen(target["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=0, start_new_session=True)
    lines, errors = [], []
    readers = _read_receiver(proc, lines, errors)
    progress = {"total": 0}
    try:
        _send_files(proc.stdin, root, target, algo, manifest, Rate(bwlimit) if bwlimit else None, sent, stop, progress)
        write_all(proc.stdin, (json.dumps({"manifest": manifest}) + "\n").encode())
    except (BrokenPipeError, ConnectionError):
        pass  # the receiver ended early: its exit status and lines say why
    except OSError as err:
        errors.append(str(err))
        proc.kill()
    finally:
        code = finish(proc, readers)
    return _send_outcome(target, code, lines, last_line("".join(errors)), progress["total"])


def _read_receiver(proc, lines, errors):
    """The receiver's JSON lines into ``lines``, anything else (and its stderr) into ``errors``."""

    def read_out():
        for raw in proc.stdout:
            try:
                lines.append(json.loads(raw))
            except ValueError:
                errors.append(raw.decode("utf-8", "replace"))

    def read_err():
        errors.append(proc.stderr.read().decode("utf-8", "replace"))

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    return readers


def _send_files(stream, root, target, algo, manifest, throttle, sent, stop, progress):
    """Each file's header and the bytes from its offset on; ``sent[name]`` and ``progress`` count them."""
    for item in target["files"]:
        name, offset = item["file"], int(item["offset"])
        entry = manifest["files"][name]
        header = {"file": name, "offset": offset, "size": entry["size"], "algo": algo, "digest": entry[algo]}
        write_all(stream, (json.dumps(header) + "\n").encode())
        with open(os.path.join(root, name), "rb") as handle:
            handle.seek(offset)
            left = entry["size"] - offset
            while left:
                if stop is not None and stop.is_set():
                    raise BrokenPipeError("stopped")
                block = handle.read(min(CHUNK, left))
                if not block:
                    raise OSError("%s shrank on the source while it was sent" % name)
                write_all(stream, block)
                left -= len(block)
                progress["total"] += len(block)
                sent[target["name"]] = progress["total"]
                if throttle is not None:
                    throttle(progress["total"])


def _send_outcome(target, code, lines, last, total):
    if code == 0:
        return {"ok": True, "error": None, "files": lines, "bytes_sent": total}
    bad = [line for line in lines if not line.get("ok", True)]
    if bad:
        error = ("%s: %s" % (bad[0]["file"], bad[0].get("error"))) if "file" in bad[0] else str(bad[0].get("error"))
    elif code == SSH_FAILED:
        error = "ssh to %s: %s" % (target["where"], last or "connection failed")
    else:
        error = "the receiver on %s failed (exit %d): %s" % (target["where"], code, last or "no message")
    return {"ok": False, "error": error, "files": lines, "bytes_sent": total}


def send_all(spec, emit, every=0.5):
    """Every target at once, each on its own thread reading the source files itself (the page cache
    serves the others). ``emit`` gets ``{"progress": {name: bytes}}`` lines and one ``{"done": ...}``."""
    sent = {t["name"]: 0 for t in spec["targets"]}
    results, started = {}, {}
    stop = threading.Event()  # set when the caller is interrupted: every stream ends, and its ssh with it
    known = spec.get("known_hosts_file")

    def run(target):
        if known:
            target = dict(target, argv=[a.replace(KNOWN_HOSTS_PLACEHOLDER, known) for a in target["argv"]])
        started[target["name"]] = time.monotonic()
        try:
            result = send_one(spec["root"], target, spec["algo"], spec["manifest"], spec.get("bwlimit"), sent, stop)
        except Exception as err:  # reported as that host's failure
            result = {"ok": False, "error": "%s: %s" % (type(err).__name__, err), "files": [], "bytes_sent": sent[target["name"]]}
        result["seconds"] = round(time.monotonic() - started[target["name"]], 3)
        results[target["name"]] = result

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in spec["targets"]]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            time.sleep(every)
            emit({"progress": dict(sent)})
    except BaseException:  # Ctrl-C: the senders run in sessions of their own, so end them here
        stop.set()
        for thread in threads:
            thread.join(STOP_WAIT_S)
        raise
    emit({"progress": dict(sent)})
    emit({"done": results})
    return results


def main(args):
    op = args[0] if args else ""
    try:
        if op == "probe":
            _emit(probe(args[1]))
        elif op == "build":
            expected = json.loads(sys.stdin.read() or "null")
            _emit(build(args[1], args[2], expected))
        elif op == "build-told":  # build, with progress lines first
            build_told(args[1], args[2], None, _emit)
        elif op == "check":
            _emit(check(args[1], json.loads(sys.stdin.read())))
        elif op == "receive":
            return receive(args[1], sys.stdin.buffer)
        elif op == "send":
            with open(args[1]) as handle:  # a file: a manifest of many files would not fit in one argument
                spec = json.load(handle)
            folder = None
            if spec.get("known_hosts"):
                folder = tempfile.mkdtemp(prefix="sparkctl-sync-")
                remove_when_orphaned(folder)
                spec["known_hosts_file"] = os.path.join(folder, "known_hosts")
                with open(spec["known_hosts_file"], "w") as handle:
                    handle.write(spec["known_hosts"])
            try:
                send_all(spec, _emit)
            finally:
                if folder:
                    shutil.rmtree(folder, ignore_errors=True)
        else:
            sys.stderr.write("usage: agent probe|build|build-told|check|receive|send ...\n")
            return 2
    except OSError as err:
        sys.stderr.write("%s\n" % err)
        return 1
    return 0
