from __future__ import annotations

import pytest

from streamserve.wire.errors import ProtocolError
from streamserve.wire.messages import Heartbeat, Reply, ReplyStatus, Request
from streamserve.wire.states import ReplicaHealth


def as_redis(fields: dict[str, object]) -> dict[bytes, bytes]:
    """What redis-py hands back for an entry written with these fields."""
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}


def test_request_round_trip() -> None:
    req = Request("r1", "streamserve:replies:abc", 1_700_000_000_000, b'{"x":1}', method="predict")
    assert Request.decode(as_redis(req.encode())) == req


def test_reply_round_trip() -> None:
    reply = Reply("r1", ReplyStatus.USER_ERROR, "echo#1", error_type="ValueError", error_message="bad \u00e9")
    assert Reply.decode(as_redis(reply.encode())) == reply


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f: f.pop(b"v"), "schema version None"),
        (lambda f: f.update({b"v": b"99"}), "schema version b'99'"),
        (lambda f: f.pop(b"body"), "no 'body' field"),
        (lambda f: f.update({b"deadline_ms": b"soon"}), "malformed request"),
    ],
)
def test_bad_request_raises_protocol_error(mutate: object, message: str) -> None:
    fields = as_redis(Request("r1", "", 1, b"null").encode())
    mutate(fields)  # type: ignore[operator]
    with pytest.raises(ProtocolError, match=message):
        Request.decode(fields)


def test_unknown_reply_status() -> None:
    fields = as_redis(Reply("r1", ReplyStatus.OK, "x").encode())
    fields[b"status"] = b"maybe"
    with pytest.raises(ProtocolError, match="unknown status"):
        Reply.decode(fields)


def test_heartbeat_round_trip_and_garbage() -> None:
    beat = Heartbeat(ts_ms=1, health=ReplicaHealth.READY, pid=2, host="h", ongoing=3)
    assert Heartbeat.decode(beat.encode()) == beat
    with pytest.raises(ProtocolError):
        Heartbeat.decode(b"{not json")
    with pytest.raises(ProtocolError):
        Heartbeat.decode(b'{"ts_ms": 1}')
