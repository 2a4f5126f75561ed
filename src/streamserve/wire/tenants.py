"""Tenants: whom a request is for, and the limits a deployment sets per tenant (docs/tenants.md).

A request names its tenant (``X-Tenant``, ``tenant=``), or belongs to DEFAULT_TENANT. A deployment's
``tenant_limits`` may bound each tenant's rate (a token bucket: ``requests_per_s``, ``burst``) and how many of its
requests the deployment holds at once (``max_queued``: queued or running). The enqueue scripts check both in the
step that queues the request (scripts._TENANT), so that gateways racing cannot overshoot them.

A tenant's count of held requests is a sorted set of tokens (Request.held), each scored by its request's deadline:
the replica removes its token when it finishes the request, the canceller when it cancels it while queued, and a
token whose deadline has passed (its request dead-lettered, or its replica gone) no longer counts.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from streamserve.wire.errors import BadRequestError, ConfigError, shown

# The tenant of a request that names none.
DEFAULT_TENANT = "default"
# A tenant name: a short identifier (it is part of Redis keys and metric labels).
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
TENANT_RULE = "1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
# An API key in the tenant keys file: what an ``Authorization: Bearer`` token may hold (RFC 6750's b64token), so that
# the key a client sends can match it byte for byte.
API_KEY_RE = re.compile(r"^[A-Za-z0-9._~+/-]+=*\Z")
# Per deployment, this many tenants get a label of their own in streamserve_tenant_requests_total; the rest count
# as OTHER_TENANTS, which no tenant can be called (a tenant name starts with a letter or digit).
TENANT_LABEL_CAP = 100
OTHER_TENANTS = "_other"
# How long a tenant refused by its limits is shown as limited (status, dashboard).
LIMITED_SHOWN_MS = 60_000


def check_tenant(name: str) -> str:
    """``name`` if it is a tenant name, else BadRequestError saying what one is."""
    if not isinstance(name, str) or not TENANT_RE.match(name):
        raise BadRequestError(f"tenant {shown(name)} is not a tenant name: {TENANT_RULE}")
    return name


def tenant_of(name: str | None) -> str:
    """A caller's ``tenant=``: None is DEFAULT_TENANT; anything else must be a tenant name (check_tenant)."""
    return DEFAULT_TENANT if name is None else check_tenant(name)


@dataclass(frozen=True)
class TenantSpec:
    """What the enqueue script checks for one request's tenant: its bucket (``rate`` tokens a second, at most
    ``burst``; rate 0: no rate limit) and its held count (at most ``max_held``; 0: no bound), the request's token
    in that count and its deadline (epoch ms)."""

    rate: float
    burst: int
    max_held: int
    token: str
    deadline_ms: int

    def encode(self) -> str:
        """The script's one ARGV for it (scripts._TENANT parses it)."""
        return f"{self.rate!r} {self.burst} {self.max_held} {self.token or '-'} {self.deadline_ms}"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class TenantKeys:
    """API keys -> tenants, from a file of ``KEY TENANT`` lines (blank lines and ``#`` comments skipped).

    Only SHA-256 digests of the keys are kept, and a key is looked up by its digest: how long a lookup takes says
    something of the digest at most, never of a key.
    """

    def __init__(self, tenants_by_digest: dict[bytes, str]) -> None:
        self._by_digest = tenants_by_digest

    @classmethod
    def parse(cls, text: str, source: str) -> TenantKeys:
        """ConfigError naming ``source`` and the line for a line that is not ``KEY TENANT``, a bad tenant name, a key
        given twice, or no key at all."""
        found: dict[bytes, str] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) > 2 and parts[2].startswith("#"):  # a comment after the key and tenant
                parts = parts[:2]
            if len(parts) != 2:
                raise ConfigError(f"{source}, line {number}: expected 'KEY TENANT', got {len(parts)} field(s)")
            key, tenant = parts
            if not TENANT_RE.match(tenant):
                raise ConfigError(
                    f"{source}, line {number}: {tenant!r} is not a tenant name (1-64 of A-Z a-z 0-9 . _ -)"
                )
            if len(key) < 16:
                raise ConfigError(f"{source}, line {number}: a key must be at least 16 characters")
            if not API_KEY_RE.match(key):
                raise ConfigError(
                    f"{source}, line {number}: a key is ASCII letters, digits and - . _ ~ + / (then = only), as a "
                    "bearer token is: no other character could ever match what a client sends"
                )
            digest = _digest(key)
            if digest in found:
                raise ConfigError(f"{source}, line {number}: this key is given twice")
            found[digest] = tenant
        if not found:
            raise ConfigError(f"{source}: no 'KEY TENANT' line: every traffic request would be refused")
        return cls(found)

    def tenant_of(self, key: str) -> str | None:
        """The tenant of API key ``key``, None for an unknown key."""
        return self._by_digest.get(_digest(key))
