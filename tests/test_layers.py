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
    "commands": BASE | {"config", "engines"},
    "engines": BASE | {"config", "commands"},
    "remote": BASE,
    **{domain: BASE | DOMAIN | {"config", "commands", "engines"} for domain in DOMAIN},
    "ops": PRODUCT_BELOW_CLI,
    "launchers": PRODUCT_BELOW_CLI,
    "cli": PRODUCT_BELOW_CLI | {"cli", "sandbox"},
}
# (importing module, imported module): the exceptions docs/architecture.md names, each for its reason there.
EXCEPTIONS = {
    ("sparkctl.config.inventory", "sparkctl.remote.target"),  # the inventory's one link to the transport
    ("sparkctl.engines.sglang", "sparkctl.engram.packed"),  # the packed layout's name
    ("sparkctl.ops.router_image", "sparkctl.standin.rootfs"),  # the router image is made as the stand-in's is
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
            if unit == layer or unit in allowed or (importer, imported) in EXCEPTIONS:
                continue
            if layer == "cli" and unit == "remote" and importer == "sparkctl.cli.context":
                continue  # the interface reaches the transport through cli/context.py alone
            breaches.append(f"{importer} imports {imported} ({layer} may not import {unit})")
    return breaches


def test_every_import_between_packages_follows_the_layers():
    assert _breaches() == []


def test_the_check_sees_an_import_that_breaks_a_layer(tmp_path, monkeypatch):
    """The rule is not vacuous: a transport module importing an operation is caught, inside a function too."""
    import test_layers

    fake = tmp_path / "sparkctl"
    (fake / "remote").mkdir(parents=True)
    (fake / "ops").mkdir()
    (fake / "ops" / "up.py").write_text("")
    (fake / "remote" / "bad.py").write_text("def f():\n    from sparkctl.ops import up\n")
    (fake / "remote" / "good.py").write_text("from ..errors import ConfigError\n")
    monkeypatch.setattr(test_layers, "REPO", tmp_path)
    monkeypatch.setattr(test_layers, "PACKAGE", fake)
    assert _breaches() == ["sparkctl.remote.bad imports sparkctl.ops.up (remote may not import ops)"]
