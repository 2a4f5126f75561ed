"""Streaming deployments for the end-to-end tests, which run in replica processes: what a test must see of them
goes through a file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def big_chunks_noting_progress(body: dict[str, Any]) -> Iterator[str]:
    """``body["n"]`` chunks of ``body["size"]`` bytes each; before each yield, its index goes to ``body["path"]``
    (how far the generator got, for a test whose reader is slow)."""
    progress = Path(body["path"])
    for i in range(int(body["n"])):
        progress.write_text(str(i))
        yield "x" * int(body["size"])
