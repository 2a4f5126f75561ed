"""The user's config file: deployments and endpoints, validated with clear errors."""

from __future__ import annotations

import difflib
import hashlib
import math
import re
import secrets
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, get_args

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from streamserve.wire import json_values
from streamserve.wire.errors import BadRequestError, ConfigError, NotFoundError, ProtocolError, shown
from streamserve.wire.limits import DEFAULT_LIMITS, ConfigLimits, at_most, limits_context, write_limits
from streamserve.wire.tenants import DEFAULT_TENANT, TENANT_RE, TenantSpec
from streamserve.wire.yaml_text import load_yaml

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")
# The gateway's own paths: admin API, status, jobs, docs.
GATEWAY_PREFIX = "/-/"
RESERVED_ROUTE_PREFIXES = (GATEWAY_PREFIX, "/metrics")
# The longest request timeout (a week): past any call's sensible bound, and within what RQ's job timer holds. Every
# other duration in a config (drain, health checks, autoscaling delays) is at most this too.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# A route_prefix: at most this long, "/" or "/"-separated segments of these characters (unreserved in URLs, RFC 3986),
# none of them "." or "..": no space, control character, quote, markup or bidi override to reach a log, a terminal
# or a page, and no path a client or proxy would normalise into another.
MAX_ROUTE_PREFIX_CHARS = 256
ROUTE_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._~-]+\Z")


def _at_most_a_week(value: float, info: ValidationInfo) -> float:
    """A field validator for a duration written in a config: at most MAX_TIMEOUT_S."""
    if write_limits(info) is not None and value > MAX_TIMEOUT_S:
        raise ValueError(f"{value:g} s is more than a week ({MAX_TIMEOUT_S:g} s), the longest a duration may be")
    return value


# A traffic or shadow share: a number (a YAML `true` or "0.5" is an error, not 1.0 or 0.5).
Weight = Annotated[float, Strict()]


class _Strict(BaseModel):
    # Infinity and NaN have no JSON form (they would be stored as null and fail to load back).
    # Defaults are validated too: a maximum lowered below a default (limits.ConfigLimits) holds for it as well.
    # Numbers are strict (each number field says strict=True): `num_replicas: true` or "4" is an error, not 1 or 4.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, validate_default=True)


def named(name: object, what: str = "deployment or endpoint") -> str:
    """``name`` as a caller gave it for a ``what`` to call or change: BadRequestError unless it is a string,
    NotFoundError when no ``what`` could be so named (nor could Redis be asked: it may not even be UTF-8)."""
    if not isinstance(name, str):
        raise BadRequestError(f"a {what}'s name is a string, got {shown(name)}")
    if not NAME_RE.match(name):
        raise NotFoundError(f"no {what} named {name!r}")
    return name


def check_name(value: str) -> str:
    """A deployment's or endpoint's name as given; ValueError saying what a name is unless it is one."""
    if not NAME_RE.match(value):
        raise ValueError(f"{value!r} is not a valid name: use 1-63 of a-z 0-9 _ - starting with a letter or digit")
    return value


def _check_route_prefix(value: str | None, info: ValidationInfo) -> str | None:
    if value is None:
        return None
    if not value.startswith("/"):
        raise ValueError(f"{value!r} must start with '/'")
    if len(value) > 1 and value.endswith("/"):
        raise ValueError(f"{value!r} must not end with '/'")
    if any(value == p.rstrip("/") or value.startswith(p) for p in RESERVED_ROUTE_PREFIXES):
        raise ValueError(
            f"{value!r} is reserved for the gateway's own routes (a deployment's route is /<its name> unless it sets "
            "route_prefix: set another, or null to reach it from the client only)"
        )
    if write_limits(info) is not None:
        _check_route_characters(value)
    return value


