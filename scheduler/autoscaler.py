"""The autoscaling policy: how many replicas a deployment's queue asks for, decided with delays.

Pure: no Redis, no processes, no clock of its own. The scheduler hands it one
observation per tick (ongoing requests: queued + in flight, and whether a
request came since the last one) with the time, and it answers with a new
replica count only when a change is due.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from streamserve.wire.config import AutoscalingConfig
from streamserve.wire.ids import StreamId

# The signal is the mean of the observations of this last window: one tick's spike or dip decides nothing.
LOOK_BACK_MS = 2_000


@dataclass(frozen=True)
class Load:
    """One look at a deployment's queue: ``ongoing`` requests in it (queued + in flight), and per lane (each priority
    level's stream, then its routed streams together: wire/models.py) the id of the last request a replica read.

    The ids tell what the length cannot: a request that came and went between two looks.
    """

    ongoing: int = 0
    last_read: tuple[StreamId, ...] = ()

    def plus(self, ongoing: int, last_read: StreamId) -> Load:
        """This load and one more lane's."""
        return Load(self.ongoing + ongoing, (*self.last_read, last_read))

    def read_since(self, earlier: Load) -> bool:
        """Whether a replica read a request since ``earlier`` (a lane that only one of the two looks has, as on the
        first look, says nothing)."""
        return any(now > then for now, then in zip(self.last_read, earlier.last_read, strict=False))


# Nothing queued, nothing read: a deployment that is not autoscaled, whose queue is not read.
NO_LOAD = Load()


@dataclass(frozen=True)
class Decision:
    """A new replica count and why (the why goes to the log and to ``status``)."""

    replicas: int
    reason: str


class AutoscalePolicy:
    """One deployment's autoscaling memory: its recent observations and how long a change has been wanted.

    The count wanted is ``ceil(mean ongoing / target_ongoing_requests)``, clamped
    to ``[min_replicas, max_replicas]``, where the mean is over the last
    ``look_back_ms``. A higher count must be wanted on every tick for
    ``upscale_delay_s``, a lower one on every tick for ``downscale_delay_s``;
    the deployment then goes to the count wanted now. A tick that wants the
    current count (or the other direction) starts the wait over, so a signal
    wobbling around a boundary changes nothing.

    A tick at which a request came that ``ongoing`` missed (it came and went
    between two looks) counts as one ongoing request when the count would go
    down, never up: a trickle of short requests keeps the replicas it needs, and
    the downscale delay runs from its last request.

    Two changes skip the wait: a count outside ``[min, max]`` (the config
    changed) is clamped at once, and a deployment at 0 replicas with anything
    queued goes to 1 at once, because a caller is waiting on it.
    """

    def __init__(self, look_back_ms: int = LOOK_BACK_MS) -> None:
        self._look_back_ms = look_back_ms
        # (when, ongoing, ongoing or 1 if a request came unseen since the last observation)
        self._samples: deque[tuple[int, int, int]] = deque()
        # When the current wish (a count other than the current one) started; None when there is none.
        self._since_ms: int | None = None
        # The direction of that wish.
        self._rising = False

    @property
    def mean(self) -> float:
        """Mean ongoing requests over the look-back window (0 before any observation)."""
        if not self._samples:
            return 0.0
        return sum(value for _, value, _ in self._samples) / len(self._samples)

    @property
    def busy_mean(self) -> float:
        """As ``mean``, a request that came unseen counting as one ongoing (0 before any observation)."""
        if not self._samples:
            return 0.0
        return sum(busy for _, _, busy in self._samples) / len(self._samples)

    def decide(
        self, cfg: AutoscalingConfig, ongoing: int, current: int, now_ms: int, arrived: bool = False
    ) -> Decision | None:
        """Record ``ongoing`` (queued + in flight) at ``now_ms``; return a new count for ``current``, or None.

        ``arrived``: a request came since the last observation (one ``ongoing`` may have missed).
        """
        self._observe(ongoing, arrived, now_ms)
        low, high = cfg.min_replicas, cfg.max_replicas
        if not low <= current <= high:
            self._since_ms = None
            return Decision(_clamp(current, low, high), f"min_replicas {low}, max_replicas {high}")
        if current == 0 and ongoing > 0:
            self._since_ms = None
            return Decision(1, f"{ongoing} request(s) waiting and no replica")
        mean = self.mean
        wanted = _clamp(_ceil(mean / cfg.target_ongoing_requests), low, high)
        if wanted < current:  # requests that came and went between two looks keep the replicas they needed
            busy = _clamp(_ceil(self.busy_mean / cfg.target_ongoing_requests), low, high)
            wanted = min(current, max(wanted, busy))
        if wanted == current:
            self._since_ms = None
            return None
        up = wanted > current
        if self._since_ms is None or up != self._rising:
            self._since_ms, self._rising = now_ms, up
        delay_s = cfg.upscale_delay_s if up else cfg.downscale_delay_s
        waited_ms = now_ms - self._since_ms
        if waited_ms < delay_s * 1000:
            return None
        self._since_ms = None
        shown = mean if up else self.busy_mean  # (the mean that decided)
        reason = (
            f"ongoing {shown:.1f} on {current} replica(s), target {cfg.target_ongoing_requests:g} each, "
            f"for {waited_ms / 1000:.1f}s"
        )
        return Decision(wanted, reason)

    def _observe(self, ongoing: int, arrived: bool, now_ms: int) -> None:
        self._samples.append((now_ms, ongoing, max(ongoing, int(arrived))))
        while self._samples and self._samples[0][0] <= now_ms - self._look_back_ms:
            self._samples.popleft()


def _clamp(value: int, low: int, high: int) -> int:
    return min(max(value, low), high)


def _ceil(value: float) -> int:
    """ceil() that does not turn 2.0000000000000004 (a float mean) into 3."""
    return math.ceil(value - 1e-9)
