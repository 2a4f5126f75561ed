"""The admin API under ``/-/``: the CLI's writes over HTTP, behind app/admin_guard.py's token and checks."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request, Response, params

from streamserve.app.admin_guard import AdminGuard
from streamserve.app.bodies import read_body
from streamserve.app.errors import json_response
from streamserve.app.openapi import DEPLOY_BODY, SCALE_BODY, TRAFFIC_BODY
from streamserve.client import AsyncClient
from streamserve.control.goal_records import GoalStore
from streamserve.runtime.settings import Settings
from streamserve.wire.config import parse_config
from streamserve.wire.errors import (
    BadRequestError,
    GoalFailedError,
    RequestTimeoutError,
    UnauthorizedError,
)
from streamserve.wire.json_values import check_decoded, check_unique_keys, decode_error
from streamserve.wire.states import FINAL_GOAL_STATUSES
from streamserve.wire.tenants import TenantKeys

MAX_GOAL_WAIT_S = 60.0


def admin_router(settings: Settings, client: AsyncClient, tenant_keys: TenantKeys | None = None) -> APIRouter:
    """The writes (behind the token and the checks of app/admin_guard.py) and the goal read, under ``/-``.
    ``tenant_keys``: the gateway's tenant API keys, each of which may cancel the jobs sent with it."""
    router = APIRouter(prefix="/-")
    guard = AdminGuard(settings)
    guarded = [Depends(guard)]
    _add_deployment_writes(router, guarded, settings, client)
    _add_endpoint_writes(router, guarded, settings, client)
    _add_job_writes(router, guard, tenant_keys, client)
    _add_goal_read(router, settings, client)
    return router


def _add_deployment_writes(
    router: APIRouter, guarded: Sequence[params.Depends], settings: Settings, client: AsyncClient
) -> None:
    @router.post("/deploy", dependencies=guarded, openapi_extra=DEPLOY_BODY)
    async def deploy(request: Request) -> Response:
        """Body: a config as JSON (the YAML file's shape). Answers {"goals": {deployment: goal id}}."""
        config = parse_config(await _json_body(request, settings), "request body", settings.config_limit_values)
        applied = await client.desired_state().apply(config)
        return json_response({"goals": applied.goals, "endpoints": applied.endpoints})

    @router.post("/deployments/{name}/scale", dependencies=guarded, openapi_extra=SCALE_BODY)
    async def scale(name: str, request: Request) -> Response:
        """Body: {"num_replicas": N}. Answers {"goal_id": id or null when nothing changed}."""
        body = await _json_body(request, settings)
        replicas = body.get("num_replicas") if isinstance(body, dict) and set(body) == {"num_replicas"} else None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise BadRequestError('body must be {"num_replicas": N} with N >= 0, and nothing else')
        return json_response({"goal_id": await client.desired_state().scale(name, replicas)})

    @router.delete("/deployments/{name}", dependencies=guarded)
    async def delete(name: str) -> Response:
        return json_response({"goal_id": await client.desired_state().delete(name)})


def _add_endpoint_writes(
    router: APIRouter, guarded: Sequence[params.Depends], settings: Settings, client: AsyncClient
) -> None:
    @router.post("/endpoints/{name}/traffic", dependencies=guarded, openapi_extra=TRAFFIC_BODY)
    async def traffic(name: str, request: Request) -> Response:
        """Body: {"traffic": {deployment: weight}, "shadow": {deployment: fraction}} (shadow optional: kept)."""
        body = await _json_body(request, settings)
        if not isinstance(body, dict) or not isinstance(body.get("traffic"), dict) or set(body) - {"traffic", "shadow"}:
            raise BadRequestError('body must be {"traffic": {deployment: weight}, "shadow": {deployment: fraction}}')
        endpoint = await client.desired_state().set_traffic(name, body["traffic"], body.get("shadow"))
        return json_response(endpoint.model_dump(mode="json"))

    @router.delete("/endpoints/{name}", dependencies=guarded)
    async def delete_endpoint(name: str) -> Response:
        await client.desired_state().delete_endpoint(name)
        return json_response({"deleted": name})


def _add_job_writes(router: APIRouter, guard: AdminGuard, tenant_keys: TenantKeys | None, client: AsyncClient) -> None:
    @router.delete("/jobs/{job_id}")
    async def cancel_job(job_id: str, request: Request) -> Response:
        """Cancel an asynchronous job (queued: it never runs; running: its call is cancelled). Answers the job, now
        canceled; 409 once it has ended, 404 unknown or past its TTL. With the admin token, any job; with a tenant's
        API key (STREAMSERVE_TENANT_KEYS), the jobs sent with a key of that tenant (403 for another's)."""
        tenant = _key_tenant(request, tenant_keys)
        if tenant is not None:
            guard.check_site(request)  # an admin write, whose key it is: from no other site either
        else:
            try:
                guard(request)
            except UnauthorizedError as exc:
                if tenant_keys is None:
                    raise
                raise UnauthorizedError(f"{exc}; or, for a job, a tenant's API key (STREAMSERVE_TENANT_KEYS)") from None
        return json_response((await client.cancel_job(job_id, for_tenant=tenant)).to_json())


def job_reader(request: Request, guard: AdminGuard, tenant_keys: TenantKeys | None) -> str | None:
    """Whose jobs a ``GET /-/jobs/ID`` may read: None for any (no tenant keys, or the admin token), else the tenant of
    its API key; UnauthorizedError without a known key. The jobs were sent with the tenants' keys, and their results
    are theirs (the id is in access logs and Location headers)."""
    if tenant_keys is None or guard.holds_token(request.headers):
        return None
    tenant = _key_tenant(request, tenant_keys)
    if tenant is None:
        raise UnauthorizedError(
            "this gateway's jobs are read with the API key of the tenant that sent them, or the admin token: "
            "send 'Authorization: Bearer <key>'"
        )
    return tenant


def _key_tenant(request: Request, tenant_keys: TenantKeys | None) -> str | None:
    """The tenant whose API key the request's ``Authorization: Bearer`` holds, or None."""
    if tenant_keys is None:
        return None
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return tenant_keys.tenant_of(key.strip()) if scheme.lower() == "bearer" else None


def _add_goal_read(router: APIRouter, settings: Settings, client: AsyncClient) -> None:
    @router.get("/goals/{goal_id}")
    async def goal(goal_id: str, wait: float = 0.0) -> Response:
        """A goal's record; ``?wait=S`` holds the answer up to S seconds (at most 60) until it is final."""
        if not 0 <= wait <= MAX_GOAL_WAIT_S:
            raise BadRequestError(f"wait must be between 0 and {MAX_GOAL_WAIT_S:g} seconds")
        goals = GoalStore(client.redis, settings.keys)
        try:
            record = await asyncio.wait_for(goals.wait(goal_id), wait) if wait else None
        except (TimeoutError, GoalFailedError, RequestTimeoutError):
            record = None
        if record is None or record.status not in FINAL_GOAL_STATUSES:
            record = await goals.get(goal_id)
        return json_response(record.model_dump(mode="json"))


async def _json_body(request: Request, settings: Settings) -> Any:
    length = request.headers.get("content-length")
    body = await read_body(request.receive, length, settings.max_request_bytes, settings.body_timeout_s)
    body = body or b"null"
    try:
        value = orjson.loads(body)
        check_decoded(body, value)  # as a deployment's body: a config's numbers arrive as written, or not at all
        check_unique_keys(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"request body is {decode_error(body, exc)}") from None
    except ValueError as exc:
        raise BadRequestError(f"request body: {exc}") from None
    return value
