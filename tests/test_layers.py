"""docs/architecture.md's layers, kept true: every import of one sparkctl package by another (at the top of a
module or inside a function) is one the table allows, or one of the few exceptions the page names."""

from __future__ import annotations

import ast
from pathlib import Path

from clirun import REPO

PACKAGE = REPO / "sparkctl"
BASE = {"__init__", "errors", "fileio", "secrets", "resources", "output", "reporter", "transfer", "progress", "httpclient",
        "bytecode", "plugins"}
DOMAIN = {"images", "model", "engram"}
PRODUCT_BELOW_CLI = BASE | DOMAIN | {"config", "commands", "engines", "remote", "ops", "launchers"}
MAY_IMPORT = {
    "config": BASE,
    "commands": BASE | {"config"},
    "engines": BASE | {"config", "commands"},
    "remote": BASE,
    **{domain: BASE | DOMAIN | {"config", "commands", "engines"} for domain in DOMAIN},
    "ops": PRODUCT_BELOW_CLI - {"launchers"},
    "launchers": PRODUCT_BELOW_CLI,
    "cli": (PRODUCT_BELOW_CLI - {"remote"}) | {"cli"},
}
# Below the plugins' own layer only their registries (the packages themselves) may be asked: who imports which.
REGISTRIES = {"sparkctl.engines": {"commands"}, "sparkctl.launchers": {"ops"}}
CLI_TRANSPORT = "sparkctl.cli.context"  # the interface reaches the transport through this module alone
# (importing module, imported module's package): the exceptions docs/architecture.md names, each for its reason there.
EXCEPTIONS = {
    ("sparkctl.config.inventory", "remote"),  # the inventory's one link to the transport (remote.target)
    ("sparkctl.engines.sglang", "engram"),  # the packed layout's name (engram.packed)
    ("sparkctl.ops.router_image", "standin"),  # the router image is made as the stand-in's is (standin.rootfs)
    ("sparkctl.cli.main", "sandbox"),  # the `sandbox` verbs
    ("sparkctl.cli.engram_cmd", "sandbox"),  # `sandbox make-checkpoint` writes onto the sandbox hosts
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The sparkctl modules ``path`` imports (for ``from a import b``: ``a.b`` when b is a module, else ``a``)."""
    found = set()
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                is_module = (REPO / Path(*submodule.split("."))).with_suffix(".py").exists() or \
                    (REPO / Path(*submodule.split("."))).is_dir()
                found.add(submodule if is_module else base)
    return {name for name in found if name == "sparkctl" or name.startswith("sparkctl.")}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _breaches() -> list[str]:
    breaches = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = _module_name(path)
        layer = _unit(importer)
        allowed = MAY_IMPORT.get(layer, BASE if layer in BASE else None)
        if allowed is None:  # the test harness (standin/, sandbox/) and the entry point may import anything
            continue
        for imported in _imports(path):
            unit = _unit(imported)
            if unit == layer or unit in allowed or (importer, unit) in EXCEPTIONS:
                continue
            if layer in REGISTRIES.get(imported, ()) or (importer == CLI_TRANSPORT and unit == "remote"):
                continue
            breaches.append(f"{importer} imports {imported} ({layer} may not import {unit})")
    return breaches


def test_every_import_between_packages_follows_the_layers():
    assert _breaches() == []


def test_the_check_sees_an_import_that_breaks_a_layer(tmp_path, monkeypatch):
    """The rule is not vacuous: a transport module importing an operation (inside a function too), a CLI module
    other than cli/context.py reaching the transport, and an operation importing a launcher plugin are caught."""
    import test_layers

    fake = tmp_path / "sparkctl"
    for package in ("remote", "ops", "cli", "launchers"):
        (fake / package).mkdir(parents=True)
    (fake / "ops" / "up.py").write_text("from sparkctl import launchers\n")  # the registry: allowed
    (fake / "ops" / "serve.py").write_text("from sparkctl.launchers import docker\n")  # a plugin itself: not
    (fake / "launchers" / "docker.py").write_text("")
    (fake / "remote" / "pool.py").write_text("def f():\n    from sparkctl.ops import up\n")
    (fake / "remote" / "good.py").write_text("from ..errors import ConfigError\n")
    (fake / "cli" / "context.py").write_text("from sparkctl.remote.pool import f\n")
    (fake / "cli" / "verb.py").write_text("from sparkctl.remote.pool import f\n")
    monkeypatch.setattr(test_layers, "REPO", tmp_path)
    monkeypatch.setattr(test_layers, "PACKAGE", fake)
    assert sorted(_breaches()) == ["sparkctl.cli.verb imports sparkctl.remote.pool (cli may not import remote)",
                                   "sparkctl.ops.serve imports sparkctl.launchers.docker (ops may not import launchers)",
                                   "sparkctl.remote.pool imports sparkctl.ops.up (remote may not import ops)"]
