"""Identifiers that appear in Redis names and logs."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from streamserve.wire.errors import ProtocolError

_SEPARATOR = "#"


@dataclass(frozen=True)
class ReplicaID:
    """A replica of a deployment: ``<deployment>#<unique suffix>``; also its consumer name."""

    deployment: str
    unique: str

    @classmethod
    def new(cls, deployment: str) -> ReplicaID:
        """A fresh id with a random suffix."""
        return cls(deployment, secrets.token_hex(4))

    def to_str(self) -> str:
        """The form stored in Redis and printed in logs."""
        return f"{self.deployment}{_SEPARATOR}{self.unique}"

    @classmethod
    def from_str(cls, text: str) -> ReplicaID:
        """Parse what to_str made."""
        deployment, sep, unique = text.rpartition(_SEPARATOR)
        if not sep or not deployment or not unique:
            raise ProtocolError(f"not a replica id: {text!r}")
        return cls(deployment, unique)

    def __str__(self) -> str:
        return self.to_str()


def new_request_id() -> str:
    """A request id: 16 random hex characters."""
    return secrets.token_hex(8)


def new_caller_id() -> str:
    """The id of one caller process (names its reply stream)."""
    return secrets.token_hex(6)


# A stream entry id as numbers, (ms, sequence): the ms part is Redis's clock when the entry was added. (0, 0): none.
StreamId = tuple[int, int]
NO_STREAM_ID: StreamId = (0, 0)


def stream_id(raw: bytes | str | None) -> StreamId:
    """``b"1700000000000-3"`` as ``(1700000000000, 3)``; None or anything else is NO_STREAM_ID."""
    if raw is None:
        return NO_STREAM_ID
    ms, sep, seq = (raw.decode() if isinstance(raw, bytes) else raw).partition("-")
    try:
        return (int(ms), int(seq)) if sep else NO_STREAM_ID
    except ValueError:
        return NO_STREAM_ID
