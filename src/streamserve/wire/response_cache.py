"""The response cache: which requests are identical, and which replies are kept for them.

A deployment with ``response_cache`` keeps each successful reply for
``ttl_s``, under a digest of the deployment, its code version, its
``user_config``, the method and the body's JSON value (Keys.cache_entry): a
deploy that changes the code or ``user_config`` changes every digest, so it
never serves an old entry. Identical requests share one run while it is on its
way (wire/shared_runs.py): coalesced. At most ``max_entries`` replies are
kept; past it, the oldest go first (the SETTLE_RUN script, through the
deployment's cache index, Keys.cache_index).

Only a reply that went well is kept. Waiters of a run that failed get its
error all the same (the handler ran for them too), and the next request runs.
"""

from __future__ import annotations

import hashlib

import orjson

from streamserve.wire.config import DeploymentConfig
from streamserve.wire.messages import Reply, ReplyStatus
from streamserve.wire.shared_runs import RELEASE, STORE, canonical_body, stored_fields
from streamserve.wire.tenants import DEFAULT_TENANT

# The last scope digest made for each deployment, with the config it was made of: a config stays the same object
# until a deploy changes it, and hashing it again cost a cache hit a tenth of the gateway's time per request.
_SCOPES: dict[str, tuple[DeploymentConfig, bytes]] = {}


def scope_digest(cfg: DeploymentConfig) -> bytes:
    """What a deploy can change that a kept reply depends on: the deployment, its code and its ``user_config``."""
    kept = _SCOPES.get(cfg.name)
    if kept is not None and kept[0] is cfg:
        return kept[1]
    user_config = orjson.dumps(cfg.user_config, option=orjson.OPT_SORT_KEYS)
    scope = f"{cfg.name}\0{cfg.code_version()}\0".encode() + user_config
    _SCOPES[cfg.name] = (cfg, scope)
    return scope


def cache_digest(cfg: DeploymentConfig, method: str, body: bytes, model: str = "", tenant: str = DEFAULT_TENANT) -> str:
    """The digest that identical requests to ``cfg`` share (for one model: wire/models.py; of one tenant: a tenant
    never gets a reply kept for another, nor learns that another asked)."""
    scope = scope_digest(cfg) + (b"\0model\0" + model.encode() if model else b"")
    if tenant != DEFAULT_TENANT:
        scope += b"\0tenant\0" + tenant.encode()
    return hashlib.sha256(scope + b"\0" + method.encode() + b"\0" + canonical_body(body)).hexdigest()[:32]


def settlement(reply: Reply, kept: bool) -> tuple[str, list[str | bytes]]:
    """How an identical requests' run that ended with ``reply`` is settled: (STORE, the entry's fields and values)
    for a result to keep, else (RELEASE, []). ``kept``: the replica serves the code and ``user_config`` the
    request's digest names (during a deploy it may not)."""
    if reply.status is ReplyStatus.OK and kept:
        return STORE, stored_fields(reply)
    return RELEASE, []
