"""streamserve: queue-based model serving over Redis streams.

The public names below are imported when first used (PEP 562), not with the package: every `streamserve` command and
every process of a farm imports this package first, and the client behind these names takes most of a second to
import, a second in which a command could not yet answer Ctrl-C with its one line (streamserve/__main__.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; tests/unit/test_public_api.py holds it, _EXPORTS and __all__ alike
    from streamserve.batching import batch
    from streamserve.client import AsyncClient, Client
    from streamserve.client.handles import DeploymentHandle, handle
    from streamserve.client.jobs import JobInfo
    from streamserve.control.status import DeploymentStatus
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
    from streamserve.wire.states import JobStatus

__version__ = "0.1.0"

# Public name -> the module it is imported from.
_EXPORTS = {
    "AsyncClient": "streamserve.client",
    "BadRequestError": "streamserve.errors",
    "BatchOutputError": "streamserve.errors",
    "Client": "streamserve.client",
    "ConfigError": "streamserve.errors",
    "DeadLetterError": "streamserve.errors",
    "DeploymentHandle": "streamserve.client.handles",
    "DeploymentStatus": "streamserve.control.status",
    "GoalFailedError": "streamserve.errors",
    "JobInfo": "streamserve.client.jobs",
    "JobStatus": "streamserve.wire.states",
    "NotFoundError": "streamserve.errors",
    "OverloadedError": "streamserve.errors",
    "ProtocolError": "streamserve.errors",
    "RateLimitedError": "streamserve.errors",
    "RedisUnavailableError": "streamserve.errors",
    "RemoteError": "streamserve.errors",
    "RequestCancelledError": "streamserve.errors",
    "RequestTimeoutError": "streamserve.errors",
    "StreamServeError": "streamserve.errors",
    "UnavailableError": "streamserve.errors",
    "batch": "streamserve.batching",
    "cancelled": "streamserve.runtime.request_scope",
    "handle": "streamserve.client.handles",
    "model_id": "streamserve.multiplexing",
    "multiplexed": "streamserve.multiplexing",
}

__all__ = [
    "AsyncClient",
    "BadRequestError",
    "BatchOutputError",
    "Client",
    "ConfigError",
    "DeadLetterError",
    "DeploymentHandle",
    "DeploymentStatus",
    "GoalFailedError",
    "JobInfo",
    "JobStatus",
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


def __getattr__(name: str) -> Any:
    """Import a public name on its first use, and keep it."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
