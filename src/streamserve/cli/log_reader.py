"""`streamserve logs`: read the output of a deployment's replicas from its capped stream (workers/output_shipper)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import redis.asyncio as aioredis

from streamserve.wire.messages import Fields, StreamBatches, text
from streamserve.wire.printable import printable

# Lines shown without --since (the newest ones).
DEFAULT_LINES = 200
# --follow asks Redis for new lines this often at least (a blocking read of at most this long).
FOLLOW_BLOCK_MS = 1000
_PAGE = 1000
_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])\Z")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
Entries = list[tuple[bytes, Fields]]


def parse_since(value: str) -> float:
    """``30s``, ``10m``, ``2h``, ``1d`` -> seconds; ValueError otherwise."""
    found = _SINCE.match(value.strip())
    if not found:
        raise ValueError(f"--since takes a number and a unit (s, m, h, d), e.g. 30s or 10m; got {value!r}")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


@dataclass(frozen=True)
class LogLine:
    entry_id: str  # the stream entry's id: its first part is when the line reached Redis, in ms
    replica: str
    host: str
    line: str

    def format(self, raw: bool = False) -> str:
        """``replica | line``, escaped (wire.printable) so that a handler's output cannot drive the terminal (clear
        it, set its clipboard, overwrite a line); ``raw``: as the replica printed it."""
        shown = f"{self.replica} | {self.line}"
        return shown if raw else printable(shown)


def _line(entry_id: bytes, fields: Fields) -> LogLine:
    return LogLine(
        text(entry_id),
        _decoded(fields.get(b"replica", b"?")),
        _decoded(fields.get(b"host", b"")),
        _decoded(fields.get(b"line", b"")),
    )


def _decoded(value: bytes) -> str:
    """Replicas ship UTF-8 (workers/output_shipper); anything else a Redis writer put there is shown, not fatal."""
    return value.decode("utf-8", "replace")


def _matches(line: LogLine, replica: str | None) -> bool:
    """``replica``: a whole replica id (``echo#8a71c616``) or the part after ``#``."""
    return replica is None or line.replica == replica or line.replica.partition("#")[2] == replica


class LogReader:
    """One deployment's stream of replica output."""

    def __init__(self, redis: aioredis.Redis, key: str) -> None:
        self._redis = redis
        self._key = key

    async def since(self, start_ms: int, replica: str | None) -> list[LogLine]:
        """Every line from ``start_ms`` on (the stream holds the last ~10,000 lines of the deployment)."""
        found: list[LogLine] = []
        start = f"{start_ms}-0"
        while True:
            page = cast(Entries, await self._redis.xrange(self._key, start, "+", count=_PAGE))
            found += [line for line in (_line(i, f) for i, f in page) if _matches(line, replica)]
            if len(page) < _PAGE:
                return found
            start = "(" + text(page[-1][0])

    async def last(self, count: int, replica: str | None) -> list[LogLine]:
        """The newest ``count`` lines (of ``replica`` only, when given), oldest first."""
        found: list[LogLine] = []
        end = "+"
        while len(found) < count:
            page = cast(Entries, await self._redis.xrevrange(self._key, end, "-", count=_PAGE))
            found += [line for line in (_line(i, f) for i, f in page) if _matches(line, replica)]
            if len(page) < _PAGE:
                break
            end = "(" + text(page[-1][0])
        return list(reversed(found[:count]))

    async def latest_id(self) -> str:
        """The id of the stream's newest entry ("0-0" when it has none): following starts after it."""
        newest = cast(Entries, await self._redis.xrevrange(self._key, "+", "-", count=1))
        return text(newest[0][0]) if newest else "0-0"

    async def follow(self, after: str, replica: str | None) -> AsyncIterator[LogLine]:
        """Lines as they arrive after entry ``after``, for ever."""
        while True:
            batches = cast(
                StreamBatches, await self._redis.xread({self._key: after}, count=_PAGE, block=FOLLOW_BLOCK_MS)
            )
            for _stream, entries in batches or ():
                for entry_id, fields in entries:
                    after = text(entry_id)
                    line = _line(entry_id, fields)
                    if _matches(line, replica):
                        yield line
