"""What the enqueue scripts get for a request's tenant limits (wire/tenants.py), and what their refusal means."""

from __future__ import annotations

from typing import Any

from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import RateLimitedError
from streamserve.wire.keys import Keys
from streamserve.wire.messages import Request, text


def tenant_terms(keys: Keys, cfg: DeploymentConfig, request: Request) -> tuple[str, list[str]]:
    """The tenant spec the enqueue script checks (ARGV) and the keys it names for it, ``("", [])`` when the request's
    tenant has no limits on ``cfg``; sets ``request.held``, its token in its tenant's count."""
    limit = cfg.tenant_limit(request.tenant)
    if limit is None:
        request.held = ""
        return "", []
    spec = limit.spec(request.deadline_ms)
    request.held = spec.token
    name, tenant = cfg.name, request.tenant
    tenant_keys = [keys.tenant_bucket(name, tenant), keys.tenant_held(name, tenant), keys.limited_tenants(name)]
    return f"{spec.encode()} {tenant}", tenant_keys


def refusal(found: list[Any], cfg: DeploymentConfig, request: Request) -> RateLimitedError:
    """The error for an enqueue script's refusal: ``['rate', ms until a token]`` or ``['tenant_full']``."""
    limit = cfg.tenant_limit(request.tenant)
    if text(found[0]) == "rate":
        wait_s = int(found[1]) / 1000
        rate = (limit.requests_per_s if limit is not None else None) or 0.0
        return RateLimitedError(
            f"tenant {request.tenant!r} is over its rate on deployment {cfg.name!r} (requests_per_s {rate:g}): "
            f"the next request is admitted in {wait_s:.3f}s",
            retry_after_s=wait_s,
        )
    held = limit.max_queued if limit is not None else None
    return RateLimitedError(
        f"tenant {request.tenant!r} has reached its max_queued of {held} {'request' if held == 1 else 'requests'}"
        f" queued or running on deployment {cfg.name!r}",
        retry_after_s=1.0,
    )
