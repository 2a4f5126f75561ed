"""Handles: one deployment calls another (``streamserve.handle(name)``), or any Python code calls a deployment.

Inside a handler (a RequestScope is current: runtime/request_scope.py), a
handle's calls are the children of the request being served:

- their deadline is the parent's (or the child deployment's own
  ``request_timeout_s``, if that comes first): a child never outlives its
  parent, and with no time left a call fails at once, sending nothing;
- they are cancelled with the parent: in async code the handler's task is
  cancelled, and with it the call it awaits (Calls.request and
  ChunkStream.close cancel what they sent); sync code registers with
  ``scope.on_cancel`` for the time a call runs, which cancels it (and raises
  RequestCancelledError in the handler);
- their request id is ``<parent id>.<n>`` and Request.parent the parent's id,
  so that logs tie them together;
- they go at the parent's priority level (wire/priorities.py), for its tenant (wire/tenants.py);
- when the replica traces, their enqueue spans are children of the parent's handler span, which is current where
  the handler runs (runtime/request_scope.py), and so where a call is made (a sync handler's call runs on the home
  loop in a copy of its thread's context).

Every call runs on one event loop of the process, its "home", with one
AsyncClient made there on first use. In a replica that is the replica's own
loop and settings (workers/replica.py calls ``serve_handles_on`` at start and
``close_handles`` on exit); anywhere else a background loop on a thread of
its own with the environment's settings (REDIS_URL), closed at exit. Sync
code blocks on the home loop (never on the loop's own thread: that would wait
for itself); async code awaits on it directly when it runs there, else
through a future bridged from its own loop. One client per process, rather
than one per event loop: an AsyncClient left open when ``asyncio.run``
returns would hold up its end (its tasks do not all stop at once when
cancelled), and a handle has no ``with`` block to close one.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Self, TypeVar

from streamserve.client.async_client import AsyncClient
from streamserve.client.calls import encode_body
from streamserve.client.chunk_feed import ChunkFeed
from streamserve.client.chunk_stream import ChunkStream
from streamserve.client.outcomes import STREAM_REPLIES, result_of
from streamserve.runtime.request_scope import RequestScope, current_scope
from streamserve.runtime.settings import Settings
from streamserve.wire.config import check_name
from streamserve.wire.errors import BadRequestError, RequestCancelledError, RequestTimeoutError, UnavailableError, shown
from streamserve.wire.ids import new_request_id
from streamserve.wire.messages import Reply, method_of
from streamserve.wire.models import model_id_of

T = TypeVar("T")

# The longest request id (the gateway's X-Request-ID takes at most this many characters).
MAX_REQUEST_ID_CHARS = 128
# How long closing the background home's client at exit may take.
CLOSE_AT_EXIT_S = 5.0

# Numbers the calls made through handles in this process: child ids stay unique in it, even for two requests that
# share an id (a caller may choose its own), whose children share one reply stream here.
_call_numbers = itertools.count(1)


def child_request_id(parent_id: str, number: int) -> str:
    """The id of a call made while serving request ``parent_id``: ``<parent id>.<number>``, or a fresh id when that
    would be longer than a request id may be."""
    child = f"{parent_id}.{number}"
    return child if len(child) <= MAX_REQUEST_ID_CHARS else new_request_id()


def child_timeout_s(deployment_timeout_s: float, remaining_s: float | None) -> float:
    """A child call's timeout: its deployment's, cut to the time its parent has left (None: the parent has no
    deadline); RequestTimeoutError when none is left."""
    if remaining_s is None:
        return deployment_timeout_s
    if remaining_s <= 0:
        raise _no_time_left()
    return min(deployment_timeout_s, remaining_s)


def _no_time_left() -> RequestTimeoutError:
    return RequestTimeoutError("the request this call was made for has passed its deadline: nothing was sent")


def _check_parent(scope: RequestScope | None) -> None:
    """Refuse at once, sending nothing, a call for a request that was cancelled or has no time left."""
    if scope is None:
        return
    if scope.remaining_s() == 0:  # (first: a request past its deadline is cancelled too, by its caller's timeout)
        raise _no_time_left()
    if scope.is_cancelled:
        raise RequestCancelledError(f"request {scope.request_id} was cancelled: the call was not sent")


class _Home:
    """The event loop that handles' calls run on, and the AsyncClient they share there (made on first use)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: Settings | None) -> None:
        self.loop = loop
        self._settings = settings  # None: the environment's
        self._client: AsyncClient | None = None
        self.users = 1  # the replicas serving on this loop (more than one only in tests that run them in-process)

    def client(self) -> AsyncClient:
        """The client (on the home loop only)."""
        if self._client is None:
            self._client = AsyncClient(settings=self._settings)
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def is_current_thread(self) -> bool:
        """Whether the calling thread runs the home loop (and so must not block on it)."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the home loop, from another thread."""
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop is closed: its replica has exited
            coro.close()
            raise UnavailableError("handles cannot call any more: the event loop they ran on has stopped") from None

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the home loop, from whatever loop awaits this (cancelling this cancels it)."""
        if self.is_current_thread():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the home loop, from any thread (not at all once the loop is closed)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn)


_lock = threading.Lock()
_replica_home: _Home | None = None
_background_home: _Home | None = None
# What a forked child inherited of its parent's homes, held for good and never used: their loops' threads did not
# come along (a call there waited for ever), and their sockets are the parent's.
_INHERITED_HOMES: list[_Home] = []


def _forget_homes_in_child() -> None:
    """After os.fork(), in the child: its handles get homes of their own at first use (a replica's too: the child of
    a handler that forked is no replica, and the parent's loop does not run here)."""
    global _lock, _replica_home, _background_home
    _INHERITED_HOMES.extend(home for home in (_replica_home, _background_home) if home is not None)
    _lock = threading.Lock()  # (held by another thread of the parent at the fork, it would never be let go)
    _replica_home = _background_home = None


os.register_at_fork(after_in_child=_forget_homes_in_child)


def serve_handles_on(loop: asyncio.AbstractEventLoop, settings: Settings) -> None:
    """This process is a replica serving on ``loop``: handles' calls run there, with ``settings`` (until
    ``close_handles``)."""
    global _replica_home
    with _lock:
        if _replica_home is not None and _replica_home.loop is loop:
            _replica_home.users += 1
        else:
            _replica_home = _Home(loop, settings)


async def close_handles() -> None:
    """The replica is leaving (on the loop it gave ``serve_handles_on``): close the handles' client."""
    global _replica_home
    with _lock:
        home = _replica_home
        if home is None or home.loop is not asyncio.get_running_loop():
            return
        home.users -= 1
        if home.users > 0:
            return
        _replica_home = None
    await home.aclose()


def _home() -> _Home:
    """Where handles' calls run: the replica's loop, else the background loop (started on first use)."""
    global _background_home
    home = _replica_home
    if home is not None:
        return home
    with _lock:
        if _background_home is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="streamserve-handles", daemon=True).start()
            _background_home = _Home(loop, None)
            atexit.register(_close_background)
        return _background_home


