"""A deployment whose reconfigure() takes the new user_config at once, then may wait before it returns
(tests/integration/test_cache_across_reconfigure.py: the replica runs in the test's own process, so the test holds the
wait with the events here)."""

from __future__ import annotations

import threading
from typing import Any

BEGUN = threading.Event()  # set once a reconfigure that holds has taken its config
RELEASE = threading.Event()  # set by the test: that reconfigure returns
HOLD_MAX_S = 30.0
RUNS: list[Any] = []  # the body of each call it ran


class TakesItAtOnce:
    """Answers with the ``v`` of its user_config, which it takes before anything else in reconfigure()."""

    def __init__(self) -> None:
        self.v: Any = None

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.v = config["v"]
        if config.get("hold"):
            BEGUN.set()
            RELEASE.wait(HOLD_MAX_S)

    def __call__(self, body: Any) -> dict[str, Any]:
        RUNS.append(body)
        return {"v": self.v, "body": body}
