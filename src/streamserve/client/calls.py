"""Calls: enqueue a request on a deployment's stream (and its shadows'), await the reply, turn it into a result.

This is the hot path. ``call`` -> ``request`` -> ``_add`` is one enqueue in
the pipeliner and one future that the reply stream's reader resolves.

Streams (``stream``, and every deployment POST of the gateway) go the same
way, with Request.stream set; when the first reply is a chunk, the request
goes on as a ``ChunkFeed`` (``follow``) under the same deadline.

A caller that stops waiting before the end cancels its request (client/cancels.py):
the task awaiting ``request`` cancelled, or failed by ``caller_left`` (the
gateway's HTTP caller disconnected), or a stream's feed closed before its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from typing import Any

import redis
from opentelemetry.trace import Span

from streamserve.client.chunk_feed import ChunkFeed
from streamserve.client.chunk_stream import ChunkStream
from streamserve.client.core import ClientCore
from streamserve.client.outcomes import STREAM_REPLIES, kept_stream, result_of
from streamserve.client.read_progress import progress_reporter
from streamserve.client.reply_stream import ReplyStream
from streamserve.client.route_table import Route
from streamserve.client.shared_calls import (
    Sharing,
    by_cache,
    by_key,
    enqueue_shared,
    look_at_record,
    queued_entry,
    wait_joined,
)
from streamserve.client.tenant_limits import refusal, tenant_terms
from streamserve.runtime import trace_context
from streamserve.transport.connections import RETRYABLE_ERRORS, is_cluster_client, redacted
from streamserve.transport.pipelining import Abandoned, Again, Command, Script
from streamserve.wire import scripts
from streamserve.wire.config import MAX_TIMEOUT_S, DeploymentConfig
from streamserve.wire.errors import (
    BadRequestError,
    OverloadedError,
    RedisUnavailableError,
    RequestCancelledError,
    RequestTimeoutError,
    StreamServeError,
    streaming_only_message,
)
from streamserve.wire.idempotency import check_key
from streamserve.wire.ids import new_request_id
from streamserve.wire.json_values import dumps
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import (
    SHARED_JOINED,
    SHARED_STORED,
    Reply,
    ReplyStatus,
    Request,
    method_of,
    now_ms,
    text,
)
from streamserve.wire.models import hold_ms, model_id_of, route_spec
from streamserve.wire.priorities import Priority, parse_priority, queue_full
from streamserve.wire.response_cache import cache_digest
from streamserve.wire.shared_runs import new_run_token, stored_reply
from streamserve.wire.tenants import DEFAULT_TENANT, tenant_of

logger = logging.getLogger(__name__)

_ENQUEUE = Script(scripts.ENQUEUE)
# The enqueue sent again after a lost connection: rare, so as EVAL with its source (no NOSCRIPT to handle).
_ENQUEUE_AGAIN = scripts.ENQUEUE_AGAIN
# What an enqueue sent again says when its caller already has the reply (nothing is queued again).
_ANSWERED = b"answered"
# The queue limit that has ENQUEUE_AGAIN only look for the entry (scripts.ENQUEUE_AGAIN).
FIND_ONLY = -1
# A call timeout below this is too short for any Redis to take the enqueue (one that answers takes it within
# milliseconds): its passing first is the deadline's (504), not Redis's (503 RedisUnavailableError).
ENQUEUE_STALL_S = 0.1


def encode_body(body: Any) -> bytes:
    """The request body as JSON; BadRequestError (not a bare TypeError) for what JSON cannot hold."""
    try:
        return dumps(body)
    except (TypeError, ValueError) as exc:
        raise BadRequestError(f"body cannot be sent as JSON: {exc}") from None


def call_timeout_s(timeout: float | None, cfg: DeploymentConfig) -> float:
    """The caller's timeout, else the deployment's; BadRequestError unless it is a positive finite number."""
    timeout_s = cfg.request_timeout_s if timeout is None else timeout
    is_number = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    if not is_number or not 0 < timeout_s <= MAX_TIMEOUT_S:  # the range test is false for NaN too
        raise BadRequestError(
            f"timeout must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}, got {timeout_s!r}"
        )
    return timeout_s


def _abandon(fut: asyncio.Future[Reply]) -> None:
    """Drop the reply future of a request that was not enqueued. The reader or the deadline may have failed it
    meanwhile (Redis gone for REPLY_OUTAGE_FAIL_S while the enqueue was retried): asyncio would log that error as
    never retrieved, though the caller got the enqueue's own."""
    if not fut.done():
        fut.cancel()
    elif not fut.cancelled():
        fut.exception()  # marks it retrieved