def _close_background() -> None:
    """At exit: close the background home's client (quietly: the process ends anyway), then stop its loop."""
    home = _background_home
    if home is None:
        return
    with contextlib.suppress(Exception):
        home.submit(home.aclose()).result(timeout=CLOSE_AT_EXIT_S)
    home.call_soon(home.loop.stop)


def _blocking_home(method: str, instead: str) -> _Home:
    """The home, for ``method`` that blocks until it ends: never on the home loop's own thread, which would wait
    for itself (``instead`` is what to write there)."""
    home = _home()
    if home.is_current_thread():
        raise RuntimeError(
            f"DeploymentHandle.{method}() blocks, and was called on the replica's event loop (in an async handler), "
            f"which it would wait for forever: use `{instead}` there"
        )
    return home


async def _send(
    home: _Home, name: str, body: bytes, method: str, model: str, scope: RequestScope | None, stream: bool
) -> Reply:
    """On the home loop: send a call of ``name`` (with ``model``: wire/models.py) as a child of ``scope``'s request
    (if any); its first reply."""
    client = home.client()
    route = await client.route(name)
    timeout = route.deployment.request_timeout_s
    if scope is None:
        return await client.request(route, body, timeout=timeout, method=method, stream=stream, model_id=model)
    if not scope.made_calls:
        scope.made_calls = True
        if scope.on_call is not None:
            scope.on_call()
    return await client.request(
        route,
        body,
        timeout=child_timeout_s(timeout, scope.remaining_s()),
        method=method,
        stream=stream,
        request_id=child_request_id(scope.request_id, next(_call_numbers)),
        parent=scope.request_id,
        deadline_ms=scope.deadline_ms,
        priority=scope.priority,
        tenant=scope.tenant,
        model_id=model,
    )


