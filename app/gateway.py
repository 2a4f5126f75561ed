"""The gateway: ``POST <route_prefix>`` -> enqueue -> await reply -> HTTP response.

Deployment POSTs, the hot path, are served by ``Gateway`` straight on ASGI;
everything else (the admin API, ``/-/`` reads, docs, other methods) goes to
a FastAPI app. Through FastAPI's routing, dependency solving and middleware
stack a request cost the gateway twice the CPU (bench/README.md).

With ``Prefer: respond-async`` the same POST is checked the same way, then
queued as an asynchronous job (RQ): 202 and ``Location: /-/jobs/<id>``.

Every deployment POST says it takes a stream (Request.stream); the first
reply decides: a unary handler's answer is sent as before, a streaming
handler's chunks are relayed as they come (app/streaming_response.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from fastapi.telemetry import TelemetryConfig
from opentelemetry import trace
from redis.exceptions import ResponseError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamserve.app.admin import admin_router, job_reader
from streamserve.app.admin_guard import AdminGuard
from streamserve.app.bodies import ClientDisconnected, check_content_coding, check_transfer_coding, read_body
from streamserve.app.dashboard import dashboard_router
from streamserve.app.errors import (
    error_response,
    handle_client_disconnected,
    handle_request_validation_error,
    handle_streamserve_error,
    json_response,
    redis_error_handler,
    status_for,
)
from streamserve.app.http_protocol import (
    body_arrived,
    end_if_body_unread,
    end_stuck_stream,
    start_chunked,
    when_gone,
    write_chunk,
    write_response,
)
from streamserve.app.observe import CLIENT_CLOSED, RequestObserver
from streamserve.app.openapi import ERROR_RESPONSES, OPENAPI_PATH, add_docs_page, openapi_document
from streamserve.app.routing import RouteTable
from streamserve.app.server_span import end_server_span, start_server_span
from streamserve.app.streaming_response import (
    STUCK_LINGER_S,
    StreamCut,
    quiet_stream_cuts,
    stream_headers,
    stream_response,
    wants_sse,
)
from streamserve.client import AsyncClient
from streamserve.client.outcomes import STREAM_REPLIES, error_of, kept_stream
from streamserve.control.status import StatusReader
from streamserve.metrics.exposition import CONTENT_TYPE, farm_metrics
from streamserve.metrics.figures import Figures
from streamserve.metrics.flusher import MetricsFlusher
from streamserve.runtime import trace_context, tracing
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import RETRYABLE_ERRORS, RedisRefusals
from streamserve.transport.redis_waits import PROBE_REDIS_WAIT_S, READ_REDIS_WAIT_S, redis_answers_within
from streamserve.wire.config import RESERVED_ROUTE_PREFIXES
from streamserve.wire.errors import (
    BadRequestError,
    HeadersTooLargeError,
    MethodNotAllowedError,
    NotFoundError,
    OverloadedError,
    RedisUnavailableError,
    RequestCancelledError,
    StreamServeError,
    UnauthorizedError,
    UnavailableError,
    shown,
)
from streamserve.wire.idempotency import check_key
from streamserve.wire.ids import new_request_id
from streamserve.wire.json_values import check_body, decode_error
from streamserve.wire.messages import SHARED_JOINED, SHARED_STORED, Reply, ReplyStatus
from streamserve.wire.models import MODEL_HEADER, check_model_id
from streamserve.wire.priorities import Priority, parse_priority
from streamserve.wire.states import JobStatus
from streamserve.wire.tenants import DEFAULT_TENANT, check_tenant

# X-Cache by Reply.shared, for a deployment with a response cache.
_X_CACHE = {SHARED_STORED: "hit", SHARED_JOINED: "coalesced", "": "miss"}
NO_FASTAPI_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
    "auto_configure": False,
}
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")  # \Z: "$" would take a trailing newline
# X-Request-Timeout: plain decimal seconds (float() would also take "1_0", "+2", "1e3" and "inf").
# 2, 2.5, .5, 1e-3: no nan, inf, 0x, _. Each digit can belong to one part only: a pattern with two ways to split a
# run of digits backtracks over it (a 64 KiB value held the event loop for minutes).
SECONDS_RE = re.compile(r"(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_JSON = (b"content-type", b"application/json")

logger = logging.getLogger(__name__)

# What a Redis call can raise besides StreamServeErrors (the client wraps what it can).
_REDIS_ERRORS: tuple[type[Exception], ...] = (ResponseError, *RETRYABLE_ERRORS)


class Gateway:
    """Serves deployment routes; holds the gateway's one client (one reply stream, one reader) and route table."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # API key -> tenant when STREAMSERVE_TENANT_KEYS is set (ConfigError now for a file that cannot be read).
        self.tenant_keys = settings.tenant_key_map()
        self.client = AsyncClient(settings=settings)
        self._refusals = RedisRefusals(settings.effective_redis_url)
        figures = Figures() if settings.metrics else None
        self.observer = RequestObserver(figures, settings.access_log, settings.log_format)
        self._routes_generation = -1
        self._routes = RouteTable({})
        self.tracer = tracing.tracer()  # None: tracing is off (runtime/tracing.py)
        # Why its startup failed, when that is a StreamServeError (Redis unreachable, say): said in one line.
        self.startup_error: StreamServeError | None = None

    def routes(self) -> RouteTable:
        if self.client.generation != self._routes_generation:
            self._routes_generation = self.client.generation
            self._routes = RouteTable.build(self.client.deployments(), self.client.endpoints())
        return self._routes

    def match(self, path: str) -> str:
        """The deployment or endpoint serving ``path``; NotFoundError for none (and for the gateway's own paths)."""
        name = None if path.startswith(RESERVED_ROUTE_PREFIXES) else self.routes().match(path)
        if name is None:
            raise NotFoundError(f"no deployment serves {path}")
        return name

    def _served_at(self, path: str) -> str:
        """The deployment or endpoint serving ``path``; "" for none."""
        try:
            return self.match(path)
        except NotFoundError:
            return ""

    def refuse_method(self, request: Request, gateway_routes: list[BaseRoute]) -> Response:
        """What no route takes: 405 with ``Allow`` where the path is served with other methods, else 404.

        ``gateway_routes``: the gateway's own routes (``/-/...``, ``/metrics``), asked which methods they answer for
        the path.
        """
        given, request_id = _request_id(request.headers.get("x-request-id"))
        path = request.url.path
        try:
            _check_request_id(given, request_id, len(request.headers.getlist("x-request-id")))
            if path.startswith(RESERVED_ROUTE_PREFIXES):
                if allowed := _methods_answered(gateway_routes, path):
                    raise MethodNotAllowedError(f"{request.method} {path}: not answered here", allowed)
                raise NotFoundError(f"nothing is served at {path}")  # (the gateway's own: no deployment's)
            else:  # with tenant keys, a caller without one learns nothing of the deployments' routes (405 or 404)
                self.tenant_of(_Headers(request.scope["headers"]))
            self.match(path)
            raise MethodNotAllowedError(f"{request.method} {path}: deployments answer POST only")
        except StreamServeError as exc:
            return error_response(exc, {"X-Request-ID": request_id})

    def tenant_of(self, headers: _Headers) -> str:
        """The request's tenant: with tenant keys, the one its ``Authorization: Bearer KEY`` names (401 without a
        known key; ``X-Tenant`` is not looked at); else ``X-Tenant``, trusted as sent (400 for one that is not a
        tenant name), or DEFAULT_TENANT."""
        if self.tenant_keys is not None:
            # Two keys are a 400, not the first one's tenant (a proxy that adds its own must not decide by order).
            scheme, _, key = (headers.one(b"authorization", "Authorization") or "").partition(" ")
            tenant = self.tenant_keys.tenant_of(key.strip()) if scheme.lower() == "bearer" else None
            if tenant is None:
                raise UnauthorizedError(
                    "this gateway serves deployments to known API keys only (STREAMSERVE_TENANT_KEYS): send "
                    "'Authorization: Bearer <key>'"
                )
            return tenant
        named = headers.one(b"x-tenant", "X-Tenant")
        if named is None:
            return DEFAULT_TENANT
        try:
            return check_tenant(named)
        except BadRequestError as exc:
            raise BadRequestError(f"X-Tenant: {exc}") from None

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: answer one ``POST <route_prefix>``, every error in the gateway's JSON shape; count and log it. When
        the gateway traces, in a server span that is current meanwhile (its enqueue span is a child)."""
        started = time.perf_counter()
        exchange = _Exchange(scope, receive, send)
        span = start_server_span(self.tracer, scope) if self.tracer is not None else None
        token = trace_context.attach(trace.set_span_in_context(span)) if span is not None else None
        try:
            await self._answer(exchange)
        finally:
            path = scope["path"]
            status, request_id = exchange.status, exchange.request_id
            trace_id = ""
            if span is not None:
                trace_context.detach(token)
                trace_id = format(span.get_span_context().trace_id, "032x")
                if span.is_recording():  # (not when sampled out)
                    route = self.routes().prefix(path) if exchange.deployment else None
                    end_server_span(span, scope, status, route, exchange.error, request_id)
            self.observer.done(
                "POST",
                path,
                status,
                started,
                request_id,
                exchange.deployment,
                exchange.replica,
                exchange.tenant,
                trace_id,
            )

    async def _answer(self, exchange: _Exchange) -> None:
        """Answer the request; ``exchange`` learns what was answered, by whom."""
        scope, receive, send, headers = exchange.scope, exchange.receive, exchange.send, exchange.headers
        job = False
        idempotency_key: str | None = None
        try:
            # First: with tenant keys, nothing else of a request without a known key is looked at (its path, its
            # body); a 400 below is counted under its tenant.
            try:
                exchange.tenant = tenant = self.tenant_of(headers)
            except BadRequestError:  # (a malformed X-Tenant, say) counted under the deployment, its tenant unknown
                exchange.deployment = self._served_at(scope["path"])
                raise
            given = exchange.given_id
            try:
                _check_request_id(
                    given, exchange.request_id, 0 if given is None else len(headers.getlist(b"x-request-id"))
                )
            except BadRequestError:  # counted under its deployment, as every other 400 of its route
                exchange.deployment = self._served_at(scope["path"])
                raise
            exchange.deployment = name = self.match(scope["path"])
            limit = self.settings.max_request_bytes
            length, timeout_s = headers.content_length(), self.settings.body_timeout_s
            body = await read_body(receive, length, limit, timeout_s, body_arrived(scope))
            body = body or b"null"
            try:
                check_body(body)  # the body goes on as it came; a job's value is read again
            except orjson.JSONDecodeError as exc:
                raise BadRequestError(f"request body is {decode_error(body, exc)}") from None
            except ValueError as exc:
                raise BadRequestError(f"request body: {exc}") from None
            header_timeout = _header_timeout(headers.getlist(b"x-request-timeout"))
            idempotency_key = _idempotency_key(headers.getlist(b"idempotency-key"))
            priority = _priority(headers.one(b"x-priority", "X-Priority"))
            model = _model_id(headers.one(b"x-model-id", MODEL_HEADER))
            if _prefers_async(headers.getlist(b"prefer")):
                job = True  # (cut off at shutdown, it may be queued already: not answered "send it again")
                response = await self._submit_job(
                    name,
                    orjson.loads(body),
                    header_timeout,
                    exchange.reply_headers,
                    idempotency_key,
                    (priority, tenant, model),
                )
                exchange.status = response.status_code
                await response(scope, receive, send)
                return
            route = await self.client.route(name, idempotency_key or "")
            exchange.reply_headers["X-Deployment"] = exchange.deployment = deployment = route.deployment.name
            timeout = min(route.deployment.request_timeout_s, header_timeout)
            tag = self.client.new_tag()
            when_gone(scope, functools.partial(self.client.caller_left, tag, exchange.request_id))
            reply = await self.client.request(
                route,
                body,
                timeout=timeout,
                request_id=exchange.request_id,
                stream=True,
                tag=tag,
                idempotency_key=idempotency_key or "",
                priority=priority,
                tenant=tenant,
                model_id=model,
                refresh=route.deployment.response_cache is not None
                and _no_cache(headers.getlist(b"cache-control"), headers.getlist(b"pragma")),
            )
            exchange.replica = reply.replica_id
            shared: tuple[tuple[str, str], ...] = ()
            if reply.shared or route.deployment.response_cache is not None:
                shared = _shared_headers(reply, idempotency_key is not None)
                exchange.reply_headers.update(shared)
            if reply.status is not ReplyStatus.OK and reply.status not in STREAM_REPLIES and not kept_stream(reply):
                raise error_of(reply)
        except RequestCancelledError:  # its caller disconnected (caller_left): nobody to answer; the access log: 499
            return
        except StreamServeError as exc:
            await self._answer_error(exchange, exc)
            return
        except ClientDisconnected:
            return
        except asyncio.CancelledError:
            # uvicorn cancels what still runs once the gateway's graceful shutdown has timed out: the request is
            # cancelled (in Redis too, as for a caller who left), and its caller told so rather than given uvicorn's
            # bare plain-text 500.
            if job:
                raise
            stopped = UnavailableError(_stopped_before_answer(exchange.request_id, idempotency_key is not None))
            exchange.error = stopped
            response = error_response(stopped, exchange.reply_headers)
            exchange.status = response.status_code
            with suppress(Exception):
                await response(scope, receive, send)
            raise
        except Exception as exc:  # a Redis error (its user lacks a permission, say), or a fault of the gateway's own
            await self._answer_error(exchange, self._unexpected(exc, exchange.request_id))
            return
        if reply.status is not ReplyStatus.OK:
            await self._stream(exchange, reply, shared)
            return
        exchange.status = 200
        response_headers = [
            _JSON,
            (b"x-request-id", exchange.request_id.encode()),
            (b"x-deployment", deployment.encode()),
            (b"x-replica", reply.replica_id.encode()),
        ]
        response_headers += [(name.lower().encode(), value.encode()) for name, value in shared]
        if write_response(scope, 200, response_headers, reply.body):
            return
        response_headers.append((b"content-length", str(len(reply.body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        await send({"type": "http.response.body", "body": reply.body})

    async def _answer_error(self, exchange: _Exchange, exc: StreamServeError) -> None:
        """Answer ``exc`` in the gateway's JSON shape."""
        exchange.error = exc
        response = error_response(exc, exchange.reply_headers)
        exchange.status = response.status_code
        end_if_body_unread(exchange.scope)  # (a 404, 401, 413 by Content-Length: the rest of the body is never read)
        await response(exchange.scope, exchange.receive, exchange.send)

    def _unexpected(self, exc: Exception, request_id: str) -> StreamServeError:
        """What a caller is told of an error that is not a StreamServeError: a Redis error as the gateway's own routes
        tell it (503 for a Redis away or full), else 500, logged with its traceback."""
        if isinstance(exc, _REDIS_ERRORS):
            return self._refusals.meaning(exc) or StreamServeError(f"Redis: {exc}")
        logger.exception("request %s: the gateway failed to answer it", request_id)
        return StreamServeError(f"the gateway failed to answer request {request_id}: {exc!r}")

    async def _stream(self, exchange: _Exchange, first: Reply, shared: tuple[tuple[str, str], ...]) -> None:
        """A streaming handler's answer (``first`` its first reply): 200, then its chunks as they come.
        ``shared``: the headers that say how a shared run answered."""
        feed = self.client.follow(first)
        # Its caller's leaving ends it: told by the server, else by watching ``receive``.
        told = when_gone(exchange.scope, functools.partial(feed.fail, ClientDisconnected()))
        sse = wants_sse(exchange.headers.getlist(b"accept"))
        headers = stream_headers(sse, exchange.request_id, exchange.deployment, first.replica_id)
        headers += [(name.lower().encode(), value.encode()) for name, value in shared]
        exchange.status = 200
        try:
            exchange.status = await stream_response(
                exchange.send,
                None if told else exchange.receive,
                feed,
                headers,
                sse,
                exchange.request_id,
                functools.partial(write_chunk, exchange.scope),
                functools.partial(start_chunked, exchange.scope),
                functools.partial(end_stuck_stream, exchange.scope, linger_s=STUCK_LINGER_S),
            )
        except StreamCut as cut:
            exchange.status = cut.status
            raise
        except asyncio.CancelledError:
            exchange.status = status_for(UnavailableError(""))  # (the gateway stopped: the stream says why)
            raise
        finally:
            exchange.replica = feed.replica_id or first.replica_id

    async def _submit_job(
        self,
        name: str,
        value: object,
        header_timeout: float,
        reply_headers: dict[str, str],
        key: str | None,
        terms: tuple[Priority, str, str],
    ) -> Response:
        """Queue the call as a job: 202 with the job's URL. The deployment is picked when the job runs. ``terms``:
        its priority, tenant and model."""
        priority, tenant, model = terms
        timeout = None
        if header_timeout != float("inf"):  # it can only shorten the deployment's timeout, as for a direct call
            timeout = min((await self.client.route(name)).deployment.request_timeout_s, header_timeout)
        job_id = await self.client.submit_job(
            name, value, timeout=timeout, idempotency_key=key, priority=priority, tenant=tenant, model_id=model or None
        )
        status = JobStatus.QUEUED
        if key is not None:  # the key may name a job queued before, which has gone on since: say where it is
            with suppress(NotFoundError):  # not yet queued by the request that took the key (or its result expired)
                status = (await self.client.job(job_id)).status
        headers = {**reply_headers, "Location": f"/-/jobs/{job_id}", "Preference-Applied": "respond-async"}
        return json_response({"job_id": job_id, "status": status.value}, status_code=202, headers=headers)


