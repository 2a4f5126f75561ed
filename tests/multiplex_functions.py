"""A function deployment that multiplexes with a module-level loader (tests/integration/test_multiplexed_function.py);
``unmultiplexed`` beside it calls no loader and needs no model id."""

from __future__ import annotations

import os
from typing import Any

import streamserve


@streamserve.multiplexed(max_models_per_replica=2)
def load_forecaster(model_id: str) -> dict[str, Any]:
    return {"store": model_id, "loaded_by": os.getpid()}


def forecast(body: Any) -> dict[str, Any]:
    return {**load_forecaster(streamserve.model_id()), "days": body["days"]}


def unmultiplexed(body: Any) -> Any:
    return {"body": body, "model": streamserve.model_id()}