def _check_route_characters(value: str) -> None:
    """A route_prefix being written: a URL path of safe characters (see ROUTE_SEGMENT_RE)."""
    if len(value) > MAX_ROUTE_PREFIX_CHARS:
        raise ValueError(f"is {len(value)} characters long; at most {MAX_ROUTE_PREFIX_CHARS}")
    if value == "/":
        return
    for segment in value[1:].split("/"):
        if not segment:
            raise ValueError(f"{value!r} has an empty segment ('//')")
        if segment in (".", ".."):
            raise ValueError(f"{value!r} has a {segment!r} segment, which clients and proxies resolve away")
        if not ROUTE_SEGMENT_RE.match(segment):
            raise ValueError(
                f"{value!r} holds a character a route may not: use '/'-separated segments of letters, digits "
                "and . _ ~ - (no spaces, control characters, quotes, '%' or non-ASCII)"
            )


def _default_route_prefix(cls: type[BaseModel], data: Any) -> Any:
    """An absent route_prefix means "/<name>"; an explicit null means "reachable from the client only"."""
    if isinstance(data, dict) and "route_prefix" not in data and isinstance(data.get("name"), str):
        data = {**data, "route_prefix": "/" + data["name"]}
    return data


class AutoscalingConfig(_Strict):
    """Queue-based autoscaling: ongoing requests (queued + in flight) per replica."""

    min_replicas: int = Field(1, ge=0, strict=True)
    max_replicas: int = Field(1, ge=1, strict=True)
    target_ongoing_requests: float = Field(2.0, gt=0, strict=True)
    upscale_delay_s: float = Field(30.0, ge=0, strict=True)
    downscale_delay_s: float = Field(600.0, ge=0, strict=True)

    _replicas = field_validator("min_replicas", "max_replicas")(at_most("num_replicas"))
    _target = field_validator("target_ongoing_requests")(at_most("max_ongoing_requests"))
    _delays = field_validator("upscale_delay_s", "downscale_delay_s")(_at_most_a_week)

    def first_count(self, active: int) -> int:
        """The count autoscaling starts from, turned on with ``active`` replicas: what runs, within the bounds (so
        nothing is stopped or started for turning it on)."""
        return min(max(active, self.min_replicas), self.max_replicas)

    @model_validator(mode="after")
    def _min_le_max(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        return self


# A Kubernetes memory quantity: bytes, or a number with a decimal (k, M, G, T) or binary (Ki, Mi, Gi, Ti) suffix.
MEMORY_RE = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[kMGT]i?|Ki)?\Z")
MEMORY_UNITS = {
    None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


class Resources(_Strict):
    """What one replica needs: CPU cores, whole GPUs, memory (``2Gi``, ``512Mi``, or bytes).

    Locally, GPUs are handed out per replica (CUDA_VISIBLE_DEVICES); on
    Kubernetes all three become the pod's requests and limits.
    """

    cpus: float = Field(0.0, ge=0, strict=True)
    gpus: int = Field(0, ge=0, strict=True)
    memory: str | int | None = None

    _cpus = field_validator("cpus")(at_most("cpus"))
    _gpus = field_validator("gpus")(at_most("gpus"))

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | int | None, info: ValidationInfo) -> str | int | None:
        if value is None:
            return None
        if isinstance(value, bool) or (isinstance(value, int) and value <= 0):
            raise ValueError(f"{value!r} is not a memory size: use bytes (> 0) or e.g. '512Mi', '2Gi'")
        if isinstance(value, str) and (not MEMORY_RE.match(value) or memory_bytes(value) <= 0):
            raise ValueError(f"{value!r} is not a memory size: use bytes (> 0) or e.g. '512Mi', '2Gi'")
        limits = write_limits(info)
        size = memory_bytes(value)
        shown = f"{size} bytes" if isinstance(value, int) else f"{value!r} ({size} bytes)"
        if limits is not None and (problem := limits.problem("memory", size, shown)):
            raise ValueError(problem)
        return value

    @property
    def memory_bytes(self) -> int:
        """The memory asked for in bytes (0: none)."""
        return 0 if self.memory is None else memory_bytes(self.memory)

    @property
    def is_empty(self) -> bool:
        return self == Resources()