class _Exchange:
    """One deployment POST: what came in (the ASGI triple, the headers, the caller's and the used request id, the
    reply's headers so far) and, for its count and access line, what it got: status (CLIENT_CLOSED until one is
    sent), the deployment (or endpoint, before one is picked) it went to, the replica that answered, the error it got.

    Built once per request, a plain class with slots: its outcome fields are written as the request goes, and a
    frozen dataclass or NamedTuple beside a mutable outcome would add an allocation to the hot path.
    """

    __slots__ = (
        "deployment",
        "error",
        "given_id",
        "headers",
        "receive",
        "replica",
        "reply_headers",
        "request_id",
        "scope",
        "send",
        "status",
        "tenant",
    )

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.headers = _Headers(scope["headers"])
        self.given_id, self.request_id = _request_id(self.headers.get(b"x-request-id"))
        self.reply_headers = {"X-Request-ID": self.request_id}
        self.status = CLIENT_CLOSED
        self.deployment = ""
        self.replica = ""
        self.tenant = ""
        self.error: StreamServeError | None = None  # the error it was answered with


class _Headers:
    """The few request headers the gateway reads, from ASGI's raw (lower-cased name, value) pairs."""

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self._raw = raw

    def get(self, name: bytes) -> str | None:
        for key, value in self._raw:
            if key == name:
                return value.decode("latin-1")
        return None

    def getlist(self, name: bytes) -> list[str]:
        return [value.decode("latin-1") for key, value in self._raw if key == name]

    def content_length(self) -> str | None:
        """``Content-Length``, as ``get`` reads it; in the same pass over the headers, a body in a coding the gateway
        does not undo is refused: 415 for a ``Content-Encoding``, 501 for a ``Transfer-Encoding`` but ``chunked``."""
        length = None
        coded = False
        for key, value in self._raw:
            if key == b"content-length":
                if length is None:
                    length = value.decode("latin-1")
            elif key == b"content-encoding" or key == b"transfer-encoding":
                coded = True
        if coded:
            check_transfer_coding(self.getlist(b"transfer-encoding"))
            check_content_coding(self.getlist(b"content-encoding"))
        return length

    def one(self, name: bytes, header: str) -> str | None:
        """The value of header ``name`` (``header`` as error messages name it), as the client wrote it (UTF-8, else
        latin-1) less the spaces and tabs around it, which are no part of a field's value (RFC 9110, 5.5; httptools
        keeps trailing ones); None without one, BadRequestError (400) for two or more."""
        found = None
        for key, value in self._raw:
            if key == name:
                if found is not None:
                    raise BadRequestError(f"a request takes one {header} header")
                found = value
        if found is None:
            return None
        found = found.strip(b" \t")
        try:
            return found.decode()
        except UnicodeDecodeError:
            return found.decode("latin-1")


