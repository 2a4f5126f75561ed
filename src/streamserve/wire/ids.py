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
