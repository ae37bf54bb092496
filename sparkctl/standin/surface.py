"""The stand-in engine's surface, in the document sparkctl reads from any engine image.

``sparkctl.images.surface`` runs one probe program inside an image (``python3 -c PROBE ENGINE``,
entrypoint cleared, no network, no GPU). In a real image the probe asks the engine itself (its
argument parser, its environment-variable table, its parser registries, its package files). In
the sandbox image there is no engine package to ask, so the probe falls back to this module,
which answers from exactly what the stand-in obeys: the flags file its argparse parser is built
from, the variables file, the parser names, the stand-in package's layout and its HTTP routes.
A variant image whose flags or variables file lacks an entry therefore shows it here, the same
way a different engine build would.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Dict, List, Optional

from . import flags as F
from .routes import declared

# The routes each engine declares (server.py answers every one: served, or 501 in the engine's shape).
ROUTES = {engine: sorted(declared(engine)) for engine in ("vllm", "sglang")}
LAYOUT_LIMIT = 20000  # files listed at most (a real vLLM has ~2,500 .py files)


def package_layout(engine: str, root: Optional[str] = None) -> Dict[str, object]:
    """The engine package's files relative to its root: ``root`` if given, else the first
    ``/usr/local/lib/python3*/dist-packages/<engine>`` (where the sandbox chain's base puts it)."""
    candidates = [root] if root else sorted(glob.glob(f"/usr/local/lib/python3*/dist-packages/{engine}"))
    for candidate in candidates:
        if candidate and os.path.isdir(candidate):
            files: List[str] = []
            for folder, dirs, names in os.walk(candidate):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                rel = os.path.relpath(folder, candidate)
                for name in sorted(names):
                    if len(files) < LAYOUT_LIMIT:
                        files.append(name if rel == "." else f"{rel}/{name}")
            return {"package_root": candidate, "layout": files}
    return {"package_root": None, "layout": None}


def surface(engine: str, package_root: Optional[str] = None) -> Dict[str, object]:
    path = F.find_flags_file(engine)
    version = F.version_of(path, engine)
    options = F.load_flags(path)
    envs_path = path.with_name(f"{engine}-{version}-envs.txt")
    envs = None
    if envs_path.is_file():
        envs = sorted({line.strip() for line in envs_path.read_text(encoding="utf-8").splitlines() if line.strip()})
    switches: List[str] = []
    if engine == "sglang":
        # The SGLang line's overlay: the switches its adapter folders on PYTHONPATH read (the stand-in
        # honours exactly these, overlay.check_switches), as the probe reads them from a real image.
        from .overlay import image_switches

        switches = sorted(image_switches(os.environ) or ())
        if envs is not None:
            envs = sorted(set(envs) | set(switches))
    parsers: Dict[str, List[str]] = {}
    parsers_path = path.with_name("parsers.json")
    if parsers_path.is_file():
        parsers = json.loads(parsers_path.read_text(encoding="utf-8")).get(f"{engine}-{version}", {})
    doc: Dict[str, object] = {
        "engine": engine,
        "version": version,
        "reader": "sparkctl stand-in",
        "flags": {name: {"takes_value": bool(spec.get("takes_value")), "choices": spec.get("choices")}
                  for name, spec in sorted(options.items())},
        "envs": envs,
        "parsers": parsers,
        "routes": ROUTES.get(engine, []),
        "switches": switches,
    }
    doc.update(package_layout(engine, package_root))
    return doc


def main(argv: List[str]) -> int:
    engine = argv[0] if argv else "vllm"
    print(json.dumps(surface(engine, argv[1] if len(argv) > 1 and argv[1] else None)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
