"""The one retry delay rule: double after each failure, up to a cap; back to the first delay after a success."""

from __future__ import annotations


class Backoff:
    """Doubling delays ``first, 2*first, ...`` capped at ``cap``; ``reset()`` after a success."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"need 0 < first <= cap, got first={first}, cap={cap}")
        self._first = first
        self._cap = cap
        self._next = first
        self.failures = 0  # since the last reset

    def next(self) -> float:
        """The delay to wait after this failure; the following one doubles."""
        delay = self._next
        self._next = min(self._cap, self._next * 2)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self._next = self._first
        self.failures = 0