def _request_id(given: str | None) -> tuple[str | None, str]:
    """The caller's X-Request-ID and the one to use: the same when it is valid, else a new one."""
    return given, given if given is not None and REQUEST_ID_RE.match(given) else new_request_id()


def _check_request_id(given: str | None, request_id: str, copies: int) -> None:
    """400 for an X-Request-ID that is not one, or sent more than once (``copies``: how many the request has)."""
    if copies > 1:
        raise BadRequestError(f"a request takes one X-Request-ID header, got {copies}")
    if given is not None and given != request_id:
        raise BadRequestError("X-Request-ID must be 1-128 of A-Z a-z 0-9 . _ : -")


def _priority(header: str | None) -> Priority:
    """X-Priority as a Priority (none: ``normal``); BadRequestError, a 400, for anything but high, normal or low."""
    if header is None:
        return Priority.NORMAL
    try:
        if not header.strip():
            raise BadRequestError("unknown priority '': use one of high, normal, low")
        return parse_priority(header)
    except BadRequestError as exc:
        raise BadRequestError(f"X-Priority: {exc}") from None


def _model_id(header: str | None) -> str:
    """X-Model-Id (none: ""); BadRequestError, a 400, for one that is not a model id (wire/models.py)."""
    if header is None:
        return ""
    try:
        return check_model_id(header)
    except BadRequestError as exc:
        raise BadRequestError(f"{MODEL_HEADER}: {exc}") from None


