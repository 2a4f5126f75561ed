"""What one process counted since its last flush to Redis (see flusher): plain dicts, cheap on the hot path."""

from __future__ import annotations

from streamserve.metrics.definitions import Counter, Histogram

Deltas = dict[str, dict[str, float]]  # deployment -> hash field -> amount to add


class Figures:
    """Counts and observations per deployment, waiting to be added to the Redis hashes."""

    def __init__(self) -> None:
        self._deltas: Deltas = {}

    def count(self, deployment: str, counter: Counter, label_value: str, amount: int = 1) -> None:
        fields = self._deltas.get(deployment)
        if fields is None:
            fields = self._deltas[deployment] = {}
        name = counter.field(label_value)
        fields[name] = fields.get(name, 0) + amount

    def count_field(self, deployment: str, name: str, amount: int = 1) -> None:
        """Count under a hash field named already (a TenantCounter's)."""
        fields = self._deltas.get(deployment)
        if fields is None:
            fields = self._deltas[deployment] = {}
        fields[name] = fields.get(name, 0) + amount

    def observe(self, deployment: str, histogram: Histogram, value: float) -> None:
        fields = self._deltas.get(deployment)
        if fields is None:
            fields = self._deltas[deployment] = {}
        bucket = histogram.bucket_fields[histogram.bucket_of(value)]
        fields[bucket] = fields.get(bucket, 0) + 1
        total = histogram.sum_field
        fields[total] = fields.get(total, 0.0) + value

    def take(self) -> Deltas:
        """Everything counted so far; counting starts again from nothing."""
        deltas, self._deltas = self._deltas, {}
        return deltas

    def put_back(self, deltas: Deltas) -> None:
        """Return deltas a flush could not write, so that the next flush adds them."""
        for deployment, fields in deltas.items():
            mine = self._deltas.setdefault(deployment, {})
            for name, amount in fields.items():
                mine[name] = mine.get(name, 0) + amount
