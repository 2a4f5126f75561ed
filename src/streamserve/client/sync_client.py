"""The blocking client: ``Client`` runs an ``AsyncClient`` on a background event loop.

Its methods are AsyncClient's, not copies of them. ``call``, ``submit`` and
``send`` are written out, being the hot path (and ``submit`` hands out a
``concurrent.futures.Future``), and so is ``stream``, whose async iterator
becomes a plain one (``ChunkIterator``); every other method is made once from
AsyncClient's own, so that its name, parameters and docstring are AsyncClient's:
``_blocking`` runs a coroutine method on the loop and waits for it,
``_connected`` connects first and then reads the client's local copy.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import inspect
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from streamserve.client.async_client import AsyncClient
from streamserve.client.chunk_stream import ChunkStream, ConcurrentReadError
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import UnavailableError
from streamserve.wire.models import model_id_of
from streamserve.wire.priorities import parse_priority
from streamserve.wire.tenants import tenant_of

P = ParamSpec("P")
T = TypeVar("T")
# What a use of a Client after its close() raises, and a call that its close() cut short.
CLOSED = "client closed: this Client was closed (close(), or the end of its with block); make a new one"
CLOSED_WHILE_WAITING = "client closed while the call waited for its reply (close(), in another thread)"
# How long a call cut short by Ctrl-C waits for its cancellation to be sent before the interruption goes on.
CANCEL_SENT_WITHIN_S = 1.0
# How often a thread waiting for a call looks at the signals it was sent (and whether close() ended the client's loop).
SIGNAL_CHECK_S = 0.2
# How long the client's thread, its loop stopped by close(), waits for the tasks left on it to end once cancelled.
LEFTOVERS_END_WITHIN_S = 1.0

# Every Client not closed: their cancellations on the way go out at exit.
_LIVE: weakref.WeakSet[Client] = weakref.WeakSet()
# What a forked child's Clients had from the parent (AsyncClients, loops, threads, streams), held for good and never
# used: their sockets, selector and wake-up pipe are shared with the parent, which a finalizer run here would close,
# re-register or write to.
_INHERITED: list[object] = []

# AsyncClient's public names that Client has no blocking twin of, and why.
ASYNC_ONLY = frozenset(
    {
        "start",  # Client connects on first use
        "aclose",  # Client.close(), or leaving its with-block
        "request",  # the gateway's entry point: already-encoded bodies, raw Replies
        "route",  # a Route is for ``request``
        "redis",  # the asyncio connection pool, usable only on the client's own loop
        "generation",  # the gateway's cache check
        "routes_loaded",  # the gateway's readiness check
        "follow",  # the gateway's entry point: a stream's feed after ``request``
        "caller_left",  # the gateway's: its HTTP caller disconnected
        "new_tag",  # the gateway's: names a call for ``caller_left`` before ``request`` sends it
        "knows",  # the gateway's: whose figures it still flushes
        "desired_state",  # the gateway's admin writes (a DesiredState on the client's own loop)
    }
)


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Client, P], T]:
    """The Client method that runs AsyncClient's coroutine ``method`` on the client's loop and waits for its end."""

    def run(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._result(self._run(method(self._fresh(), *args, **kwargs)))

    return _twin_of(method, run, "waits while it runs on the client's event loop")


def _connected(method: Callable[Concatenate[AsyncClient, P], T]) -> Callable[Concatenate[Client, P], T]:
    """The Client method for AsyncClient's local read ``method``: connect (loading the routes) if need be, then read."""

    def read(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        self._awaited(self._run(self._fresh().start()))
        return method(self._async, *args, **kwargs)

    return _twin_of(method, read, "connects first if the client has not yet")


def _twin_of(
    method: Callable[..., Any], twin: Callable[Concatenate[Client, P], T], how: str
) -> Callable[Concatenate[Client, P], T]:
    """``twin`` named and documented as AsyncClient's ``method`` (help() and inspect.signature show its parameters)."""
    functools.update_wrapper(twin, method, assigned=("__name__", "__annotations__"), updated=())
    twin.__qualname__ = f"Client.{method.__name__}"
    twin.__doc__ = f"{inspect.cleandoc(method.__doc__ or '')}\n\nBlocking: {how}."
    return twin


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The client's thread: its loop, until close() stops it; then the tasks left on it (calls that reached it as
    close() stopped it) are cancelled, so that nobody waits for a task that would never run again."""
    loop.run_forever()
    loop.run_until_complete(_cancel_leftovers())
    loop.close()


def _end_dropped(client: AsyncClient, loop: asyncio.AbstractEventLoop, pid: int) -> None:
    """A Client garbage-collected without close(): its AsyncClient is closed and its loop and thread end, without
    waiting (this may run in any thread, the loop's own too, whenever the collector runs). Otherwise each dropped
    client kept a thread and its Redis connections for good: a program that made one per request would run Redis out
    of connections, for every client of the farm. Warned about (ResourceWarning), as an unclosed file is."""
    if pid != os.getpid():
        return  # a forked child's inheritance: the parent's loop is not to be touched (_INHERITED)
    with contextlib.suppress(RuntimeError):  # its loop closed already
        asyncio.run_coroutine_threadsafe(_close_then_stop(client, loop), loop)
    warnings.warn("streamserve.Client dropped without close(): closed now", ResourceWarning, stacklevel=2)


async def _close_then_stop(client: AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
    try:
        # (Redis away: its connections are dropped with the loop all the same.)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await client._close_for_good()
    finally:
        loop.stop()


async def _cancel_leftovers() -> None:
    """Cancel every other task of this loop, and wait for them (at most LEFTOVERS_END_WITHIN_S) to end."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=LEFTOVERS_END_WITHIN_S)


class SubmittedCall(concurrent.futures.Future[Any]):
    """What ``Client.submit`` returns. Waiting for it on the client's own thread (in a done-callback of another
    submit()'s future), where the call could never end, raises RuntimeError instead of stopping the client for
    good."""

    _streamserve_client: Client

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            self._streamserve_client._refuse_own_thread()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.done():
            self._streamserve_client._refuse_own_thread()
        return super().exception(timeout)


class Client:
    """The blocking client: the same calls as AsyncClient, run on a background event loop.

    >>> client = Client("redis://localhost:6379")
    >>> client.call("echo", {"x": 1}, timeout=5)

    Every public method of AsyncClient has its blocking twin here, except those
    named in ``ASYNC_ONLY`` (the connection's own lifecycle and the gateway's entry points).
    Made before os.fork(), it serves both processes (see ``_renew_after_fork``).
    """

    def __init__(self, redis_url: str | None = None, *, settings: Settings | None = None) -> None:
        self._made_with = (redis_url, settings)
        self._closed = False
        self._start_loop()
        _LIVE.add(self)

    def _start_loop(self) -> None:
        """A new AsyncClient on a new event loop, run by a thread of its own."""
        redis_url, settings = self._made_with
        self._async = AsyncClient(redis_url, settings=settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=_run_loop, args=(self._loop,), name="streamserve-client", daemon=True)
        self._thread.start()
        self._pid = os.getpid()
        # Not a reference to self: the finalizer must not keep the client alive.
        self._dropped = weakref.finalize(self, _end_dropped, self._async, self._loop, self._pid)
        self._dropped.atexit = False  # at exit, daemon threads just end: a client still referenced is no leak

    def _fresh(self) -> AsyncClient:
        """The AsyncClient of this process: in a forked child, at its first use, a new one (``_renew_after_fork``).
        Looked at on use, not by an os.register_at_fork hook: that would also run in every subprocess started with
        a preexec_fn, between its fork and its exec, making a client and a thread there for nothing."""
        if self._pid != os.getpid():
            self._renew_after_fork()
        return self._async

    def _renew_after_fork(self) -> None:
        """In a forked child: the loop's thread did not come along (only the forking thread does), so a call would
        wait for ever. The child gets a client of its own (a new AsyncClient, with its own reply stream, on a new
        loop) and leaves the parent's untouched."""
        _INHERITED.extend((self._async, self._loop, self._thread))
        self._dropped.detach()
        self._start_loop()

    def _run(self, coro: Coroutine[Any, Any, T], *, waited: bool = True) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the client's loop; ``waited``: the caller then blocks until it ends."""
        if self._closed:
            coro.close()
            raise UnavailableError(CLOSED)
        if waited:
            try:
                self._refuse_own_thread()
            except RuntimeError:
                coro.close()
                raise
        # (The call's task runs in a copy of this thread's context: a trace current here is current there.)
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop is closed: close(), in another thread, ran since the check above
            coro.close()
            if self._closed:
                raise UnavailableError(CLOSED) from None
            raise

    def _awaited(self, running: concurrent.futures.Future[T]) -> T:
        """``running.result()``, waited for in steps of SIGNAL_CHECK_S: a Ctrl-C that the kernel hands to another
        thread (the client's loop, say) still reaches the waiting thread, which a wait without a bound would block
        for good. A call that close() cut short raises UnavailableError: cancelled on the stopped loop, or never run,
        having reached the loop after it was closed."""
        while True:
            try:
                return running.result(timeout=SIGNAL_CHECK_S)
            except TimeoutError:
                if running.done():
                    raise  # its own error (a TimeoutError of the call's), not the step's
                if self._closed and self._loop.is_closed():
                    running.cancel()
                    raise UnavailableError(CLOSED_WHILE_WAITING) from None
            except concurrent.futures.CancelledError:
                if self._closed:
                    raise UnavailableError(CLOSED_WHILE_WAITING) from None
                raise

    def _refuse_own_thread(self) -> None:
        """Raise RuntimeError on the client's loop thread, where a done-callback of a ``submit()`` future runs: a
        blocking call there waits for the loop that it blocks, and the client never answers again."""
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "a blocking Client call from the client's own thread (a submit() future's done-callback, say) would "
                "wait for itself: use AsyncClient there, or hand the call to another thread"
            )

    def _result(self, running: concurrent.futures.Future[T]) -> T:
        """What ``running`` (from ``_run``) ends with. A wait cut short (Ctrl-C: KeyboardInterrupt) leaves nobody to
        wait for it: it is cancelled, as an AsyncClient call whose task is, and the cancellation is sent before the
        interruption goes on (the program may be on its way out)."""
        try:
            return self._awaited(running)
        except BaseException:
            if running.cancel():
                self._send_cancels()
            raise

    def _send_cancels(self) -> None:
        """Wait (at most CANCEL_SENT_WITHIN_S) for the cancellations on their way to Redis."""
        if self._pid != os.getpid():
            return  # a forked child's, not yet used here: the cancellations on their way are the parent's
        with contextlib.suppress(Exception, KeyboardInterrupt):
            self._run(self._async._cancels_sent(CANCEL_SENT_WITHIN_S)).result(CANCEL_SENT_WITHIN_S + 1)

    # -- the hot path, written out --------------------------------------------------

    def call(
        self,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        method: str = "",
        idempotency_key: str | None = None,
        priority: str | None = None,
        tenant: str | None = None,
        model_id: str | None = None,
    ) -> Any:
        """Run deployment ``name`` on ``body`` and return its result, or raise a StreamServeError.

        ``idempotency_key``: calls with one key run the handler once; ``priority``: high, normal or low;
        ``tenant``: whom it is for; ``model_id``: the model it runs with (see AsyncClient.call)."""
        self._refuse_own_thread()  # before the request goes
        future = self.submit(
            name,
            body,
            timeout=timeout,
            method=method,
            idempotency_key=idempotency_key,
            priority=priority,
            tenant=tenant,
            model_id=model_id,
        )
        return self._result(future)

    def submit(
        self,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        method: str = "",
        idempotency_key: str | None = None,
        priority: str | None = None,
        tenant: str | None = None,
        model_id: str | None = None,
    ) -> concurrent.futures.Future[Any]:
        """Start a call; the Future resolves to its result or raises its error.

        Its done-callbacks run on the client's own thread, where a blocking call raises RuntimeError."""
        parse_priority(priority)  # a bad one raises here, not from the Future
        tenant_of(tenant)
        model_id_of(model_id)
        calling = self._fresh().call(
            name,
            body,
            timeout=timeout,
            method=method,
            idempotency_key=idempotency_key,
            priority=priority,
            tenant=tenant,
            model_id=model_id,
        )
        running = self._run(calling, waited=False)
        running.__class__ = SubmittedCall  # (no fields of its own: the future asyncio chains to the call's task)
        running._streamserve_client = self  # type: ignore[attr-defined]  # (kept while its future is: not dropped)
        return running

    def send(
        self,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        method: str = "",
        idempotency_key: str | None = None,
        priority: str | None = None,
        tenant: str | None = None,
        model_id: str | None = None,
    ) -> str:
        """Enqueue without waiting for the result; return the request id."""
        sending = self._fresh().send(
            name,
            body,
            timeout=timeout,
            method=method,
            idempotency_key=idempotency_key,
            priority=priority,
            tenant=tenant,
            model_id=model_id,
        )
        return self._awaited(self._run(sending))

    def stream(
        self,
        name: str,
        body: Any = None,
        *,
        method: str | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        priority: str | None = None,
        tenant: str | None = None,
        model_id: str | None = None,
    ) -> ChunkIterator:
        """Run streaming deployment ``name`` on ``body``: an iterator of its chunks (see AsyncClient.stream).

        >>> for token in client.stream("tokens", {"prompt": "hi"}):
        ...     print(token)

        Blocking: each step waits on the client's event loop for the next chunk."""
        chunks = self._fresh().stream(
            name,
            body,
            method=method,
            timeout=timeout,
            idempotency_key=idempotency_key,
            priority=priority,
            tenant=tenant,
            model_id=model_id,
        )
        return ChunkIterator(self, chunks)

    # -- AsyncClient's other methods, made blocking ---------------------------------

    submit_job = _blocking(AsyncClient.submit_job)
    job = _blocking(AsyncClient.job)
    cancel_job = _blocking(AsyncClient.cancel_job)
    deploy = _blocking(AsyncClient.deploy)
    scale = _blocking(AsyncClient.scale)
    delete = _blocking(AsyncClient.delete)
    set_traffic = _blocking(AsyncClient.set_traffic)
    wait_for_goal = _blocking(AsyncClient.wait_for_goal)
    status = _blocking(AsyncClient.status)
    ping = _blocking(AsyncClient.ping)
    deployment = _connected(AsyncClient.deployment)
    deployments = _connected(AsyncClient.deployments)
    endpoints = _connected(AsyncClient.endpoints)

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        """Disconnect and stop the background loop. Calls under way in other threads end, with UnavailableError
        (or their result, had it come)."""
        if self._closed:
            return
        self._refuse_own_thread()  # it would wait for its own loop to stop, and then join its own thread
        self._dropped.detach()
        if self._pid != os.getpid():  # a forked child's, never used here: the parent's loop is not to be touched
            self._closed = True
            _LIVE.discard(self)
            _INHERITED.extend((self._async, self._loop, self._thread))
            return
        # Closed first: a call from now on is refused here, and one that reached the loop meanwhile cannot start the
        # client again there (which left it waiting on a loop that then stopped: for ever, its timeout unheeded).
        self._closed = True
        _LIVE.discard(self)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._async._close_for_good(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5 + LEFTOVERS_END_WITHIN_S)  # (the thread closes the loop as it ends)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _send_cancels_at_exit() -> None:
    """Before the interpreter stops the clients' (daemon) loop threads: the cancellations on their way go out. A
    Ctrl-C that a stream's ``for`` loop got between two chunks (in its body, say) drops the iterator as it unwinds,
    which asks for the stream's cancellation, and the program ends."""
    for client in list(_LIVE):
        client._send_cancels()


