"""streamserve is a typed package (PEP 561): its ``py.typed`` marker is in the package, and the wheel takes it."""

from __future__ import annotations

import tomllib
from importlib import resources

from tests.harness.paths import ROOT


def test_the_package_has_its_py_typed_marker() -> None:
    assert resources.files("streamserve").joinpath("py.typed").is_file()


def test_the_wheel_takes_the_marker() -> None:
    """setuptools puts a package's non-Python files in the wheel only as its package-data names them."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["streamserve"]
