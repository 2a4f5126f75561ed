"""The gateway app: ``POST <route_prefix>`` -> enqueue -> await reply -> HTTP response."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NoReturn

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError

from app.admin import admin_router
from app.errors import handle_request_validation_error, handle_streamserve_error, json_response
from app.routing import RouteTable
from streamserve.client import AsyncClient, error_of
from streamserve.connection import RETRYABLE_ERRORS
from streamserve.control import Control
from streamserve.errors import (
    BadRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    StreamServeError,
)
from streamserve.ids import new_request_id
from streamserve.messages import ReplyStatus
from streamserve.settings import Settings

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class Gateway:
    """Holds the gateway's one client (one reply stream, one reader) and its route table."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = AsyncClient(settings=settings)
        self._routes_generation = -1
        self._routes = RouteTable({})

    def routes(self) -> RouteTable:
        if self.client.generation != self._routes_generation:
            self._routes_generation = self.client.generation
            self._routes = RouteTable.build(self.client.deployments(), self.client.endpoints())
        return self._routes

    def _match(self, request: Request) -> str:
        """The deployment or endpoint serving the path; sets X-Request-ID (echoed, or a new one) first."""
        given = request.headers.get("x-request-id")
        request_id = given if given and REQUEST_ID_RE.match(given) else new_request_id()
        request.state.reply_headers = {"X-Request-ID": request_id}
        if given is not None and given != request_id:
            raise BadRequestError("X-Request-ID must be 1-128 of A-Z a-z 0-9 . _ : -")
        name = self.routes().match(request.url.path)
        if name is None:
            raise NotFoundError(f"no deployment serves {request.url.path}")
        return name

    def refuse_method(self, request: Request) -> NoReturn:
        """Anything but POST: 404 where nothing is served, else 405 with ``Allow: POST``."""
        self._match(request)
        raise MethodNotAllowedError(f"{request.method} {request.url.path}: deployments answer POST only")

    async def proxy(self, request: Request) -> Response:
        name = self._match(request)
        request_id = request.state.reply_headers["X-Request-ID"]
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.settings.max_request_bytes:
            raise PayloadTooLargeError(
                f"request body of {length} bytes is above max_request_bytes ({self.settings.max_request_bytes})"
            )
        body = await request.body() or b"null"
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequestError(f"request body is not valid JSON: {exc}") from None
        route = await self.client.route(name)
        deployment = route.deployment.name
        request.state.reply_headers["X-Deployment"] = deployment
        timeout = min(route.deployment.request_timeout_s, _header_timeout(request))
        reply = await self.client.request(route, body, timeout=timeout, request_id=request_id)
        if reply.status is not ReplyStatus.OK:
            raise error_of(reply)
        headers = {"X-Request-ID": request_id, "X-Deployment": deployment, "X-Replica": reply.replica_id}
        return Response(reply.body, media_type="application/json", headers=headers)


def _header_timeout(request: Request) -> float:
    raw = request.headers.get("x-request-timeout")
    if raw is None:
        return float("inf")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise BadRequestError(f"X-Request-Timeout must be a positive number of seconds, got {raw!r}")
    return value


def create_app(settings: Settings) -> FastAPI:
    """Build the FastAPI app; the client connects at startup and closes at shutdown."""
    gateway = Gateway(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await gateway.client.start()
        try:
            yield
        finally:
            await gateway.client.aclose()

    app = FastAPI(title="streamserve gateway", lifespan=lifespan, docs_url="/-/docs", openapi_url="/-/openapi.json")
    app.state.gateway = gateway
    app.add_exception_handler(StreamServeError, handle_streamserve_error)
    app.add_exception_handler(RequestValidationError, handle_request_validation_error)

    @app.get("/-/healthz")
    async def healthz() -> Response:
        try:
            await gateway.client.ping()
        except RETRYABLE_ERRORS as exc:
            return json_response({"status": "unavailable", "message": f"Redis: {exc}"}, status_code=503)
        return json_response({"status": "ok"})

    @app.get("/-/routes")
    async def routes() -> dict[str, str]:
        return gateway.routes().routes

    @app.get("/-/status")
    async def status() -> Response:
        return json_response(await Control(gateway.client.redis, settings.keys).report())

    app.include_router(admin_router(settings, gateway.client))

    @app.post("/{path:path}")
    async def proxy(request: Request) -> Response:
        return await gateway.proxy(request)

    @app.api_route("/{path:path}", methods=["GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"])
    async def other_methods(request: Request) -> Response:
        return gateway.refuse_method(request)

    return app