atexit.register(_send_cancels_at_exit)


class ChunkIterator:
    """What ``Client.stream`` returns: AsyncClient's ChunkStream, stepped on the client's loop from any thread.

    The request is sent by the first ``next()``; errors are raised as by AsyncClient.stream. ``close()`` (or leaving
    a with-block, or dropping the iterator) before the end cancels the request."""

    def __init__(self, client: Client, chunks: ChunkStream) -> None:
        self._client = client
        self._chunks = chunks
        self._pid = os.getpid()  # a forked child's client has another: this stream is the parent's

    def _inherited(self) -> bool:
        """Whether this stream was started by the parent of this (forked) process, on its connections."""
        return self._pid != os.getpid()

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Any:
        if self._inherited():
            raise UnavailableError("a stream started before os.fork() goes on in the parent only: start it anew here")
        client = self._client
        step = client._run(self._chunks.__anext__())
        try:
            return client._awaited(step)
        except StopAsyncIteration:
            raise StopIteration from None
        except ConcurrentReadError:
            raise  # (another thread reads it: that read goes on)
        except BaseException:
            # A wait cut short (Ctrl-C: KeyboardInterrupt) stops the stream, even when its step had just ended with a
            # chunk; and, as for a call's, the cancellation is sent before the interruption goes on (a script that
            # does not catch it ends at once, and its client's loop thread with it). A stream that ended with an
            # error of its own (RemoteError, a deadline) is over already: closing it does nothing, and no
            # cancellation is on its way to wait for.
            step.cancel()
            self.close()
            client._send_cancels()
            raise

    def close(self) -> None:
        """Stop here: the request is forgotten (the stream is closed on the client's loop)."""
        client = self._client
        if self._inherited():
            _INHERITED.append(self._chunks)  # never closed here: closing it would cancel the parent's request
        elif not client._closed:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: so did the stream
                client._loop.call_soon_threadsafe(self._chunks.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_chunks", None) is not None:
            self.close()
