"""Deployments only the benches use."""

from __future__ import annotations

import os
import time
from typing import Any

import orjson
import redis


class Reconfigurable:
    """Answers its input; each ``reconfigure`` pushes ``{gen, pid, t}`` to a Redis list the control bench watches.

    ``t`` is this replica's wall clock when reconfigure ran; the bench runs on the same machine, so it
    compares it with its own clock taken just before writing the change.
    """

    def __init__(self, report_url: str, report_key: str) -> None:
        self._redis = redis.Redis.from_url(report_url)
        self._key = report_key
        self.gen: Any = None

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.gen = user_config.get("gen")
        report = {"gen": self.gen, "pid": os.getpid(), "t": time.time()}
        self._redis.rpush(self._key, orjson.dumps(report))

    def __call__(self, body: Any) -> Any:
        return body
