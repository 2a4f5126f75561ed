from __future__ import annotations

import pytest

from streamserve.wire.errors import ProtocolError
from streamserve.wire.messages import ChunkBatch, ChunkPart, Heartbeat, Reply, ReplyStatus, Request
from streamserve.wire.states import ReplicaHealth


def as_redis(fields: dict[str, object]) -> dict[bytes, bytes]:
    """What redis-py hands back for an entry written with these fields."""
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}


def test_request_round_trip() -> None:
    req = Request("r1", "streamserve:replies:abc", 1_700_000_000_000, b'{"x":1}', method="predict", tag="1f")
    assert Request.decode(as_redis(req.encode())) == req


def test_reply_round_trip_and_a_reply_echoes_its_requests_tag() -> None:
    reply = Reply("r1", ReplyStatus.USER_ERROR, "echo#1", error_type="ValueError", error_message="bad \u00e9")
    assert Reply.decode(as_redis(reply.encode())) == reply
    answer = Request("r1", "to", 1, b"null", tag="2a").reply(ReplyStatus.OK, "echo#1", body=b"1")
    assert Reply.decode(as_redis(answer.encode())) == Reply("r1", ReplyStatus.OK, "echo#1", b"1", tag="2a")


BATCH = ChunkBatch(
    "tokens#1",
    [ChunkPart("r1", "a", 0, 2, 64, b'"x"\n{"y":1}'), ChunkPart("r2", "", 7, 1, 8, '["\u00e9"]'.encode())],
)


def test_chunk_batch_round_trip() -> None:
    assert ChunkBatch.decode(as_redis(BATCH.encode())) == BATCH


@pytest.mark.parametrize(
    ("parts", "body", "message"),
    [
        (b"not json", None, "malformed chunk batch"),
        (b'[["r1", "a", 0, 2, 64]]', None, "malformed chunk batch"),  # a field short
        (b'[["r1", "a", -1, 2, 64, 11]]', b'"x"\n{"y":1}', "bad part"),
        (b'[["r1", 3, 0, 2, 64, 11]]', b'"x"\n{"y":1}', "bad part"),
        (b'[["r1", "a", 0, 2, 64, 99]]', b'"x"\n{"y":1}', "bad part"),  # longer than the body
        (b'[["r1", "a", 0, 2, 64, 1.5]]', b'"x"\n{"y":1}', "malformed chunk batch"),
        (b'[["r1", "a", 0, 2, 64, 3]]', b'"x"\n{"y":1}', "hold 3 bytes of its body's 11"),
        (b'{"r1": 1}', b"", "malformed chunk batch"),
    ],
)
def test_a_malformed_chunk_batch_raises_protocol_error(parts: bytes, body: bytes | None, message: str) -> None:
    fields = as_redis(BATCH.encode())
    fields[b"parts"] = parts
    if body is not None:
        fields[b"body"] = body
    with pytest.raises(ProtocolError, match=message):
        ChunkBatch.decode(fields)


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
