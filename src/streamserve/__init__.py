"""streamserve: queue-based model serving over Redis streams."""

from streamserve.batching import batch
from streamserve.client import AsyncClient, Client
from streamserve.client.handles import DeploymentHandle, handle
from streamserve.errors import (
    BadRequestError,
    BatchOutputError,
    ConfigError,
    DeadLetterError,
    GoalFailedError,
    NotFoundError,
    OverloadedError,
    ProtocolError,
    RateLimitedError,
    RedisUnavailableError,
    RemoteError,
    RequestCancelledError,
    RequestTimeoutError,
    StreamServeError,
    UnavailableError,
)
from streamserve.multiplexing import model_id, multiplexed
from streamserve.runtime.request_scope import cancelled

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BadRequestError",
    "BatchOutputError",
    "Client",
    "ConfigError",
    "DeadLetterError",
    "DeploymentHandle",
    "GoalFailedError",
    "NotFoundError",
    "OverloadedError",
    "ProtocolError",
    "RateLimitedError",
    "RedisUnavailableError",
    "RemoteError",
    "RequestCancelledError",
    "RequestTimeoutError",
    "StreamServeError",
    "UnavailableError",
    "batch",
    "cancelled",
    "handle",
    "model_id",
    "multiplexed",
]
