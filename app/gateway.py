"""The gateway app: ``POST <route_prefix>`` -> enqueue -> await reply -> HTTP response.

With ``Prefer: respond-async`` the same POST is checked the same way, then
queued as an asynchronous job (RQ): 202 and ``Location: /-/jobs/<id>``.
"""

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
from streamserve.states import JobStatus

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
            value = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequestError(f"request body is not valid JSON: {exc}") from None
        if _prefers_async(request):
            return await self.submit_job(request, name, value)
        route = await self.client.route(name)
        deployment = route.deployment.name
        request.state.reply_headers["X-Deployment"] = deployment
        timeout = min(route.deployment.request_timeout_s, _header_timeout(request))
        reply = await self.client.request(route, body, timeout=timeout, request_id=request_id)
        if reply.status is not ReplyStatus.OK:
            raise error_of(reply)
        headers = {"X-Request-ID": request_id, "X-Deployment": deployment, "X-Replica": reply.replica_id}
        return Response(reply.body, media_type="application/json", headers=headers)

    async def submit_job(self, request: Request, name: str, value: object) -> Response:
        """Queue the call as a job: 202 with the job's URL. The deployment is picked when the job runs."""
        header_timeout = _header_timeout(request)
        timeout = None
        if header_timeout != float("inf"):  # it can only shorten the deployment's timeout, as for a direct call
            timeout = min((await self.client.route(name)).deployment.request_timeout_s, header_timeout)
        job_id = await self.client.submit_job(name, value, timeout=timeout)
        headers = {
            **request.state.reply_headers,
            "Location": f"/-/jobs/{job_id}",
            "Preference-Applied": "respond-async",
        }
        return json_response({"job_id": job_id, "status": JobStatus.QUEUED.value}, status_code=202, headers=headers)


def _prefers_async(request: Request) -> bool:
    """Whether a ``Prefer`` header (RFC 7240; several, comma-separated, with parameters) asks for respond-async."""
    for header in request.headers.getlist("prefer"):
        for preference in header.split(","):
            if preference.split(";", 1)[0].split("=", 1)[0].strip().lower() == "respond-async":
                return True
    return False


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

    @app.get("/-/jobs/{job_id}")
    async def job(job_id: str) -> Response:
        """An asynchronous job's status, with its result or error once it has one; 404 once its TTL passed."""
        return json_response((await gateway.client.job(job_id)).to_json())

    app.include_router(admin_router(settings, gateway.client))

    @app.post("/{path:path}")
    async def proxy(request: Request) -> Response:
        return await gateway.proxy(request)

    @app.api_route("/{path:path}", methods=["GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"])
    async def other_methods(request: Request) -> Response:
        return gateway.refuse_method(request)

    return app