async def _call(home: _Home, name: str, body: bytes, method: str, model: str, scope: RequestScope | None) -> Any:
    return result_of(await _send(home, name, body, method, model, scope, stream=False))


def _chunks(home: _Home, name: str, body: bytes, method: str, model: str, scope: RequestScope | None) -> ChunkStream:
    """The stream of a call, sent by its first step on the home loop."""

    async def start() -> Reply | ChunkFeed:
        reply = await _send(home, name, body, method, model, scope, stream=True)
        return home.client().follow(reply) if reply.status in STREAM_REPLIES else reply

    return ChunkStream(start)


def _cancelled_error(name: str, scope: RequestScope | None) -> RequestCancelledError:
    parent = f"request {scope.request_id}" if scope is not None else "the request that made it"
    return RequestCancelledError(f"the call of {name!r} was cancelled: {parent} was cancelled")


def _nothing() -> None:
    return None


class DeploymentHandle:
    """Calls deployment (or endpoint) ``name``; made by ``streamserve.handle(name)``.

    >>> summarize = streamserve.handle("summarize")
    >>> summarize.call({"text": text})                  # in a sync handler, or any sync code
    >>> await summarize.acall({"text": text})           # in an async handler, or any async code
    >>> for token in streamserve.handle("tokens").stream({"prompt": "hi"}): ...

    Used inside a handler, its calls inherit the deadline of the request being served, are cancelled with it (the
    call then raises RequestCancelledError in sync code; an async handler's task is cancelled, call and all), and
    carry its request id. Errors are those of ``Client.call``: NotFoundError for an unknown name, BadRequestError
    for a body JSON cannot hold (before anything is sent), RemoteError when the handler raised, and so on.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"DeploymentHandle({self.name!r})"

    def call(self, body: Any = None, *, method: str | None = None, model_id: str | None = None) -> Any:
        """Run the deployment on ``body`` (its ``method``, if given; with ``model_id``, for a deployment that
        multiplexes models) and return its result; blocks until then.

        Raises RuntimeError on the event loop's own thread (in an async handler): use ``await acall()`` there."""
        encoded = encode_body(body)
        scope = current_scope()
        _check_parent(scope)
        home = _blocking_home("call", "await handle.acall(...)")
        future = home.submit(_call(home, self.name, encoded, method_of(method), model_id_of(model_id), scope))
        unregister = scope.on_cancel(future.cancel) if scope is not None else _nothing
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise _cancelled_error(self.name, scope) from None
        except BaseException:  # e.g. KeyboardInterrupt while waiting: the call stops too
            future.cancel()
            raise
        finally:
            unregister()

    async def acall(self, body: Any = None, *, method: str | None = None, model_id: str | None = None) -> Any:
        """Run the deployment on ``body`` (its ``method``, if given) and return its result."""
        encoded = encode_body(body)
        scope = current_scope()
        _check_parent(scope)
        home = _home()
        return await home.run(_call(home, self.name, encoded, method_of(method), model_id_of(model_id), scope))

    def stream(self, body: Any = None, *, method: str | None = None, model_id: str | None = None) -> HandleStream:
        """Run the streaming deployment on ``body``: an iterator of its chunks, each step blocking until it comes.

        As ``Client.stream``: the request is sent by the first step, an error is raised after the chunks before it,
        and ``close()`` (or leaving a with-block) before the end cancels it."""
        encoded = encode_body(body)
        scope = current_scope()
        _check_parent(scope)
        home = _blocking_home("stream", "async for chunk in handle.astream(...)")
        chunks = _chunks(home, self.name, encoded, method_of(method), model_id_of(model_id), scope)
        return HandleStream(home, chunks, self.name, scope)

    def astream(self, body: Any = None, *, method: str | None = None, model_id: str | None = None) -> AsyncHandleStream:
        """Run the streaming deployment on ``body``: an async iterator of its chunks (as ``AsyncClient.stream``)."""
        encoded = encode_body(body)
        scope = current_scope()
        _check_parent(scope)
        home = _home()
        return AsyncHandleStream(
            home, _chunks(home, self.name, encoded, method_of(method), model_id_of(model_id), scope)
        )