# Request directives (RFC 9111, 5.2.1) that ask for a reply not taken from a cache, beside a max-age of 0: each runs
# the call anew.
_FRESH_DIRECTIVES = frozenset({"no-cache", "no-store"})


def _stopped_before_answer(request_id: str, keyed: bool) -> str:
    """What a caller is told whose request the gateway's shutdown cut short. A run with an idempotency key is not
    cancelled by its caller leaving: it goes on and keeps its reply (told "cancelled", a payment's client would send
    it again with a new key, and pay twice)."""
    if keyed:
        return (
            f"the gateway stopped before request {request_id} was answered; its run goes on and keeps its reply: "
            "send the request again with the same Idempotency-Key for it"
        )
    return f"the gateway stopped before request {request_id} was answered: the request was cancelled; send it again"


def _no_cache(cache_control: list[str], pragma: list[str]) -> bool:
    """Whether a request asks for a fresh reply, skipping the response cache's lookup: ``Cache-Control`` headers
    (several, comma-separated) with ``no-cache``, ``no-store`` or a ``max-age`` of 0 (``0``, ``00``, ``"0"``), or,
    without any (RFC 9111, 5.4: an HTTP/1.0 cache's way), ``Pragma: no-cache``."""
    if not cache_control:
        return any(d.strip().lower() == "no-cache" for header in pragma for d in header.split(","))
    for header in cache_control:
        for directive in header.split(","):
            name, _, value = "".join(directive.split()).lower().partition("=")
            seconds = value.strip('"')
            if name in _FRESH_DIRECTIVES or (
                name == "max-age" and seconds.isascii() and seconds.isdigit() and int(seconds) == 0
            ):
                return True
    return False