def memory_bytes(value: str | int) -> int:
    """``"2Gi"`` -> 2147483648; a plain int is bytes already."""
    if isinstance(value, int):
        return value
    match = MEMORY_RE.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a memory size")
    # Exact, and for any length of number: through a float, "1e400" digits would be infinity (and int() of it fail).
    return int(Decimal(match["number"]) * MEMORY_UNITS[match["unit"]])


class ResponseCacheConfig(_Strict):
    """Keep successful replies for identical requests (docs/retries-and-caching.md)."""

    # How long a reply is kept.
    ttl_s: float = Field(300.0, gt=0, strict=True)
    # The most replies kept at once; past it, the oldest go first.
    max_entries: int = Field(10_000, ge=1, strict=True)
    # How long a gateway or client that read a kept reply answers identical requests from its own copy, without
    # Redis (never past the reply's ttl_s); 0: every hit asks Redis (client/hot_entries.py). Callers only read it:
    # changing it restarts no replica.
    local_ttl_s: float = Field(1.0, ge=0, le=60, strict=True)

    _ttl = field_validator("ttl_s")(_at_most_a_week)
    _entries = field_validator("max_entries")(at_most("cache_entries"))


class TenantLimitConfig(_Strict):
    """One tenant's limits on a deployment (docs/tenants.md); each is off when unset."""

    # A token bucket: this many requests a second on average...
    requests_per_s: float | None = Field(None, gt=0, le=1_000_000, strict=True)
    # ...and this many at once after a quiet spell (default: requests_per_s, at least 1).
    burst: int | None = Field(None, ge=1, le=1_000_000, strict=True)
    # The most requests of the tenant the deployment holds at once, queued or running.
    max_queued: int | None = Field(None, ge=1, strict=True)

    _held = field_validator("max_queued")(at_most("max_queued_requests"))

    @model_validator(mode="after")
    def _burst_needs_a_rate(self) -> TenantLimitConfig:
        if self.burst is not None and self.requests_per_s is None:
            raise ValueError("burst is the size of a rate limit's bucket: set requests_per_s too")
        return self

    def spec(self, deadline_ms: int) -> TenantSpec:
        """What the enqueue script checks for a request of this tenant with deadline ``deadline_ms``."""
        rate = self.requests_per_s or 0.0
        burst = self.burst if self.burst is not None else max(1, math.ceil(rate))
        token = secrets.token_hex(8) if self.max_queued else ""
        return TenantSpec(rate, burst, self.max_queued or 0, token, deadline_ms)


def _check_tenant_names(value: dict[str, TenantLimitConfig]) -> dict[str, TenantLimitConfig]:
    for name in value:
        if not TENANT_RE.match(name):
            raise ValueError(
                f"{name!r} is not a tenant name: 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
            )
    return value


