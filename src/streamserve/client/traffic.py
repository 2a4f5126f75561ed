"""Traffic policy of an endpoint: which deployment serves a request, and which shadows get a copy."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random

from streamserve.wire.config import EndpointConfig


class TrafficPolicy:
    """Picks deployments by the endpoint's weights; pure, so callers and tests share it.

    Each caller process draws on its own, so the split holds over many
    requests, not for every short run of them.
    """

    def __init__(self, endpoint: EndpointConfig, rng: random.Random | None = None) -> None:
        self.endpoint = endpoint
        self._rng = rng or random.Random()
        live = [(name, weight) for name, weight in sorted(endpoint.traffic.items()) if weight > 0]
        self._names = [name for name, _ in live]
        self._cumulative = list(itertools.accumulate(weight for _, weight in live))
        self._shadow = sorted((name, fraction) for name, fraction in endpoint.shadow.items() if fraction > 0)

    def pick(self, sticky: str = "") -> str:
        """One deployment, with probability proportional to its weight (weight 0: never). ``sticky`` (an
        idempotency key): the same deployment for the same key, as long as the weights stay, so that a retry goes
        where its key's run is."""
        share = _share_of(sticky) if sticky else self._rng.random()
        point = share * self._cumulative[-1]
        index = bisect.bisect_right(self._cumulative, point)
        return self._names[min(index, len(self._names) - 1)]

    def shadows(self) -> list[str]:
        """The shadow deployments this request is mirrored to (each drawn with its own fraction)."""
        return [name for name, fraction in self._shadow if self._rng.random() < fraction]


def _share_of(key: str) -> float:
    """Where ``key`` falls in [0, 1), the same in every process."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64