def _shared_headers(reply: Reply, keyed: bool) -> tuple[tuple[str, str], ...]:
    """What a reply from a shared run says of it: ``Idempotent-Replayed: true`` for a reply kept for an idempotency
    key, ``X-Cache: hit``, ``coalesced`` or ``miss`` for a deployment with a response cache."""
    if keyed:
        return (("Idempotent-Replayed", "true"),) if reply.shared == SHARED_STORED else ()
    return (("X-Cache", _X_CACHE[reply.shared]),)


def _prefers_async(prefer_headers: list[str]) -> bool:
    """Whether ``Prefer`` headers (RFC 7240; several, comma-separated, with parameters) ask for respond-async."""
    for header in prefer_headers:
        for preference in header.split(","):
            if preference.split(";", 1)[0].split("=", 1)[0].strip().lower() == "respond-async":
                return True
    return False


def _methods_answered(routes: list[BaseRoute], path: str) -> tuple[str, ...]:
    """The methods some route answers at ``path`` (asked the way Starlette's router asks)."""
    scope: dict[str, Any] = {"type": "http", "path": path, "root_path": "", "headers": []}
    methods = [m for m in HTTP_METHODS if any(r.matches({**scope, "method": m})[0] is Match.FULL for r in routes)]
    if "GET" in methods and "HEAD" not in methods:  # (GatewayApp answers HEAD as GET)
        methods.insert(methods.index("GET") + 1, "HEAD")
    return tuple(methods)


