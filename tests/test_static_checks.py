"""ruff (lint and format) and mypy --strict over the code, so CI keeps them clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CODE = [p for p in ("src", "app", "workers", "scheduler", "examples", "tests", "bench") if (ROOT / p).exists()]


@pytest.mark.parametrize(
    "cmd",
    [
        [str(BIN / "ruff"), "check", *CODE],
        [str(BIN / "ruff"), "format", "--check", *CODE],
        [sys.executable, "-m", "tests.harness.typecheck"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_static_check_passes(cmd: list[str]) -> None:
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
