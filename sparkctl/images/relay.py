"""``distribute --from HOST`` on the source host itself: one ``docker save`` there, streamed straight
to the other hosts over the fabric, so the image never crosses the machine running sparkctl (a
laptop on a slow link, a bastion). The fan-out is the same code as on the control machine
(``sparkctl.images.fanout``): per-host bounded queues, thin archives, laggards detached.

The control machine sends this module, with fanout, archive, inputs and pipe, as a zip
(``relay_zip``) and runs ``python3 relay.pyz SPEC`` with the host's own python3 (standard library
only). SPEC is JSON: ``tag``, ``diff_ids`` (its layers), ``known_hosts`` (the host keys the
control machine verified, under their HostKeyAlias), ``queue_bytes``, ``stall_timeout``,
``lag_fraction``, ``bwlimit`` and ``targets`` (each ``name``, ``argv`` -- the ssh command running
``docker load`` there --, ``where`` and ``present``, the chain IDs whose layers it has). Its
stdout is JSON lines:

    {"progress": {"spark-2": 1048576, ...}}                      (every half second)
    {"done": {"spark-2": {"state", "error", "cause", "bytes_sent", "seconds"}, ...},
     "source_bytes": N, "source_error": null}
"""

from __future__ import annotations

import importlib
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import zipfile

from sparkctl.images.fanout import Sink, stream_to_all
from sparkctl.images.orphan import emit, remove_when_orphaned
from sparkctl.images.pipe import Rate, pipe_into, read_from

CHUNK = 1024 * 1024
KNOWN_HOSTS_PLACEHOLDER = "{known_hosts}"  # in a target's argv: the file the relay writes SPEC's keys to
# What the zip carries: the relay and what it imports (all standard library underneath).
MODULES = ("sparkctl.images.relay", "sparkctl.images.fanout", "sparkctl.images.archive", "sparkctl.images.inputs",
           "sparkctl.images.pipe", "sparkctl.images.orphan")


def relay_zip(modules: tuple[str, ...] = MODULES, main_module: str = "sparkctl.images.relay", *,
              bytecode: bool = True) -> bytes:
    """The relay as a zip application: the modules above, empty package files, a __main__.
    ``model sync`` ships its host agent the same way (other ``modules`` and ``main_module``).

    Each module's ``.pyc`` beside its ``.py`` (``sparkctl.bytecode.zip_pyc``): zipimport never
    writes a cache, so without it every run compiles them all. A host python3 with another magic
    number ignores the pyc and compiles the source (``bytecode=False``: sources only)."""
    from sparkctl.bytecode import zip_pyc  # here: this module runs on hosts too, where the zip has no bytecode.py

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        def add(arcname: str, source: bytes) -> None:
            archive.writestr(arcname, source)
            if bytecode:
                archive.writestr(arcname + "c", zip_pyc(source, arcname))

        packages = {name.rsplit(".", 1)[0] for name in modules} | {"sparkctl"}
        for package in sorted(packages):
            add(package.replace(".", "/") + "/__init__.py", b"")
        for name in modules:
            with open(importlib.import_module(name).__file__, "rb") as handle:
                add(name.replace(".", "/") + ".py", handle.read())
        add("__main__.py", f"import sys\nfrom {main_module} import main\nsys.exit(main(sys.argv[1:]))\n".encode())
    return buffer.getvalue()


def _emit(doc: dict) -> None:
    emit(doc)  # a write that fails means sparkctl is gone: clean up and end (sparkctl.images.orphan)


def main(args: list[str]) -> int:
    spec = json.loads(args[0])
    folder = tempfile.mkdtemp(prefix="sparkctl-relay-")
    remove_when_orphaned(folder)
    try:
        known_hosts = os.path.join(folder, "known_hosts")
        with open(known_hosts, "w") as handle:
            handle.write(spec["known_hosts"])
        targets = {t["name"]: t for t in spec["targets"]}
        sinks = [Sink(name, frozenset(t["present"]), spec["queue_bytes"]) for name, t in targets.items()]
        sent = {name: 0 for name in targets}
        bwlimit = spec.get("bwlimit")

        def send(sink: Sink):
            limiter = Rate(bwlimit) if bwlimit else None

            def on_sent(total: int) -> None:
                sent[sink.name] = total
                if limiter is not None:
                    limiter(total)

            target = targets[sink.name]
            argv = [arg.replace(KNOWN_HOSTS_PLACEHOLDER, known_hosts) for arg in target["argv"]]
            return pipe_into(argv, sink, on_sent, target["where"])

        finished = threading.Event()

        def report_progress() -> None:
            while not finished.wait(0.5):
                _emit({"progress": dict(sent)})

        reporter = threading.Thread(target=report_progress, daemon=True)
        reporter.start()
        stream, close = read_from(["docker", "save", spec["tag"]], "docker save", CHUNK)
        result = stream_to_all(stream, spec["diff_ids"], sinks, send, stall_timeout=spec["stall_timeout"],
                               lag_fraction=spec["lag_fraction"], close_source=close)
        finished.set()
        reporter.join()
        _emit({"progress": dict(sent)})
        _emit({
            "done": {s.name: {"state": s.state, "error": s.error, "cause": s.cause, "bytes_sent": s.bytes_sent,
                              "seconds": round(s.finished - s.started, 3)} for s in sinks},
            "source_bytes": result.source_bytes, "source_error": result.source_error,
        })
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
