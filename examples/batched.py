"""A batched deployment: the replica hands ``scale`` up to 16 queued requests at once.

``{"x": 3}`` -> ``{"y": 6.0, "batch_size": N}``, where N is how many requests shared the call.
A real model would run one forward pass over the whole batch where this computes one list.
"""

from __future__ import annotations

from typing import Any

import streamserve


@streamserve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)
def scale(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Multiplies every ``x`` of the batch by 2 in one pass."""
    xs = [float(body["x"]) for body in bodies]
    ys = [2 * x for x in xs]
    return [{"y": y, "batch_size": len(bodies)} for y in ys]