def handle(name: str) -> DeploymentHandle:
    """A handle on deployment (or endpoint) ``name``: how a handler calls another deployment, or any Python code
    calls one with the environment's settings (REDIS_URL). See DeploymentHandle. BadRequestError for a name that is
    no string, or one no deployment or endpoint could have (checked here, not at the first call)."""
    if not isinstance(name, str):
        raise BadRequestError(f"a deployment or endpoint name is a string, got {shown(name)}")
    try:
        check_name(name)
    except ValueError as exc:
        raise BadRequestError(f"streamserve.handle({name!r}): {exc}") from None
    return DeploymentHandle(name)


class HandleStream:
    """What ``DeploymentHandle.stream`` returns: a stream of chunks stepped on the handles' home loop from any
    other thread. Inside a handler, the request's cancellation closes it (the step waiting raises
    RequestCancelledError)."""

    def __init__(self, home: _Home, chunks: ChunkStream, name: str, scope: RequestScope | None) -> None:
        self._home = home
        self._chunks: ChunkStream | None = chunks
        self._name = name
        self._scope = scope
        self._lock = threading.Lock()
        self._step: concurrent.futures.Future[Any] | None = None
        self._cancelled = False
        self._unregister: Callable[[], None] = _nothing
        if scope is not None:
            # Weakly: the scope's list would keep a stream its handler left (``break`` in its loop) alive, and its call
            # running, until the child's own deadline.
            self._unregister = scope.on_cancel(_weakly(self._parent_cancelled))

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._cancelled:
                raise _cancelled_error(self._name, self._scope)
            if self._chunks is None:
                raise StopIteration
            step = self._step = self._home.submit(self._chunks.__anext__())
        try:
            return step.result()
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None
        except BaseException:
            step.cancel()
            self.close()
            if self._cancelled:
                raise _cancelled_error(self._name, self._scope) from None
            raise

    def _parent_cancelled(self) -> None:
        """The request whose handler reads this was cancelled (on any thread): stop the step waiting, cancel the
        call."""
        with self._lock:
            self._cancelled = True
            step = self._step
        if step is not None:
            step.cancel()
        self.close()

    def close(self) -> None:
        """Stop here: the call is cancelled if it has not ended. Safe to call again."""
        self._unregister()
        with self._lock:
            chunks, self._chunks = self._chunks, None
        if chunks is not None:
            self._home.call_soon(chunks.close)  # on its loop (the reference keeps it alive until then)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_chunks", None) is not None:
            self.close()


def _weakly(method: Callable[[], None]) -> Callable[[], None]:
    """``method``, called through a weak reference to its object (nothing once that is gone)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        if (bound := ref()) is not None:
            bound()

    return call


class AsyncHandleStream:
    """What ``DeploymentHandle.astream`` returns: a stream of chunks stepped on the handles' home loop, from that
    loop or any other. Cancelling the task that awaits a step, or ``close()`` before the end, cancels the call."""

    def __init__(self, home: _Home, chunks: ChunkStream) -> None:
        self._home = home
        self._chunks: ChunkStream | None = chunks

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        if self._chunks is None:
            raise StopAsyncIteration
        try:
            return await self._home.run(self._chunks.__anext__())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop here: the call is cancelled if it has not ended. Safe to call again."""
        chunks, self._chunks = self._chunks, None
        if chunks is not None:
            if self._home.is_current_thread():
                chunks.close()
            else:
                self._home.call_soon(chunks.close)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_chunks", None) is not None:
            self.close()