def _idempotency_key(given: list[str]) -> str | None:
    """The request's Idempotency-Key (None without one). Whitespace around it is no part of it (RFC 9110: a proxy may
    drop it, and a retry must still name the same key); two of them are a 400, as is a key that is no key (named as
    the client sent it: header values arrive as latin-1, a UTF-8 key is shown as UTF-8)."""
    if not given:
        return None
    if len(given) > 1:
        raise BadRequestError(f"a request takes one Idempotency-Key header, got {len(given)}")
    key = given[0].strip(" \t")
    with suppress(UnicodeError):
        key = key.encode("latin-1").decode()  # no longer ASCII either way: refused below, as sent
    return check_key(key)


def _header_timeout(given: list[str]) -> float:
    """The request's X-Request-Timeout in seconds (inf without one); two of them are a 400, as is a value that is no
    positive number."""
    if not given:
        return float("inf")
    if len(given) > 1:
        raise BadRequestError(f"a request takes one X-Request-Timeout header, got {len(given)}")
    raw = given[0]
    value = float(raw) if SECONDS_RE.fullmatch(raw.strip()) else 0.0
    if not 0 < value < float("inf"):
        raise BadRequestError(
            f"X-Request-Timeout must be a positive number of seconds, such as 2, 0.5 or 1e-3, got {shown(raw)}"
        )
    return value


