"""A class deployment: returns its input with a greeting that ``user_config`` can change live."""

from __future__ import annotations

import os
from typing import Any


class Echo:
    def __init__(self, greeting: str = "hello") -> None:
        self.greeting = greeting
        self.pid = os.getpid()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Called at start and on every user_config change, without a restart."""
        self.greeting = user_config.get("greeting", self.greeting)

    def __call__(self, body: Any) -> dict[str, Any]:
        return {"echo": body, "greeting": self.greeting}

    def fail(self, body: Any) -> None:
        """A method that raises, to show how user errors reach the caller."""
        raise ValueError(f"asked to fail with {body!r}")
