"""Model multiplexing on the wire: model ids, and how a request reaches a replica that holds its model
(docs/multiplexing.md).

A request may name a model (``X-Model-Id``, ``model_id=``). Each replica of a multiplexing deployment has a stream of
its own for requests routed to it (Keys.routed_requests), read just before the deployment's ``normal`` stream, and is
listed among the holders of each model it has loaded (Keys.model_holders: replica -> until when, Redis's clock,
renewed with its heartbeats). The enqueue script sends a ``normal``-priority request for model M to the live holder
of M whose stream holds the fewest entries, when it is not saturated (SATURATED_AT); when nobody holds M, to the
replica with the most room for another model, or with none, to one holding a model another replica holds too (it
unloads that one first), which is given M to load; otherwise to the deployment's stream, where any replica takes it
and loads M (scripts._ROUTE). A replica that leaves,
or whose holds lapse (it died), gives its routed stream's queued entries back to the deployment's stream
(scripts.ROUTED_STREAMS), so that no request waits for a replica that is gone.

Entries of a routed stream are named by the ref ``to:<replica id>/<entry id>`` (wire/priorities.py's refs, one lane
more); they are always ``normal`` priority (a request of another level is not routed by its model).
"""

from __future__ import annotations

import re

from streamserve.wire.errors import BadRequestError, shown

# The HTTP header a request names its model in.
MODEL_HEADER = "X-Model-Id"
# A model id: it is part of Redis keys, so printable and short; ``/`` and ``:`` allow ids such as ``org/lora:v2``.
MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,127}\Z")
MODEL_ID_RULE = (
    "1-128 of A-Z a-z 0-9 . _ : / @ + = -, starting with a letter or digit, with no part between slashes that is "
    "empty, . or .."
)
# Parts between slashes a model id must not have: a loader that joins the id onto a directory (the docs' own sketch
# does) would be sent out of it by a caller's a/../../b.
_PATH_STEPS = frozenset({"", ".", ".."})
# A routed stream's lane prefix (an entry ref is b"to:<replica id>/<entry id>").
ROUTED_LANE = b"to:"
# A holder is saturated once this many times its max_ongoing_requests wait for it or run there: as many running, and
# as many more queued. Waiting behind a holder's run costs less than loading the model on another replica (and the
# other replica unloading one of its own, which the next request for that one pays for): requests go elsewhere only
# when the holders are truly behind.
SATURATED_AT = 2


def check_model_id(model_id: str) -> str:
    """``model_id`` if it is a model id, else BadRequestError saying what one is."""
    if (
        not isinstance(model_id, str)
        or not MODEL_ID_RE.match(model_id)
        or ("/" in model_id and not _PATH_STEPS.isdisjoint(model_id.split("/")))
    ):
        raise BadRequestError(f"model id {shown(model_id)} is not a model id: {MODEL_ID_RULE}")
    return model_id


def model_id_of(model_id: str | None) -> str:
    """A caller's ``model_id=``: None is "" (no model); anything else must be a model id (check_model_id)."""
    return "" if model_id is None else check_model_id(model_id)


def routed_lane(replica_id: str) -> bytes:
    """The lane (ref prefix, less its separator) of ``replica_id``'s routed stream."""
    return ROUTED_LANE + replica_id.encode()


def replica_of_lane(lane: bytes) -> str | None:
    """The replica whose routed stream a lane names, None for a priority level's lane."""
    return lane[len(ROUTED_LANE) :].decode() if lane.startswith(ROUTED_LANE) else None


def route_spec(model_id: str, max_ongoing_requests: int, hold_ms: int, models_prefix: str) -> str:
    """What the enqueue script routes ``model_id`` by (scripts._ROUTE): how many entries a replica's routed stream may
    have before it is saturated, how long a replica given the model to load holds it (until it says so itself), and
    what the deployment's multiplexing keys start with (Keys.models_prefix)."""
    return f"{SATURATED_AT * max_ongoing_requests} {hold_ms} {models_prefix} {model_id}"


def hold_ms(heartbeat_interval_s: float, heartbeat_timeout_s: float) -> int:
    """How long a replica's hold counts without renewal: a beat less than the heartbeat timeout (at least two beats),
    so that a dead replica's routed queue is given back within the time its replica is written off in."""
    return int(1000 * max(heartbeat_timeout_s - heartbeat_interval_s, 2 * heartbeat_interval_s))


def no_model_message(deployment: str) -> str:
    """What a request without a model id gets from a deployment that multiplexes models."""
    return (
        f"deployment {deployment!r} serves many models: name one with the {MODEL_HEADER} header (model_id= from "
        "Python, --model-id with streamserve call)"
    )