class Calls(ClientCore):
    """Run a deployment (or an endpoint's pick) on a body: wait for the result, or only enqueue."""

    async def call(
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
        """Run deployment (or endpoint) ``name`` on ``body`` and return its result, or raise a StreamServeError.

        ``idempotency_key``: calls with one key (and the same method and body) run the handler once, and share its
        result or error; see docs/retries-and-caching.md. ``priority``: ``high``, ``normal`` (the default) or
        ``low``: which queued requests replicas take first (docs/priorities.md). ``tenant``: whom the call is for
        (its limits: docs/tenants.md); None is ``default``. ``model_id``: the model a multiplexing deployment runs it
        with (docs/multiplexing.md)."""
        key = "" if idempotency_key is None else check_key(idempotency_key)
        level = parse_priority(priority)
        reply = await self.request(
            name,
            encode_body(body),
            timeout=timeout,
            method=method_of(method),
            idempotency_key=key,
            priority=level,
            tenant=tenant_of(tenant),
            model_id=model_id_of(model_id),
        )
        return result_of(reply)

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
    ) -> asyncio.Task[Any]:
        """Start a call and return a task that resolves to its result.

        From a coroutine (on a running event loop): elsewhere it raises RuntimeError, as the task would never run."""
        parse_priority(priority)  # a bad one raises here, not in the task
        tenant_of(tenant)
        model_id_of(model_id)
        method_of(method)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "AsyncClient.submit() needs a running event loop: call it from a coroutine (async def), or use "
                "the blocking Client's submit() outside one"
            ) from None
        calling = self.call(
            name,
            body,
            timeout=timeout,
            method=method,
            idempotency_key=idempotency_key,
            priority=priority,
            tenant=tenant,
            model_id=model_id,
        )
        return loop.create_task(calling)

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
    ) -> ChunkStream:
        """Run streaming deployment (or endpoint) ``name`` on ``body``: an async iterator of its chunks.

        The request is sent when the iteration starts, and ``timeout`` (default: the deployment's
        ``request_timeout_s``) bounds the whole stream. An error ends the iteration by raising the StreamServeError
        that ``call`` would raise for it, after the chunks that came before it. A deployment that does not stream
        gives its one result as the only chunk. Leaving the iteration early (``break``, ``close()``) cancels the
        request (its generator is closed). A body JSON cannot hold raises BadRequestError here, before anything is
        sent. ``idempotency_key``: the handler runs once for all streams with the key; a stream that joined one on
        its way, or came after it, gets its chunks all at once when it has ended.
        """
        encoded = encode_body(body)
        self._check_size(encoded)
        key = "" if idempotency_key is None else check_key(idempotency_key)
        level = parse_priority(priority)
        whom = tenant_of(tenant)
        model = model_id_of(model_id)
        method = method_of(method)

        async def start() -> Reply | ChunkFeed:
            reply = await self.request(
                name,
                encoded,
                timeout=timeout,
                method=method,
                stream=True,
                idempotency_key=key,
                priority=level,
                tenant=whom,
                model_id=model,
            )
            return self.follow(reply) if reply.status in STREAM_REPLIES or kept_stream(reply) else reply

        return ChunkStream(start)

    def follow(self, first: Reply) -> ChunkFeed:
        """The rest of a stream whose first reply, from ``request(..., stream=True)``, is ``first`` (CHUNK, or END
        for a stream of no chunk). Its consumer must ``close()`` it once done (it forgets the request, and cancels it
        if it has not ended)."""
        if first.shared:  # a stream kept for a shared run, or a copy of its end: its chunks come with it
            return ChunkFeed.ended(first, first.body)
        feed = self._replies.feed(first.tag) if self._replies is not None else None
        if feed is None:  # END: the stream is over already (a closed client: its requests failed)
            return ChunkFeed.ended(first)
        return feed

    async def send(
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
        """Enqueue without waiting for (or receiving) the result; return the request id.

        ``idempotency_key``: nothing is queued when a call with this key has run or is on its way, and the id returned
        is that call's; a later ``call`` with the key gets its stored result."""
        encoded = encode_body(body)
        self._check_size(encoded)
        level = parse_priority(priority)
        route = await self.route(name, idempotency_key or "", timeout)
        request = Request(
            new_request_id(),
            "",
            now_ms() + int(1000 * call_timeout_s(timeout, route.deployment)),
            encoded,
            method_of(method),
            priority=level,
            tenant=tenant_of(tenant),
            model=model_id_of(model_id),
        )
        cfg = route.deployment
        with trace_context.ending(self._trace(request, cfg)):
            if idempotency_key is None and cfg.response_cache is None:
                await self._add(cfg, request)
            else:
                request.run = new_run_token()
                if idempotency_key is not None:
                    request.idem = check_key(idempotency_key)
                    sharing = by_key(self._keys, cfg, request)
                else:
                    sharing = by_cache(self._keys, cfg, request, refresh=False)
                assert self._pipeliner is not None
                with self._refusals:
                    admission = await enqueue_shared(self._pipeliner, self._keys, cfg, request, sharing)
                if not admission.entry_id:  # it has run (its reply is kept), or its run is on its way
                    return admission.runs_for or request.request_id
        self._mirror(route, request)
        return request.request_id

    async def request(
        self,
        name: str | Route,
        body: bytes,
        *,
        timeout: float | None = None,
        method: str = "",
        request_id: str | None = None,
        stream: bool = False,
        parent: str = "",
        deadline_ms: int = 0,
        tag: str = "",
        idempotency_key: str = "",
        refresh: bool = False,
        priority: Priority = Priority.NORMAL,
        tenant: str = DEFAULT_TENANT,
        model_id: str = "",
    ) -> Reply:
        """Send already-encoded JSON and return the raw Reply (the gateway's entry point).

        ``name`` is a deployment or endpoint name, or a Route already picked.
        ``timeout`` defaults to the deployment's ``request_timeout_s``; the
        replica skips the request if this deadline passes before it starts.

        ``stream``: the caller takes a stream (Request.stream). The reply is a unary handler's one answer as
        usual, or a streaming handler's first (CHUNK, or END when it yielded nothing); after a CHUNK the request
        goes on, its deadline still running, as ``follow(reply)``, which the caller must close.

        ``parent`` and ``deadline_ms`` (handles, client/handles.py): the id of the request whose handler sends this
        one (Request.parent), and the latest deadline it may have (epoch ms; 0: none), its parent's.

        ``tag``: the call's tag (Request.tag) from ``new_tag()``, for a caller that must name the call before it is
        sent (the gateway: ``caller_left``); a new one by default.

        ``idempotency_key``: the handler runs once for all calls with this key (per deployment), while the key's
        reply is kept (wire/idempotency.py). Without one, a deployment with a response cache answers identical
        requests from a kept reply, or from one run (wire/response_cache.py); ``refresh`` runs anew and keeps the
        new reply. Reply.shared says how a shared run answered. ``priority``: the request's level (Request.priority);
        ``tenant``: whom it is for (Request.tenant: a tenant name, as check_tenant says); ``model_id``: its model
        (Request.model: a model id, as check_model_id says, or "").
        """
        self._check_size(body)
        route = name if isinstance(name, Route) else await self.route(name, idempotency_key, timeout)
        cfg = route.deployment
        timeout_s = call_timeout_s(timeout, cfg)
        request_id = request_id or new_request_id()
        digest = ""
        if cfg.response_cache is not None and not idempotency_key:
            digest = cache_digest(cfg, method, body, model_id, tenant)
            if refresh:
                self._hot.drop(digest)
            elif (kept := self._hot.get(digest)) is not None:
                return self._hot_hit(cfg, kept, request_id, tag, body, method)
        replies = self._replies
        assert replies is not None
        tag = tag or replies.new_tag()
        fut = replies.expect(tag, request_id)
        timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, tag, request_id, timeout_s, cfg.name)
        request = Request(
            request_id,
            replies.name,
            0,
            body,
            method,
            stream=stream,
            parent=parent,
            tag=tag,
            priority=priority,
            tenant=tenant,
            model=model_id,
        )
        entry_id = ""
        span = self._trace(request, cfg) if self._tracer is not None else None
        try:
            deadline = now_ms() + int(timeout_s * 1000)
            request.deadline_ms = min(deadline, deadline_ms) if deadline_ms else deadline
            if idempotency_key:
                request.idem = check_key(idempotency_key)
                sharing = by_key(self._keys, cfg, request)
                reply, entry_id = await self._run_shared(route, request, fut, sharing, span)
            elif cfg.response_cache is not None:
                sharing = by_cache(self._keys, cfg, request, refresh, digest)
                reply, entry_id = await self._run_shared(route, request, fut, sharing, span)
            else:
                self._enqueue_cuts.waiting(tag)
                try:
                    # Cancelled while the enqueue is on its way, the request is cancelled once it is queued.
                    entry_id = await self._add(
                        cfg, request, functools.partial(self._queued_unwaited, cfg.name, request), fut
                    )
                except BaseException as exc:
                    if (cut := self._enqueue_failed(tag, fut, exc, span)) is not None:
                        raise cut from None
                    raise
                finally:
                    self._enqueue_cuts.arrived(tag)
                    if span is not None:
                        span.end()
                self._mirror(route, request)
                reply = await fut
        except BaseException as exc:
            if span is not None and span.is_recording():  # it failed before it was queued
                trace_context.failed(span, exc)
                span.end()
            timer.cancel()
            replies.forget(tag, request_id)
            replies.forget_feed(tag, request_id)  # its first chunk may have come as the caller was cancelled
            if entry_id and self._nobody_waits(exc):
                self._cancel_soon(cfg.name, entry_id, request)
            raise
        if reply.status is ReplyStatus.CHUNK:
            self._hand_over(replies, cfg, reply, timer, request, entry_id)
        else:
            timer.cancel()
            replies.forget(tag, request_id)
        if not stream and (reply.status in STREAM_REPLIES or kept_stream(reply)):
            # A stream where one result is awaited: a shared run's, made by stream() with this idempotency key (a
            # replica itself answers such a call BAD_REQUEST without running it).
            message = streaming_only_message(cfg.name, method)
            return request.reply(ReplyStatus.BAD_REQUEST, reply.replica_id, error_message=message)
        return reply

    def _enqueue_failed(
        self, tag: str, fut: asyncio.Future[Reply], exc: BaseException, span: Span | None
    ) -> StreamServeError | None:
        """Call ``tag``'s enqueue failed with ``exc`` (or its wait was cancelled): drop its reply future, note the
        failure in its span; the error to raise instead of ``exc`` when its deadline cut the wait (enqueue_cuts.py)."""
        _abandon(fut)
        cut = self._enqueue_cuts.error(tag) if isinstance(exc, asyncio.CancelledError) else None
        if span is not None:
            trace_context.failed(span, cut or exc)
        return cut

    def _hand_over(
        self,
        replies: ReplyStream,
        cfg: DeploymentConfig,
        first: Reply,
        timer: asyncio.TimerHandle,
        request: Request,
        entry_id: str,
    ) -> None:
        """A request's first reply was a chunk: its feed now holds the deadline (``timer``) and reports how far its
        consumer has read; closing it forgets the request, and cancels it if it has not ended."""
        request_id, tag = first.request_id, first.tag
        feed = replies.feed(tag)
        assert feed is not None  # opened by the reader with the chunk

        def close() -> None:
            timer.cancel()
            replies.forget_feed(tag, request_id)
            if not feed.finished:
                self._cancel_soon(cfg.name, entry_id, request)

        feed.on_close = close
        feed.deadline = timer.when()
        if not request.stream:  # a shared run streamed to call(): request() answers it BAD_REQUEST
            feed.close()
            return
        assert self._pipeliner is not None
        feed.report = progress_reporter(self._pipeliner, self._keys, cfg.name, request_id, tag)

    def new_tag(self) -> str:
        """A tag for a call to be made with ``request(..., tag=)``, to name it before it is sent."""
        assert self._replies is not None
        return self._replies.new_tag()

    def caller_left(self, tag: str, request_id: str) -> None:
        """The caller of call ``tag`` (request ``request_id``) is gone (the gateway's HTTP caller disconnected): stop
        waiting for its reply, and cancel it."""
        if self._replies is not None:
            self._replies.fail(tag, RequestCancelledError(f"request {request_id}: its caller disconnected"))

    def _cancel_soon(self, deployment: str, entry_id: str, request: Request) -> None:
        """Cancel ``request``, queued as ``entry_id``, in the background (freeing its idempotency key, if it has one
        and never ran)."""
        if self._canceller is not None:
            self._canceller.cancel_soon(deployment, entry_id, request)

    def _nobody_waits(self, exc: BaseException) -> bool:
        """Whether a call that ended with ``exc`` before its reply came ended because nobody waits for the reply any
        more: its caller stopped waiting (its task cancelled, its HTTP caller gone, its deadline passed), it was told
        its reply cannot reach it (the reply reader lost Redis: it may send the request again), or the client closed
        under it. (Past its deadline a request is never run; still queued, it held its place in the queue until a
        replica came to read it: an autoscaler or KEDA started one for callers long gone.)"""
        closed = self._replies is None or self._replies.closing
        gone = asyncio.CancelledError | RequestCancelledError | RequestTimeoutError | RedisUnavailableError
        return isinstance(exc, gone) or closed

    def _gone(self, deployment: str) -> bool:
        """Whether ``deployment`` was deleted (as far as this client's routes know)."""
        return self._routes is not None and not self._routes.has_deployment(deployment)

    async def _run_shared(
        self, route: Route, request: Request, fut: asyncio.Future[Reply], sharing: Sharing, span: Span | None
    ) -> tuple[Reply, str]:
        """The reply to ``request``, whose run may be shared, and the entry id it was queued as ("" when it joined
        another call's run, or took its stored reply): see client/shared_calls.py. ``span``: its enqueue span,
        ended here once the request is queued, joined to another run, or answered from a stored reply."""
        assert self._pipeliner is not None and self._replies is not None
        cfg = route.deployment
        abandoned = functools.partial(self._queued_unwaited, cfg.name, request)
        while True:
            request.run = new_run_token()
            self._enqueue_cuts.waiting(request.tag)
            try:
                with self._refusals:
                    admission = await enqueue_shared(self._pipeliner, self._keys, cfg, request, sharing, abandoned)
            except BaseException as exc:
                cut = self._enqueue_failed(request.tag, fut, exc, span)
                if span is not None:
                    span.end()
                if cut is not None:
                    raise cut from None
                raise
            finally:
                self._enqueue_cuts.arrived(request.tag)
            if span is not None:
                shared = "stored" if admission.stored is not None else "joined" if admission.joined else ""
                if shared:
                    span.set_attribute(trace_context.SHARED, shared)
                span.end()
                span = None
            if admission.stored is not None:
                if sharing.counted and admission.stored.status is ReplyStatus.OK:  # a cache entry
                    assert cfg.response_cache is not None and admission.fields is not None
                    for_s = min(cfg.response_cache.local_ttl_s, admission.kept_ms / 1000)
                    self._hot.keep(request.cache, admission.fields, for_s)
                return admission.stored, ""
            try:
                if admission.joined:
                    gone = functools.partial(self._gone, cfg.name)
                    reply = await wait_joined(self.redis, sharing, request, fut, cfg.name, gone)
                    reply.shared = SHARED_JOINED
                else:
                    self._mirror(route, request)
                    try:
                        reply = await fut
                    except RequestTimeoutError as late:
                        reply = await self._kept_by_deadline(sharing, request, late)
            except BaseException as exc:
                if admission.entry_id and self._nobody_waits(exc):
                    self._cancel_soon(cfg.name, admission.entry_id, request)
                raise
            if reply.status is not ReplyStatus.RETRY:
                return reply, admission.entry_id
            fut = self._replies.expect(request.tag, request.request_id)  # the run it joined never ran: run anew
            sharing = dataclasses.replace(sharing, refresh=False)

    async def _kept_by_deadline(self, sharing: Sharing, request: Request, late: RequestTimeoutError) -> Reply:
        """At its deadline, the reply of a shared run that ``request`` runs, if its record keeps it: its copy to the
        caller may have been refused (a full Redis) where the record took it. Else (still running, gone, or Redis
        unreachable) the deadline's error, ``late``."""
        with contextlib.suppress(*RETRYABLE_ERRORS, redis.RedisError):
            kept = await look_at_record(self.redis, sharing, request)
            if kept is not None and kept.status is not ReplyStatus.RETRY:
                return kept
        raise late

    def _hot_hit(
        self, cfg: DeploymentConfig, kept: list[bytes], request_id: str, tag: str, body: bytes, method: str
    ) -> Reply:
        """The reply to a call answered from a kept copy of its cache entry (client/hot_entries.py), counted as a hit;
        traced as one answered by Redis from the entry would be."""
        assert self._hits is not None
        self._hits.add(cfg.name)
        if self._tracer is not None and (span := self._trace(Request(request_id, "", 0, body, method, tag=tag), cfg)):
            span.set_attribute(trace_context.SHARED, SHARED_STORED)
            span.end()
        return stored_reply(kept, request_id, tag)

    def _trace(self, request: Request, cfg: DeploymentConfig) -> Span | None:
        """Start ``request``'s enqueue span, a child of the current span (its context rides in the entry), or None:
        this client does not trace, or the current trace is sampled out."""
        if self._tracer is None:
            return None
        stream = self._keys.requests(cfg.name, request.priority)
        return trace_context.start_enqueue(self._tracer, request, cfg.name, stream)

    def _mirror(self, route: Route, request: Request) -> None:
        """Send a copy of an admitted request to each shadow, without a reply stream (no one waits for it)."""
        for shadow in route.shadows:
            copy = Request(
                new_request_id(),
                "",
                request.deadline_ms,
                request.body,
                request.method,
                priority=request.priority,
                tenant=request.tenant,
                model=request.model,
            )
            task = asyncio.create_task(self._add(shadow, copy))
            self._shadow_tasks.add(task)
            task.add_done_callback(self._shadow_sent)

    def _shadow_sent(self, task: asyncio.Task[str]) -> None:
        self._shadow_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A shadow must never hurt live traffic: a full or missing shadow queue only costs its copy.
            logger.debug("shadow copy not sent: %s", task.exception())

    async def _add(
        self,
        cfg: DeploymentConfig,
        request: Request,
        abandoned: Abandoned | None = None,
        caller: asyncio.Future[Reply] | None = None,
    ) -> str:
        """Queue ``request`` on ``cfg``'s stream (if it has room), or on that of a replica holding its model
        (wire/models.py); its entry id, or for a routed stream its ref (``to:<replica id>/<entry id>``); "" when a
        lost answer was followed by the reply itself (nothing is queued then). ``abandoned``: as for
        Pipeliner.execute; ``caller``: the future its caller awaits the reply on."""
        assert self._pipeliner is not None
        stream = self._keys.requests(cfg.name, request.priority)
        spec, keys = tenant_terms(self._keys, cfg, request) if cfg.tenant_limits else ("", [])
        route = ""
        if request.model and request.priority is Priority.NORMAL:  # to a replica that holds its model
            settings = self._settings
            held_ms = hold_ms(settings.heartbeat_interval_s, settings.heartbeat_timeout_s)
            route = route_spec(request.model, cfg.max_ongoing_requests, held_ms, self._keys.models_prefix(cfg.name))
            keys = [*keys, self._keys.model_holders(cfg.name, request.model)]
            keys += [self._keys.routed_replicas(cfg.name), self._keys.model_room(cfg.name)]
        args: list[Any] = [cfg.max_queued_requests, CONSUMER_GROUP, spec, route]
        for key, value in request.encode().items():
            args += [key, value]

        def enqueue_again(limit: int) -> list[Command]:
            sent_keys = [stream, *keys]
            if request.reply_to and not is_cluster_client(self.redis):
                sent_keys.append(request.reply_to)
            again_args = [limit, CONSUMER_GROUP, request.request_id, *args[2:]]
            return [("EVAL", _ENQUEUE_AGAIN, len(sent_keys), *sent_keys, *again_args)]

        def again() -> list[Command]:
            """The enqueue may have happened, its answer lost with the connection: it must not add the request
            twice, and need not at all once the caller has its reply. A caller that left (its task cancelled, gone
            over HTTP, past its deadline) has its entry looked for, never added: found, it is cancelled (by
            ``abandoned``, or by the call's own end)."""
            if not request.reply_to or self._replies is None or self._replies.waits_for(request.tag):
                return enqueue_again(cfg.max_queued_requests)  # waited for: found, or added
            if caller is None or (caller.done() and not caller.cancelled() and caller.exception() is None):
                return [("ECHO", _ANSWERED)]  # it has its reply
            return enqueue_again(FIND_ONLY)

        def lost(outcome: list[Any] | BaseException) -> None:
            """What the enqueue of a caller who stopped waiting for it came to."""
            if isinstance(outcome, BaseException):
                self._doubtful(cfg, request, outcome, functools.partial(enqueue_again, FIND_ONLY))
            elif abandoned is not None:
                abandoned(outcome)

        with self._refusals:
            try:
                entry_id = await self._pipeliner.run_script(_ENQUEUE, [stream, *keys], args, again, lost)
            except RETRYABLE_ERRORS as exc:
                self._doubtful(cfg, request, exc, functools.partial(enqueue_again, FIND_ONLY))
                raise
        if entry_id == 0:
            raise OverloadedError(queue_full(cfg.name, cfg.max_queued_requests, request.priority))
        if isinstance(entry_id, list):
            raise refusal(entry_id, cfg, request)
        return "" if entry_id in (None, _ANSWERED) else text(entry_id)

    def _doubtful(self, cfg: DeploymentConfig, request: Request, error: BaseException, find: Again) -> None:
        """``request``'s enqueue failed with ``error``, though it may have reached Redis: a Redis that hangs runs
        what it had read once it goes on, and would queue it then, for a caller told it failed (who may send it
        again). When Redis could not be reached, it is looked for (``find``) and cancelled (client/cancels.py)."""
        if isinstance(error, RETRYABLE_ERRORS) and self._canceller is not None:
            self._canceller.find_and_cancel_soon(cfg.name, request, find)

    def _queued_unwaited(self, deployment: str, request: Request, replies: list[Any] | BaseException) -> None:
        """The caller stopped waiting (its task was cancelled) while ``request``'s enqueue was on its way, and
        ``replies`` say it was queued all the same (as an entry id, or a shared run's "queued"): it is cancelled, so
        that it never runs (or, taken already, is stopped). (A shared run's enqueue that failed needs nothing: a
        retry with its key or body finds its run, should Redis have queued it after all.)"""
        if isinstance(replies, BaseException):
            return
        [queued] = replies
        if isinstance(queued, list):  # ENQUEUE_SHARED's answer
            queued = queued_entry(queued)
        if isinstance(queued, bytes) and queued != _ANSWERED:
            self._cancel_soon(deployment, text(queued), request)

    def _expire(self, tag: str, request_id: str, timeout_s: float, deployment: str) -> None:
        replies = self._replies
        if replies is None:
            return
        feed = replies.feed(tag)
        if feed is None:
            # Queued before its deployment was found broken, it waited in vain: the caller is told why.
            broken = self._routes.broken(deployment) if self._routes is not None else ""
            why = f": {broken}" if broken else ""
            replies.fail(tag, RequestTimeoutError(f"no reply within {timeout_s:g}s (request {request_id}){why}"))
            if self._enqueue_cuts.waits(tag):
                later = "if Redis queues it later, it is cancelled"
                if timeout_s < ENQUEUE_STALL_S:  # too short for any Redis: the caller's deadline, not Redis's fault
                    late = f"the call's timeout ({timeout_s:g}s) passed before request {request_id} was queued"
                    self._enqueue_cuts.cut(tag, RequestTimeoutError(f"{late}; {later}"))
                else:
                    url = redacted(self._settings.effective_redis_url)
                    late = (
                        f"Redis at {url} did not take request {request_id} within the call's timeout ({timeout_s:g}s)"
                    )
                    self._enqueue_cuts.cut(tag, RedisUnavailableError(f"{late}; {later}"))
        else:
            feed.expire(RequestTimeoutError(f"the stream did not end within {timeout_s:g}s (request {request_id})"))
