"""Deployments that print what a test asks for (imported by worker processes as ``tests.output_deployments:...``):
hostile output for `streamserve logs`, and lines longer than the shipper's cap."""

from __future__ import annotations

import sys

# What `long_line` prints after its long line, on a line of its own.
AFTER_LONG_LINE = "the line after the long one"


def printer(text: str) -> str:
    """Writes ``text`` to stdout as it is, then a newline."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return text


def long_line(size: int) -> int:
    """Writes one line of ``size`` bytes ("x" each) to stdout, then AFTER_LONG_LINE on the next line."""
    block = "x" * 65536
    for _ in range(size // len(block)):
        sys.stdout.write(block)
    sys.stdout.write("x" * (size % len(block)) + "\n" + AFTER_LONG_LINE + "\n")
    sys.stdout.flush()
    return size
