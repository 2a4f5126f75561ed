"""Model multiplexing on the wire: model ids, and the stream of each model that replicas hold (docs/multiplexing.md).

A request may name a model (``X-Model-Id``, ``model_id=``). A ``normal``-priority one goes to that model's own
stream (Keys.model_requests) when a live replica holds the model and the stream has fewer entries than its holders
can run at once (scripts.ENQUEUE, route_spec); otherwise to the deployment's stream, where any replica takes it and
loads the model. A replica that loads a model reads the model's stream besides its deployment's, and says so in the
model's holders (a sorted set: replica -> until when, Redis's clock, renewed with each heartbeat). A model's stream
that no live replica holds any more is disbanded (scripts.DISBAND_MODEL): its queued entries go back to the
deployment's stream, so that no request waits for a replica that is gone.

Entries of a model's stream are named by the ref ``model:<id>/<entry id>`` (wire/priorities.py's refs, one lane
more); they are always ``normal`` priority (a request of another level is not routed by its model).
"""

from __future__ import annotations

import re

from streamserve.wire.errors import BadRequestError

# The HTTP header a request names its model in.
MODEL_HEADER = "X-Model-Id"
# A model id: it is part of Redis keys, so printable and short; ``/`` and ``:`` allow ids such as ``org/lora:v2``.
MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,127}\Z")
MODEL_ID_RULE = "1-128 of A-Z a-z 0-9 . _ : / @ + = -, starting with a letter or digit"
# A model lane's ref prefix (an entry ref is b"model:<id>/<entry id>").
MODEL_LANE = b"model:"


def check_model_id(model_id: str) -> str:
    """``model_id`` if it is a model id, else BadRequestError saying what one is."""
    if not isinstance(model_id, str) or not MODEL_ID_RE.match(model_id):
        raise BadRequestError(f"model id {model_id!r} is not a model id: {MODEL_ID_RULE}")
    return model_id


def model_id_of(model_id: str | None) -> str:
    """A caller's ``model_id=``: None is "" (no model); anything else must be a model id (check_model_id)."""
    return "" if model_id is None else check_model_id(model_id)


def model_lane(model_id: str) -> bytes:
    """The lane (ref prefix, less its separator) of ``model_id``'s stream."""
    return MODEL_LANE + model_id.encode()


def model_of_lane(lane: bytes) -> str | None:
    """The model id a lane names, None for a priority level's lane."""
    return lane[len(MODEL_LANE) :].decode() if lane.startswith(MODEL_LANE) else None


def route_spec(model_id: str, capacity: int) -> str:
    """What the enqueue script routes by (scripts._ROUTE): the model's lane and how many of its stream's entries each
    live holder may have (its max_ongoing_requests); "" for a request not routed by model."""
    return f"{capacity} {model_lane(model_id).decode()}/" if model_id else ""


def no_model_message(deployment: str) -> str:
    """What a request without a model id gets from a deployment that multiplexes models."""
    return (
        f"deployment {deployment!r} serves many models: name one with the {MODEL_HEADER} header (model_id= from Python)"
    )
