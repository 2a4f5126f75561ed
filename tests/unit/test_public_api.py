"""What users import keeps its documented path, wherever the module behind it lives in the tree."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import streamserve
from streamserve.wire import errors as wire_errors

EXCEPTIONS = sorted(
    name
    for name, value in vars(wire_errors).items()
    if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == wire_errors.__name__
)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("streamserve", "Client"),
        ("streamserve", "AsyncClient"),
        ("streamserve", "batch"),
        ("streamserve", "__version__"),
        ("streamserve.client", "Client"),
        ("streamserve.client", "AsyncClient"),
        *[("streamserve", name) for name in streamserve.__all__],
        *[("streamserve.errors", name) for name in EXCEPTIONS],
    ],
)
def test_a_public_name_imports_from_its_documented_path(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is not None


def test_streamserve_errors_holds_every_exception_class() -> None:
    import streamserve.errors

    assert "StreamServeError" in EXCEPTIONS and "OverloadedError" in EXCEPTIONS
    assert sorted(streamserve.errors.__all__) == EXCEPTIONS
    for name in EXCEPTIONS:
        assert issubclass(getattr(streamserve.errors, name), streamserve.errors.StreamServeError)


def test_the_package_exports_what_it_lists() -> None:
    assert streamserve.__all__ == sorted(streamserve.__all__)
    assert {"Client", "AsyncClient", "batch", "StreamServeError", "OverloadedError"} <= set(streamserve.__all__)


def test_the_lazy_exports_are_the_names_type_checkers_see() -> None:
    """The package imports its public names on first use (PEP 562): the table it imports them from, ``__all__`` and
    the imports type checkers read name the same ones."""
    tree = ast.parse(Path(streamserve.__file__).read_text())
    [block] = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    seen = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert seen == streamserve._EXPORTS
    assert sorted(seen) == streamserve.__all__
