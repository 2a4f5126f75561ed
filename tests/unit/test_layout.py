"""The tree shows the design: three roles at the top, one core of layers under src/, one import name.

The core's subpackages form layers, each importing only those below it: ``wire`` imports nothing of ours,
``transport`` only ``wire``, and so on up to ``cli``. The roles (app/, workers/, scheduler/) import the core and never
each other, and the core imports no role (the CLI names a role's module as a string and imports it when chosen).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "src" / "streamserve"
ROLES = ("app", "workers", "scheduler")
# Lowest first: a layer may import its own modules and those of the layers before it.
LAYERS = ("wire", "transport", "control", "metrics", "runtime", "client", "manifests", "cli")
# The modules at the top of the core are what users import (``streamserve``, ``streamserve.errors``,
# ``streamserve.batch``); of the layers, only the CLI imports them (for ``__version__``).
PUBLIC = ("__init__", "__main__", "batching", "errors", "multiplexing")


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def part_of(module: str) -> str | None:
    """Which part of ours a dotted name belongs to: a role, a layer, "public", or None when it is not ours."""
    parts = module.split(".")
    if parts[0] != "streamserve":
        return None
    if len(parts) == 1 or parts[1] in PUBLIC or parts[1] == "__version__":
        return "public"
    if parts[1] in ROLES or parts[1] in LAYERS:
        return parts[1]
    return "public" if (CORE / f"{parts[1]}.py").exists() else None


def parts_imported(path: Path) -> set[str]:
    return {part for module in imported_modules(path) if (part := part_of(module))}


def core_files(layer: str) -> list[Path]:
    return sorted((CORE / layer).rglob("*.py"))


def test_every_core_folder_is_a_layer() -> None:
    folders = {p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS)
    loose = {p.stem for p in CORE.glob("*.py")}
    assert loose == set(PUBLIC)


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1]) | ({"public"} if layer == "cli" else set())
    offenders = {
        str(path.relative_to(CORE)): sorted(parts - allowed)
        for path in core_files(layer)
        if (parts := parts_imported(path)) - allowed
    }
    assert offenders == {}


def test_wire_imports_nothing_of_ours() -> None:
    offenders = {str(p.relative_to(CORE)): parts_imported(p) - {"wire"} for p in core_files("wire")}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("role", ROLES)
def test_roles_import_the_core_and_never_each_other(role: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): others
        for path in sorted((ROOT / role).rglob("*.py"))
        if (others := parts_imported(path) & (set(ROLES) - {role}))
    }
    assert offenders == {}


def test_nothing_imports_a_role_folder_by_its_own_name() -> None:
    """``import app`` would load the user's own app/ package (or ours only from a checkout): it must never appear."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(bad)
        for folder in ("src", *ROLES, "tests", "bench", "examples")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (bad := {m for m in imported_modules(path) if m.split(".")[0] in ROLES})
    }
    assert offenders == {}


def test_the_installed_packages_are_the_tree() -> None:
    """pyproject.toml lists the packages by hand (four source folders, one name): a new folder must be added there."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(setuptools["packages"])
    in_tree = {"streamserve"} | {f"streamserve.{p.name}" for p in CORE.iterdir() if (p / "__init__.py").exists()}
    in_tree |= {f"streamserve.{role}" for role in ROLES}
    for role in ROLES:
        assert not [p for p in (ROOT / role).iterdir() if (p / "__init__.py").exists()], f"{role}/ has a subpackage"
    assert declared == in_tree
    assert setuptools["package-dir"] == {"streamserve": "src/streamserve", **{f"streamserve.{r}": r for r in ROLES}}


def test_no_streamserve_folder_at_the_root() -> None:
    """One would shadow the installed package for anything run from the checkout, and miss the three roles."""
    assert not (ROOT / "streamserve").exists()
