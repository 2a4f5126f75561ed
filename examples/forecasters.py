"""Many models, few replicas: a sales forecaster per store, each fitted on first use (docs/multiplexing.md).

Each store's model is a small least-squares trend with a weekly season, fitted on that store's sales history: the
fit is the model's load, where a real deployment would read weights. The history is made up here from the store's id
(no download, no data files). A replica keeps ``max_models_per_replica`` stores' models; requests name their store with
``X-Model-Id`` (``model_id=`` from Python), and go to a replica that has it loaded.

    curl -s localhost:8000/forecast -H 'X-Model-Id: store-17' -d '{"days": 3}'
    # {"store":"store-17","forecast":[...],"loaded_by":12345}
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from typing import Any

import streamserve

HISTORY_DAYS = 2 * 365
SEASON = 7


@dataclass(frozen=True)
class Forecaster:
    """Sales on day ``t`` after the history's start: ``level + slope * t + weekly[t % 7]``."""

    store: str
    level: float
    slope: float
    weekly: tuple[float, ...]

    def predict(self, days: int) -> list[float]:
        start = HISTORY_DAYS
        return [round(self.level + self.slope * t + self.weekly[t % SEASON], 2) for t in range(start, start + days)]


def history(store: str) -> list[float]:
    """Two years of a store's daily sales: a trend, a weekly pattern and noise, all drawn from its id."""
    rng = random.Random(hashlib.sha256(store.encode()).digest())
    base, growth = rng.uniform(50, 500), rng.uniform(-0.05, 0.3)
    weekly = [rng.uniform(-0.3, 0.3) * base for _ in range(SEASON)]
    return [base + growth * t + weekly[t % SEASON] + rng.gauss(0, base * 0.05) for t in range(HISTORY_DAYS)]


def fit(store: str, sales: list[float]) -> Forecaster:
    """Least squares for the trend, then the mean residual of each weekday."""
    n = len(sales)
    mean_t, mean_y = (n - 1) / 2, sum(sales) / n
    slope = sum((t - mean_t) * (y - mean_y) for t, y in enumerate(sales)) / sum((t - mean_t) ** 2 for t in range(n))
    level = mean_y - slope * mean_t
    residuals: list[list[float]] = [[] for _ in range(SEASON)]
    for t, y in enumerate(sales):
        residuals[t % SEASON].append(y - level - slope * t)
    return Forecaster(store, level, slope, tuple(sum(r) / len(r) for r in residuals))


class Forecasters:
    """One deployment for every store: each replica keeps the models of the stores it served last."""

    @streamserve.multiplexed(max_models_per_replica=4)
    def get_model(self, store: str) -> Forecaster:
        return fit(store, history(store))

    def __call__(self, body: Any) -> dict[str, Any]:
        days = body.get("days", 7) if isinstance(body, dict) else 7
        if not isinstance(days, int) or not 1 <= days <= 365:
            raise ValueError("days must be a whole number from 1 to 365")
        model = self.get_model(streamserve.model_id())
        return {"store": model.store, "forecast": model.predict(days), "loaded_by": os.getpid()}
