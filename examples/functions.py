"""Plain function deployments."""

from __future__ import annotations

from typing import Any


def add(body: dict[str, Any]) -> dict[str, Any]:
    """``{"a": 1, "b": 2}`` -> ``{"sum": 3}``; raises on anything else."""
    return {"sum": body["a"] + body["b"]}


def noop(body: Any) -> Any:
    """Returns its input unchanged (the benchmark's deployment)."""
    return body
