"""``@streamserve.batch``: a handler that takes a list of request bodies and returns a list of results.

The decorator only marks the function and checks what it returns; the
batching itself happens in the replica (``workers/batcher.py``), which
collects queued requests for the handler and calls it once per batch.

Called directly (in a user's unit test), a decorated function behaves like
the undecorated one, a list in and a list out, and raises BatchOutputError
when the output list does not have one item per input, as in a replica.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

from streamserve.wire.errors import BatchOutputError, ConfigError

F = TypeVar("F", bound=Callable[..., Any])

# The attribute of a decorated function that holds its BatchConfig.
BATCH_ATTR = "__streamserve_batch__"

DEFAULT_MAX_BATCH_SIZE = 10
DEFAULT_BATCH_WAIT_TIMEOUT_S = 0.01


@dataclass(frozen=True)
class BatchConfig:
    """How a replica batches the requests of one handler."""

    # The most requests passed to one call of the handler.
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE

    # How long a batch waits for more requests after its first arrived before it runs anyway.
    batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_TIMEOUT_S

    def __post_init__(self) -> None:
        size = self.max_batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"@batch: max_batch_size must be an integer >= 1, got {size!r}")
        wait = self.batch_wait_timeout_s
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) or wait < 0:
            raise ConfigError(f"@batch: batch_wait_timeout_s must be a number of seconds >= 0, got {wait!r}")


@overload
def batch(fn: F, /) -> F: ...


@overload
def batch(
    *, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_TIMEOUT_S
) -> Callable[[F], F]: ...


def batch(
    fn: Any = None,
    /,
    *,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_TIMEOUT_S,
) -> Any:
    """Serve a function or method that takes a list of bodies and returns one result per body, in order.

    >>> @batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    ... def predict(bodies: list[float]) -> list[float]:
    ...     return [2 * b for b in bodies]
    >>> predict([1, 2])
    [2, 4]

    Works as ``@batch`` or ``@batch(...)``, on functions and on methods
    (``__call__`` included), sync or async.
    """
    config = BatchConfig(max_batch_size, batch_wait_timeout_s)
    if fn is None:
        return functools.partial(_wrap, config=config)
    return _wrap(fn, config)


def _wrap(fn: F, config: BatchConfig) -> F:
    if inspect.isclass(fn) or not callable(fn):
        hint = " (options go by keyword: @batch(max_batch_size=...))" if isinstance(fn, (int, float)) else ""
        raise ConfigError(f"@batch decorates a function or method, not {fn!r}{hint}")
    name = getattr(fn, "__qualname__", repr(fn))
    wrapper: Callable[..., Any]
    # The list is the last positional argument: after ``self`` for a method.
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any) -> list[Any]:
            return check_outputs(name, len(args[-1]), await fn(*args))

        wrapper = run_async
    else:

        @functools.wraps(fn)
        def run_sync(*args: Any) -> list[Any]:
            return check_outputs(name, len(args[-1]), fn(*args))

        wrapper = run_sync
    setattr(wrapper, BATCH_ATTR, config)
    return cast(F, wrapper)


def check_outputs(name: str, count: int, outputs: Any) -> list[Any]:
    """The outputs as a list, or BatchOutputError unless there is exactly one per input."""
    if isinstance(outputs, (str, bytes, bytearray, Mapping)) or not (
        hasattr(outputs, "__len__") and hasattr(outputs, "__iter__")
    ):
        raise BatchOutputError(f"{name} must return a list with one output per input, got {type(outputs).__name__}")
    if len(outputs) != count:
        raise BatchOutputError(
            f"{name} returned {len(outputs)} outputs for {count} inputs "
            "(a @batch handler returns one output per input, in order)"
        )
    return list(outputs)


def batch_config_of(fn: Any) -> BatchConfig | None:
    """The BatchConfig of a decorated function, bound method, or instance whose ``__call__`` is decorated."""
    config = getattr(fn, BATCH_ATTR, None)
    if config is None and not inspect.isroutine(fn):
        config = getattr(getattr(fn, "__call__", None), BATCH_ATTR, None)  # noqa: B004 - instance with a batched __call__
    return config if isinstance(config, BatchConfig) else None
