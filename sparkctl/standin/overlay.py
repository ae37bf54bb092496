"""The SGLang line's overlay in a stand-in image: which switches the image has, and its Engram backend.

The SGLang line's image is stock SGLang plus adapter folders on ``PYTHONPATH`` whose modules read
switches from the environment (``OFFLOAD_MODE``, ``DSV41_*``). The stand-in does what that image
does with them: the switches an image has are the names its adapter files read; a switch set in
the environment that the image's adapters do not read is refused (the image lacks it), and so is
any switch on an image with no overlay at all (stock SGLang). With the overlay present its
``engram_backend`` module starts the Engram row store (``engram_nvme``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Mapping, Optional

from .engram_nvme import EngramError, is_switch, names_read, overlay_folders
from .settings import StartupError

HOST_TABLE = "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"  # stock SGLang's Engram in host memory


def image_switches(env: Mapping[str, str]) -> Optional[set]:
    """The overlay switches the image's adapters read; None when the image has no overlay."""
    folders = overlay_folders(env.get("PYTHONPATH"))
    if not folders:
        return None
    found: set = set()
    for folder in folders:
        found.update(names_read(folder))
    return found


def check_switches(env: Mapping[str, str]) -> Optional[set]:
    """StartupError naming every set switch the image lacks; returns the image's switches."""
    wanted = sorted(name for name in env if is_switch(name))
    known = image_switches(env)
    if known is None:
        if wanted:
            raise StartupError(f"{', '.join(wanted)}: switch(es) of the SGLang line's overlay, and this image has no "
                               "overlay (no engram_backend adapter on PYTHONPATH); stock SGLang keeps Engram in host "
                               f"memory ({HOST_TABLE}=1)")
        return None
    lacking = [name for name in wanted if name not in known]
    if lacking:
        raise StartupError(f"this image's overlay has no switch {', '.join(lacking)} (its adapters read: "
                           f"{', '.join(sorted(known))}); build an image that has it or drop the variable")
    return known


def start_engram(env: Mapping[str, str], model_path: str, rank: int, tp: int, log):
    """The overlay's Engram backend for this rank (a RowStore, or None when it keeps the host table)."""
    if check_switches(env) is None or env.get(HOST_TABLE) == "1":
        return None
    folder = overlay_folders(env.get("PYTHONPATH"))[0]
    spec = importlib.util.spec_from_file_location("engram_backend", os.path.join(folder, "engram_backend.py"))
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    try:
        return backend.start(env, model_path, rank, tp, log)
    except EngramError as err:
        raise StartupError(f"Engram row store (rank {rank} of {tp}): {err}") from None
