"""The package's shape: one import name, a core that no role leaks into, roles that do not import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "streamserve"
ROLES = ("app", "workers", "scheduler")


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


def roles_imported(path: Path) -> set[str]:
    return {role for role in ROLES for m in imported_modules(path) if m.startswith(f"streamserve.{role}")}


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_the_core_imports_no_role(path: Path) -> None:
    assert roles_imported(path) == set()


@pytest.mark.parametrize("role", ROLES)
def test_roles_do_not_import_each_other(role: str) -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): others
        for path in sorted((PACKAGE / role).rglob("*.py"))
        if (others := roles_imported(path) - {role})
    }
    assert offenders == {}