class DeploymentConfig(_Strict):
    """One deployment: a function or class served by N replica processes."""

    name: str
    import_path: str
    init_args: list[Any] = Field(default_factory=list)
    init_kwargs: dict[str, Any] = Field(default_factory=dict)
    num_replicas: int | None = Field(None, ge=0, strict=True)
    autoscaling_config: AutoscalingConfig | None = None
    max_ongoing_requests: int = Field(8, ge=1, strict=True)
    max_queued_requests: int = Field(1000, ge=1, strict=True)
    # Asynchronous jobs of this deployment accepted and not finished (queued or running); past it, 503 at once.
    max_queued_jobs: int = Field(1000, ge=1, strict=True)
    max_delivery_attempts: int = Field(3, ge=1, strict=True)
    user_config: Any = None
    version: str | None = None
    route_prefix: str | None = None
    request_timeout_s: float = Field(30.0, gt=0, le=MAX_TIMEOUT_S, strict=True)
    graceful_shutdown_timeout_s: float = Field(20.0, ge=0, strict=True)
    # How often a replica calls the deployment's check_health() (when it has one), and how long one call may take
    # before the replica counts it as failed; a replica whose check fails is replaced.
    health_check_period_s: float = Field(10.0, gt=0, strict=True)
    health_check_timeout_s: float = Field(30.0, gt=0, strict=True)
    max_response_bytes: int = Field(16 * 1024 * 1024, ge=1, strict=True)
    # A streaming handler is paused once this many of its chunks are ahead of what its caller has taken.
    max_unread_chunks: int = Field(64, ge=1, strict=True)
    # How long the reply to a request with an idempotency key is kept for the retries that send the key again.
    idempotency_ttl_s: float = Field(86_400.0, gt=0, strict=True)
    # Answer identical requests from a kept reply, and run identical requests in flight at once only once.
    response_cache: ResponseCacheConfig | None = None
    # Limits per tenant, by tenant name; ``default`` applies to every tenant not named (docs/tenants.md).
    tenant_limits: dict[str, TenantLimitConfig] = Field(default_factory=dict)
    # Replicas are started by someone else (Kubernetes, KEDA, systemd, a person): every worker that heartbeats counts.
    external_scaler_enabled: bool = False
    resources: Resources = Field(default_factory=Resources)

    _default_route = model_validator(mode="before")(_default_route_prefix)
    _name = field_validator("name")(check_name)
    _route = field_validator("route_prefix")(_check_route_prefix)
    _replicas = field_validator("num_replicas")(at_most("num_replicas"))
    _ongoing = field_validator("max_ongoing_requests")(at_most("max_ongoing_requests"))
    _queued = field_validator("max_queued_requests")(at_most("max_queued_requests"))
    _jobs = field_validator("max_queued_jobs")(at_most("max_queued_jobs"))
    _attempts = field_validator("max_delivery_attempts")(at_most("max_delivery_attempts"))
    _response = field_validator("max_response_bytes")(at_most("max_response_bytes"))
    _unread = field_validator("max_unread_chunks")(at_most("max_unread_chunks"))
    _tenants = field_validator("tenant_limits")(_check_tenant_names)
    _durations = field_validator(
        "graceful_shutdown_timeout_s", "health_check_period_s", "health_check_timeout_s", "idempotency_ttl_s"
    )(_at_most_a_week)

    @field_validator("import_path")
    @classmethod
    def _import_path(cls, value: str) -> str:
        module, sep, attr = value.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"{value!r} must look like 'package.module:attribute'")
        return value

    @model_validator(mode="after")
    def _one_way_to_scale(self) -> DeploymentConfig:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set num_replicas or autoscaling_config, not both")
        if self.external_scaler_enabled and (self.num_replicas is not None or self.autoscaling_config is not None):
            raise ValueError(
                "external_scaler_enabled: its replicas are started outside streamserve (Kubernetes, KEDA, systemd), "
                "so it takes neither num_replicas nor autoscaling_config"
            )
        return self

    @model_validator(mode="after")
    def _fits_in_json(self, info: ValidationInfo) -> DeploymentConfig:
        """Being written: storable as JSON (integers within 64 bits, nesting orjson encodes), and not too large."""
        limits = write_limits(info)
        if limits is None:
            return self
        for name in ("init_args", "init_kwargs", "user_config"):
            if (problem := json_values.config_value_problem(getattr(self, name))) is not None:
                raise ValueError(f"{name}: {problem}")
        try:
            size = len(self.to_json())
        except orjson.JSONEncodeError as exc:
            raise ValueError(f"init_args, init_kwargs or user_config cannot be stored as JSON: {exc}") from None
        if problem := limits.problem("config_bytes", size, f"{size} bytes"):
            raise ValueError(f"the deployment as JSON (init_args, init_kwargs, user_config...): {problem}")
        return self

    def wanted_replicas(self, autoscaled: int | None = None, live: int = 0) -> int:
        """How many replicas to keep: the one place this rule is written.

        Externally scaled: however many are ``live`` (someone else decides).
        Autoscaled: the autoscaler's latest count (``autoscaled``), or
        ``min_replicas`` before it has decided. Otherwise ``num_replicas``
        (default 1); ``autoscaled`` is ignored then, since a stale autoscaling
        record may outlive a switch to a fixed count.
        """
        if self.external_scaler_enabled:
            return live
        if self.autoscaling_config is not None:
            return self.autoscaling_config.min_replicas if autoscaled is None else autoscaled
        return 1 if self.num_replicas is None else self.num_replicas

    def tenant_limit(self, tenant: str) -> TenantLimitConfig | None:
        """The limits of ``tenant``: its own, else ``default``'s, else None (unlimited)."""
        limits = self.tenant_limits
        return limits.get(tenant) or limits.get(DEFAULT_TENANT) if limits else None

    def code_version(self) -> str:
        """A digest of what needs a restart to change: import path, init args, version, resources, response cache,
        and whether there is a user_config (a reconfigure() cannot be undone: a replica that ran one and is left with
        none would differ from one that starts without, which never calls it)."""
        parts: list[Any] = [self.import_path, self.init_args, self.init_kwargs, self.version]
        if not self.resources.is_empty:  # left out when unset, so older deployments keep their digest
            parts.append(self.resources.model_dump(mode="json"))
        if self.user_config is not None:
            parts.append("user_config")
        if self.response_cache is not None:  # a replica checks at load that its handlers do not stream
            parts.append({"response_cache": self.response_cache.model_dump(mode="json", exclude={"local_ttl_s"})})
        code = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(code).hexdigest()[:12]

    def user_config_digest(self) -> str:
        """A digest of ``user_config``: which one a replica runs with, or refused (its heartbeat says)."""
        return hashlib.sha256(orjson.dumps(self.user_config, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | str) -> DeploymentConfig:
        """A stored config; ProtocolError if it is not one (written by hand, or by another version)."""
        try:
            return cls.model_validate(orjson.loads(raw), context=limits_context(None))
        except ValueError as exc:
            raise ProtocolError(f"stored deployment config is unreadable: {exc}") from exc


class EndpointConfig(_Strict):
    """A name and route that split traffic between deployments by weight, and mirror a share to shadows.

    Weights are relative (0.9/0.1 and 9/1 split alike); a shadow fraction is
    the probability that a request is also copied to that deployment, whose
    reply is dropped.
    """

    name: str
    route_prefix: str | None = None
    traffic: dict[str, Weight]
    shadow: dict[str, Weight] = Field(default_factory=dict)

    _default_route = model_validator(mode="before")(_default_route_prefix)
    _name = field_validator("name")(check_name)
    _route = field_validator("route_prefix")(_check_route_prefix)

    @field_validator("traffic")
    @classmethod
    def _weights(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        check_names_at_most(value, info)
        if not value:
            raise ValueError("needs at least one deployment")
        total = sum(value.values())
        if any(not math.isfinite(w) or w < 0 for w in value.values()) or not 0 < total < math.inf:
            raise ValueError("weights must be finite, >= 0 and add up to more than 0 (and less than infinity)")
        return value

    @field_validator("shadow")
    @classmethod
    def _fractions(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        check_names_at_most(value, info)
        if any(not 0 <= f <= 1 for f in value.values()):
            raise ValueError("shadow fractions must be between 0 and 1")
        return value

    @property
    def deployments(self) -> set[str]:
        """Every deployment this endpoint sends to, live or shadow."""
        return set(self.traffic) | set(self.shadow)

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, raw: bytes | str) -> EndpointConfig:
        """A stored endpoint; ProtocolError if it is not one."""
        try:
            return cls.model_validate(orjson.loads(raw), context=limits_context(None))
        except ValueError as exc:
            raise ProtocolError(f"stored endpoint config is unreadable: {exc}") from exc


class AppConfig(_Strict):
    """A whole config file."""

    deployments: list[DeploymentConfig] = Field(default_factory=list)
    endpoints: list[EndpointConfig] = Field(default_factory=list)

    @field_validator("deployments", "endpoints", mode="before")
    @classmethod
    def _not_too_many(cls, value: Any, info: ValidationInfo) -> Any:
        """Counted before each one is checked: ten million deployments are refused at once, not one by one."""
        limits = write_limits(info)
        field = str(info.field_name)
        if isinstance(value, list) and limits is not None and (problem := limits.problem(field, len(value))):
            raise ValueError(problem)  # (pydantic names the field: "deployments: 4 is above the maximum, 3")
        return value

    @model_validator(mode="after")
    def _unique(self) -> AppConfig:
        names = [d.name for d in self.deployments] + [e.name for e in self.endpoints]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"names used more than once: {', '.join(dupes)}")
        routes = [d.route_prefix for d in self.deployments] + [e.route_prefix for e in self.endpoints]
        taken = sorted({r for r in routes if r is not None and routes.count(r) > 1})
        if taken:
            raise ValueError(f"route_prefix used more than once: {', '.join(taken)}")
        return self


def desired_state_problems(
    deployments: Mapping[str, DeploymentConfig], endpoints: Mapping[str, EndpointConfig]
) -> list[str]:
    """What is wrong with a whole desired state, one line per problem (empty: it hangs together).

    Deployments and endpoints share one name space (a caller names either)
    and one route table, and an endpoint may only send to deployments that
    exist. Writers check the state they would leave behind, so a later write
    cannot break an earlier one.
    """
    problems = [
        f"{name!r} names both a deployment and an endpoint" for name in sorted(set(deployments) & set(endpoints))
    ]
    owners: dict[str, list[str]] = {}
    routed = [("deployment", n, d.route_prefix) for n, d in sorted(deployments.items())]
    routed += [("endpoint", n, e.route_prefix) for n, e in sorted(endpoints.items())]
    for kind, name, route in routed:
        if route is not None:
            owners.setdefault(route, []).append(f"{kind} {name!r}")
    problems += [
        f"route_prefix {route} is used by {' and '.join(who)}" for route, who in owners.items() if len(who) > 1
    ]
    for name, endpoint in sorted(endpoints.items()):
        missing = sorted(endpoint.deployments - set(deployments))
        if missing:
            which = "which is not a deployment" if len(missing) == 1 else "which are not deployments"
            problems.append(f"endpoint {name!r} sends to {', '.join(map(repr, missing))}, {which}")
    return problems


def check_names_at_most(weights: dict[str, float], info: ValidationInfo) -> None:
    """An endpoint's traffic or shadow: deployment names, no more of them than a farm may have deployments."""
    limits = write_limits(info)
    if limits is not None and (problem := limits.problem("deployments", len(weights), f"{len(weights)} names")):
        raise ValueError(problem)
    for name in weights:
        check_name(name)


def _describe_location(loc: tuple[int | str, ...], data: Any) -> str:
    """('deployments', 0, 'num_replicas') -> "deployment 'echo' (deployments[0]): num_replicas"."""
    if len(loc) >= 2 and loc[0] in ("deployments", "endpoints") and isinstance(loc[1], int):
        kind = str(loc[0])[:-1]
        try:
            name = data[loc[0]][loc[1]].get("name")
        except (KeyError, IndexError, TypeError, AttributeError):
            name = None
        where = f"{kind} {name!r} ({loc[0]}[{loc[1]}])" if isinstance(name, str) else f"{loc[0]}[{loc[1]}]"
        rest = ".".join(str(p) for p in loc[2:])
        return f"{where}: {rest}" if rest else where
    return ".".join(str(p) for p in loc) or "(top level)"


def format_validation_error(exc: ValidationError, data: Any) -> str:
    """One line per problem (the first MAX_PROBLEMS_SHOWN), naming the deployment and the field."""
    lines = []
    errors = exc.errors()
    for err in errors[:MAX_PROBLEMS_SHOWN]:
        where = _describe_location(tuple(err["loc"]), data)
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field" + _did_you_mean(exc.title, tuple(err["loc"]))
        elif err["type"] == "model_type":  # (not "... or instance of ResponseCacheConfig": a class name of ours)
            message = "Input should be a mapping"
        elif err["type"] in ("float_type", "int_type") and _number_as_text(err["input"]):
            written = "1.0e3, or 1000" if err["type"] == "float_type" else "1000"
            message += (
                f", got the text {err['input']!r} (YAML reads a number in e-notation without a dot, such as 1e3,"
                f" as text: write {written})"
            )
        lines.append(f"{where}: {message}")
    if len(errors) > MAX_PROBLEMS_SHOWN:
        lines.append(f"... and {len(errors) - MAX_PROBLEMS_SHOWN} more problems")
    return "\n".join(lines)


def _did_you_mean(title: str, loc: tuple[int | str, ...]) -> str:
    """ " (did you mean 'tenant_limits'?)" for a misspelt field name at ``loc`` of a ``title`` model's input (a
    field of the mapping it is in, not of another); "" when none is close."""
    model = _model_at(title, loc[:-1])
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), sorted(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_at(title: str, path: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The config model that reads the mapping at ``path`` of a ``title`` model's input (list indices and mapping
    keys step into the model of the field that holds them); None when it is none of them."""
    model = next((m for m in _CONFIG_MODELS if m.__name__ == title), None)
    for part in path:
        if model is None:
            return None
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is not None:
            inner = _models_in(field.annotation)
            model = inner[0] if len(inner) == 1 else None
    return model


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models a field's type holds (``list[DeploymentConfig] | None``: DeploymentConfig)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


# What PyYAML (YAML 1.1) leaves as text though a reader takes it for a number: e-notation without a dot.
_E_NOTATION_TEXT = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def _number_as_text(value: Any) -> bool:
    """Whether ``value`` is a string YAML left as text though it reads as a number (``1e3``)."""
    return isinstance(value, str) and _E_NOTATION_TEXT.fullmatch(value) is not None


# How many of a config's problems an error lists (a mapping of 200,000 unknown fields took 25 s to describe).
MAX_PROBLEMS_SHOWN = 20
# Every model a config file's mappings are read as (for a misspelt field's "did you mean").
_CONFIG_MODELS: tuple[type[BaseModel], ...] = (
    AppConfig,
    DeploymentConfig,
    EndpointConfig,
    AutoscalingConfig,
    Resources,
    ResponseCacheConfig,
    TenantLimitConfig,
)


def parse_config(data: Any, source: str = "config", limits: ConfigLimits = DEFAULT_LIMITS) -> AppConfig:
    """Validate an already-loaded config mapping, its counts and sizes against ``limits``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with 'deployments' (and optionally 'endpoints')")
    try:
        return AppConfig.model_validate(data, context=limits_context(limits))
    except ValidationError as exc:
        raise ConfigError(f"{source}:\n{format_validation_error(exc, data)}") from exc


def load_config(path: str | Path, limits: ConfigLimits = DEFAULT_LIMITS) -> AppConfig:
    """Read and validate a YAML config file; ConfigError says which field of which deployment is wrong."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text (YAML is): byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
        ) from None
    data = load_yaml(text, str(path), limits)
    if isinstance(data, dict):  # a top-level x- key is a place for YAML anchors (as in a Compose file): not config
        data = {key: value for key, value in data.items() if not (isinstance(key, str) and key.startswith("x-"))}
    return parse_config(data, str(path), limits)
