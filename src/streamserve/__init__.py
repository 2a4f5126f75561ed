"""streamserve: queue-based model serving over Redis streams."""

from streamserve.batching import batch
from streamserve.client import AsyncClient, Client
from streamserve.errors import (
    BadRequestError,
    BatchOutputError,
    ConfigError,
    DeadLetterError,
    GoalFailedError,
    NotFoundError,
    OverloadedError,
    ProtocolError,
    RedisUnavailableError,
    RemoteError,
    RequestTimeoutError,
    StreamServeError,
    UnavailableError,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BadRequestError",
    "BatchOutputError",
    "Client",
    "ConfigError",
    "DeadLetterError",
    "GoalFailedError",
    "NotFoundError",
    "OverloadedError",
    "ProtocolError",
    "RedisUnavailableError",
    "RemoteError",
    "RequestTimeoutError",
    "StreamServeError",
    "UnavailableError",
    "batch",
]
