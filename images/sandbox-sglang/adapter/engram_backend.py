"""Sandbox stand-in of the SGLang line's Engram adapter: the switches it reads, and its row store.

The real adapter replaces SGLang's Engram embedding with a file-backed one that reads exact rows
from local NVMe. This one reads the same switches and opens the same packed shards with the
stand-in engine's row store (``engram_nvme``), refusing what the real one could not serve from.
"""

import os


def _row_store():
    try:
        from sparkctl_standin import engram_nvme  # inside the sandbox image
    except ImportError:  # the stand-in run from a checkout (tests)
        from sparkctl.standin import engram_nvme
    return engram_nvme


def start(environ, model_path, rank, tp, log):
    # `environ` is the process environment (os.environ in the engine): the switches read below are the
    # names a surface probe finds in this file.
    mode = environ.get("OFFLOAD_MODE", "nvme")
    if mode == "ram":
        log("INFO", "Engram tables in host RAM (OFFLOAD_MODE=ram)")
        return None
    if mode != "nvme":
        raise _row_store().EngramError("OFFLOAD_MODE=%r: the adapter knows nvme and ram" % mode)
    packed_dir = environ.get("DSV41_PACKED_DIR", "/engram")
    source = environ.get("DSV41_SOURCE") or model_path
    log("INFO", "Engram offload: nvme, packed dir %s, io threads %s, row cache %s GiB" % (
        packed_dir, environ.get("DSV41_IO_THREADS", "96"), environ.get("DSV41_CACHE_GIB", "0")))
    return _row_store().attach(packed_dir, source, rank, tp, log)
