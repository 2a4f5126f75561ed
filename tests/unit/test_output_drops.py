"""A replica's output dropped past its buffer is counted in one line that says why: printed faster than it could be
sent, or Redis away (the line said "while Redis could not be reached" for a flood, with Redis answering)."""

from __future__ import annotations

from typing import Any, cast

import redis as redis_sync
from redis.exceptions import ConnectionError as RedisConnectionError

from streamserve.workers.output_shipper import BUFFERED_LINES, OutputShipper


class FakeRedis:
    """A Redis that takes every pipeline's lines, or (``away``) refuses them as a lost connection."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.away = False

    def pipeline(self, transaction: bool = False) -> FakeRedis:
        self._batch: list[str] = []
        return self

    def xadd(self, key: str, fields: dict[str, Any], **_: Any) -> None:
        self._batch.append(fields["line"])

    def execute(self) -> None:
        if self.away:
            raise RedisConnectionError("gone")
        self.lines += self._batch


def shipper() -> OutputShipper:
    return OutputShipper("redis://127.0.0.1:1/0", "streamserve:{d}:logs", "d#1")  # (nothing connects)


def test_a_flood_is_said_to_be_printed_faster_than_it_could_be_sent() -> None:
    out, fake = shipper(), FakeRedis()
    out._keep([f"line {n}" for n in range(BUFFERED_LINES + 5)])
    assert out._send(cast(redis_sync.Redis, fake))
    assert fake.lines[0] == "[streamserve: 5 line(s) of output dropped (printed faster than they could be sent)]"
    assert fake.lines[1] == "line 5" and len(fake.lines) == BUFFERED_LINES + 1


def test_lines_dropped_while_redis_is_away_are_said_to_be() -> None:
    out, fake = shipper(), FakeRedis()
    fake.away = True
    out._keep(["first"])
    assert not out._send(cast(redis_sync.Redis, fake))
    out._keep([f"line {n}" for n in range(BUFFERED_LINES)])
    fake.away = False
    assert out._send(cast(redis_sync.Redis, fake))
    assert fake.lines[0] == "[streamserve: 1 line(s) of output dropped while Redis could not be reached]"
    # Redis back, a flood later is told as a flood.
    out._keep([f"more {n}" for n in range(BUFFERED_LINES + 1)])
    assert out._send(cast(redis_sync.Redis, fake))
    assert fake.lines[-BUFFERED_LINES - 1].endswith("(printed faster than they could be sent)]")
