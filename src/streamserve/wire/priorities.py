"""Priority levels: which queued request a replica takes first, and how no level starves.

Each level has its own request stream (Keys.requests), so a request is queued
at its level's tail and never reordered. A replica takes ``high`` before
``normal`` before ``low`` (scripts.TAKE), except on the turns READ_ORDERS gives
a lower level first: while higher levels keep a deployment saturated, each
lower level with requests queued still gets about one read in FAIR_TURNS.

Entry ids are unique within one stream only (two streams may both hold
``1700000000000-0``), so a replica names the entries it holds by a *ref*: the
entry id for ``normal`` (what every deployment without priorities has), or the
stream's *lane* and the id (``b"high/1700000000000-0"``; a model's stream has a
lane too: wire/models.py). Callers name an entry they cancel by its ref too
(CancelRequest, the cancelled-entries set).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from streamserve.wire.errors import BadRequestError, shown


class Priority(str, Enum):
    """A request's priority level (``X-Priority``, ``priority=``)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


# Highest first: the order a replica takes them in on most turns.
PRIORITIES = (Priority.HIGH, Priority.NORMAL, Priority.LOW)

# Of every FAIR_TURNS reads under contention, one reads ``normal`` first and one ``low`` first (the cycle's last, so
# that a replica's first contended read takes ``high``): each level gets at least about 1/FAIR_TURNS of the reads while
# it has requests queued, and ``high`` the rest.
FAIR_TURNS = 6
_NORMAL_FIRST = (Priority.NORMAL, Priority.HIGH, Priority.LOW)
_LOW_FIRST = (Priority.LOW, Priority.HIGH, Priority.NORMAL)
READ_ORDERS: tuple[tuple[Priority, ...], ...] = tuple(
    _NORMAL_FIRST if turn == FAIR_TURNS // 2 - 1 else _LOW_FIRST if turn == FAIR_TURNS - 1 else PRIORITIES
    for turn in range(FAIR_TURNS)
)

_BY_NAME = {p.value: p for p in Priority}
_NORMAL = Priority.NORMAL  # a module global: faster to read than the enum's attribute, on the hot path
_REF_SEPARATOR = b"/"  # (entry_ref writes it)


def parse_priority(value: str | Priority | None) -> Priority:
    """``value`` as a Priority (None is ``normal``; case does not matter); BadRequestError naming the levels for
    anything else."""
    if value is None:  # (checked first: what nearly every call passes)
        return _NORMAL
    if isinstance(value, Priority):
        return value
    found = _BY_NAME.get(value.strip().lower()) if isinstance(value, str) else None
    if found is None:
        raise BadRequestError(f"unknown priority {shown(value)}: use one of high, normal, low")
    return found


def queue_full(deployment: str, limit: int, priority: Priority) -> str:
    """What an OverloadedError says when ``priority``'s queue of ``deployment`` holds ``limit`` requests (each level's
    queue is bounded by max_queued_requests on its own, so that a backlog of one never refuses another)."""
    level = "" if priority is Priority.NORMAL else f"{priority.value}-priority "
    requests = "request" if limit == 1 else "requests"
    return f"deployment {deployment!r} has {limit} {level}{requests} queued (max_queued_requests)"


def entry_ref(priority: Priority, entry_id: bytes) -> bytes:
    """How a replica (and a canceller) names entry ``entry_id`` of ``priority``'s stream."""
    if priority is _NORMAL:
        return entry_id
    return f"{priority.value}/".encode() + entry_id


def lane_ref(lane: bytes, entry_id: bytes) -> bytes:
    """How entry ``entry_id`` of ``lane``'s stream is named: a lane is a ref's prefix (b"" for ``normal``, b"high",
    b"low", or a model's stream: wire/models.py)."""
    return lane + _REF_SEPARATOR + entry_id if lane else entry_id


def priority_lane(priority: Priority) -> bytes:
    """The lane of ``priority``'s stream."""
    return b"" if priority is _NORMAL else priority.value.encode()


def lane_priority(lane: bytes) -> Priority:
    """The priority of ``lane``'s entries: a level's own, ``normal`` for a model's stream (wire/models.py)."""
    return _BY_LANE.get(lane, _NORMAL)


def split_ref(ref: bytes) -> tuple[bytes, bytes]:
    """The lane and entry id an entry ref names (an entry id never holds the separator; a model id may)."""
    lane, sep, entry_id = ref.rpartition(_REF_SEPARATOR)
    return (lane, entry_id) if sep else (b"", ref)


def group_refs(refs: Iterable[bytes]) -> dict[bytes, list[bytes]]:
    """Entry ids by lane, in the order given (one XACK per stream)."""
    refs = list(refs)
    if not any(_REF_SEPARATOR in ref for ref in refs):
        return {b"": refs}  # what every deployment without priorities or models has
    grouped: dict[bytes, list[bytes]] = {}
    for ref in refs:
        lane, entry_id = split_ref(ref)
        grouped.setdefault(lane, []).append(entry_id)
    return grouped


_BY_LANE = {priority_lane(p): p for p in Priority}