class _StartupFailedLine(logging.Filter):
    """Drops uvicorn's "Application startup failed. Exiting." once the gateway has said why in a line of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Application startup failed. Exiting."


class GatewayApp:
    """The gateway's ASGI app: deployment POSTs to ``Gateway.serve``, everything else to the FastAPI app."""

    def __init__(self, gateway: Gateway, api: ASGIApp) -> None:
        self.gateway = gateway
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, self._plain_startup_failure(send))  # lifespan
            return
        deployment_post = scope["method"] == "POST" and not scope["path"].startswith(RESERVED_ROUTE_PREFIXES)
        if deployment_post and self._headers_fit(scope):
            await self.gateway.serve(scope, receive, send)
            return
        await self._other(scope, receive, send)

    def _plain_startup_failure(self, send: Send) -> Send:
        """``send``, except that a startup that failed for a known reason says that reason, not Starlette's traceback
        of it (which uvicorn logs as the failure's message)."""

        async def send_plainly(message: Message) -> None:
            error = self.gateway.startup_error
            if message["type"] == "lifespan.startup.failed" and error is not None:
                message = {**message, "message": f"gateway: {error}"}
                # That line says it all: uvicorn's own "Application startup failed. Exiting." after it would not.
                logging.getLogger("uvicorn.error").addFilter(_StartupFailedLine())
            await send(message)

        return send_plainly

    async def _other(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Everything but a deployment POST (or one refused for its headers): the FastAPI app, with its access line.
        An answer given with part of the body unread (a 404, a refused admin write) ends the connection."""

        async def send_last_if_unread(message: Message) -> None:
            if message["type"] == "http.response.start":
                end_if_body_unread(scope)
            await send(message)

        # HEAD is answered as GET (RFC 9110, 9.1: a server that takes GET takes HEAD; FastAPI's routes do not by
        # themselves): the app sees GET, and uvicorn, whose scope still says HEAD, writes the head without the body.
        app_scope = {**scope, "method": "GET"} if scope["method"] == "HEAD" else scope

        observer = self.gateway.observer
        refusal = self._refusal(scope)
        if not observer.access_log:
            if refusal is None:
                await self.api(app_scope, receive, send_last_if_unread)
            else:
                await error_response(refusal, {})(scope, receive, send_last_if_unread)
            return
        started, status, replied_id = time.perf_counter(), CLIENT_CLOSED, ""

        async def send_and_note(message: Message) -> None:
            nonlocal status, replied_id
            if message["type"] == "http.response.start":
                status = message["status"]
                replied_id = _Headers(message.get("headers", ())).get(b"x-request-id") or ""
            await send_last_if_unread(message)

        try:
            if refusal is None:
                await self.api(app_scope, receive, send_and_note)
            else:
                await error_response(refusal, {})(scope, receive, send_and_note)
        finally:
            # The id the reply carries (a new one where the caller's was refused), else the caller's when it is a
            # valid id, as on deployment paths: spaces in it cannot add fields to the line.
            given = _Headers(scope["headers"]).get(b"x-request-id") or ""
            request_id = replied_id or (given if REQUEST_ID_RE.fullmatch(given) else "")
            observer.done(scope["method"], scope["path"], status, started, request_id, "", "")

    def _headers_fit(self, scope: Scope) -> bool:
        return sum(len(name) + len(value) for name, value in scope["headers"]) <= self.gateway.settings.max_header_bytes

    def _refusal(self, scope: Scope) -> StreamServeError | None:
        """What no route is asked about: headers above max_header_bytes (431), a body in a transfer coding but
        ``chunked`` (501); None for neither."""
        if not self._headers_fit(scope):
            limit = self.gateway.settings.max_header_bytes
            return HeadersTooLargeError(f"the request's headers are above max_header_bytes ({limit})")
        try:
            check_transfer_coding(_Headers(scope["headers"]).getlist(b"transfer-encoding"))
        except StreamServeError as exc:
            return exc
        return None


def create_app(settings: Settings) -> GatewayApp:
    """Build the gateway; its client connects at startup (ASGI lifespan) and closes at shutdown."""
    quiet_stream_cuts()
    gateway = Gateway(settings)
    api = FastAPI(
        title="streamserve gateway",
        lifespan=_lifespan(gateway),
        docs_url=None,  # (add_docs_page)
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
        openapi_url=OPENAPI_PATH,
        responses=ERROR_RESPONSES,
        # FastAPI's own telemetry would trace each probe, scrape and dashboard poll with the farm's tracer provider:
        # the gateway's spans are its requests' (docs/tracing.md), and OTLP exporters are its own to set up.
        telemetry=NO_FASTAPI_TELEMETRY,
    )
    _add_error_handlers(api, settings)
    add_docs_page(api)
    _add_probes(api, gateway)
    _add_reads(api, gateway)
    api.include_router(admin_router(settings, gateway.client, gateway.tenant_keys))
    api.include_router(dashboard_router(gateway.client, settings.keys, settings.effective_redis_url))
    _add_refusals(api, gateway)  # last: its catch-all route answers what no route above takes
    api.openapi = lambda: openapi_document(api)  # type: ignore[method-assign]
    return GatewayApp(gateway, api)


def _lifespan(gateway: Gateway) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the client (and the metrics flusher) at startup; at shutdown flush what is counted and close."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            await gateway.client.start()
        except OverloadedError as exc:
            # A full Redis: come up all the same, answer what needs no memory (health, status, job results) and 503
            # with the reason to the rest; every call tries again to make the reply stream, until Redis has room.
            logger.warning("gateway: %s; calls get 503 until Redis has room", exc)
        except StreamServeError as exc:  # Redis unreachable, its password refused: the process cannot serve
            gateway.startup_error = exc
            raise
        flusher = None
        if gateway.observer.figures is not None:
            client, keys = gateway.client, gateway.settings.keys
            flusher = MetricsFlusher(client.redis, keys, gateway.observer.figures, exists=client.knows)
            flusher.start()
        try:
            yield
        finally:
            if flusher is not None:
                await flusher.aclose()
            gateway.observer.flush()
            await gateway.client.aclose()
            # Now, not at exit: once shut down, uvicorn ends the process with the stop signal itself, before the
            # exit hooks that would send the last spans run.
            await asyncio.to_thread(tracing.flush)

    return lifespan


def _add_error_handlers(api: FastAPI, settings: Settings) -> None:
    api.add_exception_handler(StreamServeError, handle_streamserve_error)
    api.add_exception_handler(RequestValidationError, handle_request_validation_error)
    api.add_exception_handler(ClientDisconnected, handle_client_disconnected)
    # A Redis error on a route of FastAPI's (an admin write, the status, the dashboard's data, the metrics): 503 for
    # a Redis away or full, in the shape of every other error, and no traceback in the log.
    on_redis_error = redis_error_handler(RedisRefusals(settings.effective_redis_url))
    for redis_error in _REDIS_ERRORS:
        api.add_exception_handler(redis_error, on_redis_error)


def _add_probes(api: FastAPI, gateway: Gateway) -> None:
    """Liveness, readiness and the farm's Prometheus metrics."""

    url = gateway.settings.effective_redis_url

    @api.get("/-/healthz")
    async def healthz() -> Response:
        try:
            async with redis_answers_within(PROBE_REDIS_WAIT_S, url):
                await gateway.client.ping()
        except RedisUnavailableError as exc:
            return error_response(exc, {})
        return json_response({"status": "ok"})

    @api.get("/-/ready")
    async def ready() -> Response:
        """Readiness: the route table is loaded and Redis answers now (a load balancer sends traffic only then)."""
        if not gateway.client.routes_loaded:
            return error_response(UnavailableError("the gateway has not loaded its routes yet"), {})
        try:
            async with redis_answers_within(PROBE_REDIS_WAIT_S, url):
                await gateway.client.ping()
        except RedisUnavailableError as exc:
            return error_response(exc, {})
        return json_response({"status": "ready"})

    @api.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        """The whole farm in Prometheus's text format (every gateway shows the same figures)."""
        async with redis_answers_within(READ_REDIS_WAIT_S, url):
            text = await farm_metrics(gateway.client.redis, gateway.settings.keys)
        return Response(text, media_type=CONTENT_TYPE)


def _add_reads(api: FastAPI, gateway: Gateway) -> None:
    """What the gateway serves, the farm's status, an asynchronous job."""
    guard = AdminGuard(gateway.settings)  # (a job is read with the admin token too)

    @api.get("/-/routes")
    async def routes() -> dict[str, str]:
        return gateway.routes().routes

    @api.get("/-/status")
    async def status() -> Response:
        async with redis_answers_within(READ_REDIS_WAIT_S, gateway.settings.effective_redis_url):
            report = await StatusReader(gateway.client.redis, gateway.settings.keys).report()
        return json_response(report)

    @api.get("/-/jobs/{job_id}")
    async def job(job_id: str, request: Request) -> Response:
        """An asynchronous job's status, with its result or error once it has one; 404 once its TTL passed. With
        tenant API keys (STREAMSERVE_TENANT_KEYS), for a key of the tenant it was sent for (403 for another's), or the
        admin token."""
        info = await gateway.client.job(job_id, for_tenant=job_reader(request, guard, gateway.tenant_keys))
        return Response(info.encoded(), media_type="application/json")


def _add_refusals(api: FastAPI, gateway: Gateway) -> None:
    """404 and 405 in the gateway's error shape, for whatever the routes added so far do not take."""
    gateway_routes = list(api.routes)

    @api.api_route("/{path:path}", methods=list(HTTP_METHODS), include_in_schema=False)
    async def other_methods(request: Request) -> Response:
        """What no route above takes: unknown paths (404), other methods than a route answers (405 with Allow)."""
        return gateway.refuse_method(request, gateway_routes)

    async def unmatched(request: Request, exc: Exception) -> Response:
        """What the catch-all cannot match either: a method beyond HTTP_METHODS (CONNECT, WebDAV's PROPFIND), answered
        as the catch-all answers the others (a deployment's route: 405 with Allow: POST); a target that is no path
        (``OPTIONS *``): 404 in the gateway's error shape."""
        if getattr(exc, "status_code", None) == 405:  # (registered for StarletteHTTPException)
            return gateway.refuse_method(request, gateway_routes)
        return error_response(NotFoundError(f"nothing is served at {request.url.path}"), {})

    api.add_exception_handler(StarletteHTTPException, unmatched)
