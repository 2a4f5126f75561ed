"""The desired state: the deployments and endpoints hashes, read and written only through ``DesiredState``.

Writes are idempotent: applying a config equal to what is stored changes
nothing and publishes nothing. A write that changes a deployment creates its
goal in the same transaction (``goals.GoalStore``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import WatchError

from streamserve.control.goal_records import GoalStore, new_goal
from streamserve.control.long_poll import announce, bump_snapshot_id
from streamserve.control.security import ImportAllowList
from streamserve.transport.redis_checks import read_maxmemory
from streamserve.wire.config import (
    AppConfig,
    DeploymentConfig,
    EndpointConfig,
    desired_state_problems,
    format_validation_error,
)
from streamserve.wire.errors import ConfigError, ConflictError, NotFoundError
from streamserve.wire.keys import ConfigKey, Keys
from streamserve.wire.limits import DEFAULT_LIMITS, ConfigLimits, limits_context
from streamserve.wire.messages import now_ms, text

logger = logging.getLogger(__name__)

# A deployment's max_response_bytes may be at most 1/MAX_RESPONSE_SHARE of Redis's maxmemory. A reply passes through
# Redis whole; one that does not fit is refused, and while its bytes arrive (and for up to a second after, until
# Redis frees the buffer they came in) every other write is refused too: heartbeats, replies, new requests.
MAX_RESPONSE_SHARE = 10


@dataclass(frozen=True)
class DesiredChange:
    """One atomic write to the desired state: upserts and deletions of deployments and endpoints."""

    deployments: dict[str, DeploymentConfig] = field(default_factory=dict)
    endpoints: dict[str, EndpointConfig] = field(default_factory=dict)
    delete_deployments: tuple[str, ...] = ()
    delete_endpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stored:
    """The desired state as read inside a write's transaction."""

    deployments: Mapping[Any, Any]  # name -> config JSON, as redis-py returns them (bytes)
    endpoints: Mapping[Any, Any]


@dataclass(frozen=True)
class Diff:
    """What a change would actually alter in what is stored; empty when the change is a no-op."""

    deployments_changed: list[str]
    deployments_removed: list[str]
    endpoints_changed: list[str]
    endpoints_removed: list[str]

    @classmethod
    def between(cls, stored: Stored, change: DesiredChange) -> Diff:
        return cls(
            deployments_changed=[
                n for n, cfg in change.deployments.items() if stored.deployments.get(n.encode()) != cfg.to_json()
            ],
            deployments_removed=[n for n in change.delete_deployments if n.encode() in stored.deployments],
            endpoints_changed=[
                n for n, e in change.endpoints.items() if stored.endpoints.get(n.encode()) != e.to_json()
            ],
            endpoints_removed=[n for n in change.delete_endpoints if n.encode() in stored.endpoints],
        )

    def __bool__(self) -> bool:
        return bool(
            self.deployments_changed or self.deployments_removed or self.endpoints_changed or self.endpoints_removed
        )


@dataclass(frozen=True)
class Applied:
    """What a write changed: a goal per changed or deleted deployment, and the endpoints written."""

    goals: dict[str, str] = field(default_factory=dict)
    endpoints: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.goals or self.endpoints)


def parse_endpoint(data: dict[str, Any]) -> EndpointConfig:
    """Validate one endpoint given outside a config file (CLI, admin API); ConfigError names the field."""
    try:
        return EndpointConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"endpoint {data.get('name')!r}: {format_validation_error(exc, data)}") from exc


def check_consistent(stored: Stored, change: DesiredChange, diff: Diff, limits: ConfigLimits = DEFAULT_LIMITS) -> None:
    """Refuse a change that would leave the desired state inconsistent (see config.desired_state_problems), or
    holding more deployments or endpoints than ``limits`` allow.

    Only problems the change adds count, so a state that was already broken
    can still be mended one write at a time.
    """
    before_d = {text(k): DeploymentConfig.from_json(v) for k, v in stored.deployments.items()}
    before_e = {text(k): EndpointConfig.from_json(v) for k, v in stored.endpoints.items()}
    after_d = {**before_d, **change.deployments}
    after_e = {**before_e, **change.endpoints}
    for name in change.delete_deployments:
        after_d.pop(name, None)
    for name in change.delete_endpoints:
        after_e.pop(name, None)
    for name in diff.deployments_removed:
        users = sorted(e.name for e in after_e.values() if name in e.deployments)
        if users:
            raise ConflictError(
                f"cannot delete deployment {name!r}: endpoint {', '.join(map(repr, users))} still sends traffic to "
                "it; change that endpoint's traffic (streamserve traffic) or delete the endpoint first"
            )
    new = [p for p in desired_state_problems(after_d, after_e) if p not in desired_state_problems(before_d, before_e)]
    for kind, before, after in (("deployments", before_d, after_d), ("endpoints", before_e, after_e)):
        problem = limits.problem(kind, len(after))
        if len(after) > len(before) and problem:
            new.append(f"the farm would hold {len(after)} {kind}: {problem}")
    if new:
        raise ConfigError("; ".join(new))


def _stored_deployment(stored: Stored, name: str) -> DeploymentConfig:
    """Deployment ``name`` as a write's transaction read it; NotFoundError without one."""
    return _deployment_from(stored.deployments.get(name.encode()), name)


def _deployment_from(raw: bytes | str | None, name: str) -> DeploymentConfig:
    """Deployment ``name`` from its stored JSON; NotFoundError when there is none."""
    if raw is None:
        raise NotFoundError(f"no deployment named {name!r}")
    return DeploymentConfig.from_json(raw)


def response_limit_problem(cfg: DeploymentConfig, maxmemory: int) -> str:
    """Why ``cfg``'s max_response_bytes is too large for a Redis of ``maxmemory`` bytes ("" when it is not)."""
    allowed = maxmemory // MAX_RESPONSE_SHARE
    if cfg.max_response_bytes <= allowed:
        return ""
    return (
        f"deployment {cfg.name!r}: max_response_bytes ({cfg.max_response_bytes} bytes) is more than "
        f"1/{MAX_RESPONSE_SHARE} of Redis's maxmemory ({maxmemory} bytes), so one reply could fill Redis and have "
        "every other write refused (heartbeats, replies, new requests); "
        f"set max_response_bytes to {allowed} or less, or give Redis more memory"
    )


def _response_limit_moved(stored: Stored, cfg: DeploymentConfig) -> bool:
    """Whether ``cfg`` is new, or changes its deployment's max_response_bytes."""
    raw = stored.deployments.get(cfg.name.encode())
    return raw is None or DeploymentConfig.from_json(raw).max_response_bytes != cfg.max_response_bytes


class DesiredState:
    """Reads and writes the desired deployments and endpoints (CLI, clients, admin API, scheduler, replicas)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        import_allow: ImportAllowList | None = None,
        limits: ConfigLimits = DEFAULT_LIMITS,
        written: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``import_allow``: writes of deployments importing from elsewhere are refused (ConfigError); ``limits``:
        the counts and sizes a write may ask for (a scale, and how many deployments and endpoints the farm holds);
        ``written``: awaited after each write that changed something (a client's routes catch up with it)."""
        self._redis = redis
        self._keys = keys
        self._goals = GoalStore(redis, keys)
        self._import_allow = import_allow or ImportAllowList()
        self._limits = limits
        self._written = written

    async def deployments(self) -> dict[str, DeploymentConfig]:
        """Every desired deployment, by name."""
        raw = await self._redis.hgetall(self._keys.deployments())
        return {text(k): DeploymentConfig.from_json(v) for k, v in raw.items()}

    async def get(self, name: str) -> DeploymentConfig:
        return _deployment_from(await self._redis.hget(self._keys.deployments(), name), name)

    async def endpoints(self) -> dict[str, EndpointConfig]:
        """Every endpoint, by name."""
        raw = await self._redis.hgetall(self._keys.endpoints())
        return {text(k): EndpointConfig.from_json(v) for k, v in raw.items()}

    async def find(self, name: str) -> tuple[DeploymentConfig | None, EndpointConfig | None]:
        """The deployment and the endpoint called ``name`` (either may be None), in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(self._keys.deployments(), name)
            pipe.hget(self._keys.endpoints(), name)
            deployment, endpoint = await pipe.execute()
        return (
            None if deployment is None else DeploymentConfig.from_json(deployment),
            None if endpoint is None else EndpointConfig.from_json(endpoint),
        )

    async def get_many(self, names: list[str]) -> dict[str, DeploymentConfig]:
        """The deployments that exist among ``names``."""
        found = await self._redis.hmget(self._keys.deployments(), names) if names else []
        return {n: DeploymentConfig.from_json(raw) for n, raw in zip(names, found, strict=True) if raw is not None}

    async def apply(self, app: AppConfig) -> Applied:
        """Upsert every deployment and endpoint in ``app``; goals for the deployments whose config changed."""
        change = DesiredChange(
            deployments={d.name: d for d in app.deployments}, endpoints={e.name: e for e in app.endpoints}
        )
        return await self._write(change, kind="apply")

    async def scale(self, name: str, num_replicas: int) -> str | None:
        """Set a fixed replica count (turning autoscaling off); the goal id, or None if nothing changed."""

        def scaled(stored: Stored) -> DesiredChange:
            current = _stored_deployment(stored, name)
            if current.external_scaler_enabled:
                raise ConflictError(
                    f"deployment {name!r} is scaled externally (external_scaler_enabled: true): its replicas are the "
                    "workers someone else runs, so scale it there (kubectl scale, KEDA, systemd), or deploy it "
                    "without external_scaler_enabled to have streamserve run them"
                )
            if current.autoscaling_config is None and current.wanted_replicas() == num_replicas:
                return DesiredChange()  # (no num_replicas, read as 1, scaled to 1: a goal, then a deploy "updated")
            data = {**current.model_dump(), "num_replicas": num_replicas, "autoscaling_config": None}
            try:
                updated = DeploymentConfig.model_validate(data, context=limits_context(self._limits))  # field checks
            except ValidationError as exc:
                raise ConfigError(f"deployment {name!r}: {format_validation_error(exc, data)}") from exc
            return DesiredChange(deployments={name: updated})

        return (await self._write(scaled, kind="scale")).goals.get(name)

    async def delete(self, name: str) -> str:
        """Remove a deployment; the scheduler then stops its replicas and drops its keys. Returns the goal id.

        Refused with ConflictError while an endpoint still sends traffic to it.
        """

        def deleted(stored: Stored) -> DesiredChange:
            _stored_deployment(stored, name)
            return DesiredChange(delete_deployments=(name,))

        return (await self._write(deleted, kind="delete")).goals[name]

    async def set_traffic(
        self, name: str, traffic: dict[str, float], shadow: dict[str, float] | None = None
    ) -> EndpointConfig:
        """Create or change an endpoint's weights (and its shadows, unless None: then they stay); live at once.

        A new endpoint gets the route ``/<name>``. Returns the endpoint as stored.
        """
        made: list[EndpointConfig] = []

        def weighed(stored: Stored) -> DesiredChange:
            raw = stored.endpoints.get(name.encode())
            data: dict[str, Any] = {"name": name} if raw is None else orjson.loads(raw)
            data["traffic"] = traffic
            if shadow is not None:
                data["shadow"] = shadow
            made[:] = [parse_endpoint(data)]
            return DesiredChange(endpoints={name: made[0]})

        await self._write(weighed, kind="traffic")
        return made[0]

    async def delete_named(self, name: str) -> str | None:
        """Remove the endpoint or the deployment called ``name`` (a caller names either): the deployment's goal id,
        None for an endpoint (gone at once); NotFoundError saying both when neither is so called."""
        if await self._redis.hexists(self._keys.endpoints(), name):
            await self.delete_endpoint(name)
            return None
        try:
            return await self.delete(name)
        except NotFoundError:
            raise NotFoundError(f"no deployment or endpoint named {name!r}") from None

    async def delete_endpoint(self, name: str) -> None:
        """Remove an endpoint (its deployments stay)."""

        def deleted(stored: Stored) -> DesiredChange:
            if name.encode() not in stored.endpoints:
                raise NotFoundError(f"no endpoint named {name!r}")
            return DesiredChange(delete_endpoints=(name,))

        await self._write(deleted, kind="delete")

    async def _check_response_limits(self, stored: Stored, change: DesiredChange, diff: Diff) -> None:
        """Refuse (ConfigError) a max_response_bytes that the change sets above 1/10 of Redis's maxmemory; only
        warn when it is the default, which the config did not choose (a farm deployed with it keeps deploying).

        Skipped when Redis has no limit or will not say (INFO refused), and for limits the change leaves as they were.
        """
        moved = [change.deployments[n] for n in diff.deployments_changed]
        moved = [cfg for cfg in moved if _response_limit_moved(stored, cfg)]
        maxmemory = await read_maxmemory(self._redis) if moved else None
        if maxmemory is None:
            return
        chosen = [response_limit_problem(c, maxmemory) for c in moved if "max_response_bytes" in c.model_fields_set]
        if any(chosen):
            raise ConfigError("; ".join(problem for problem in chosen if problem))
        for cfg in moved:
            if problem := response_limit_problem(cfg, maxmemory):
                logger.warning("%s (max_response_bytes is at its default)", problem)

    async def _write(self, wanted: DesiredChange | Callable[[Stored], DesiredChange], kind: str) -> Applied:
        """Write configs and their goals in one transaction (``_transact``); then tell ``written``."""
        applied = await self._transact(wanted, kind)
        if applied and self._written is not None:
            await self._written()
        return applied

    async def _transact(self, wanted: DesiredChange | Callable[[Stored], DesiredChange], kind: str) -> Applied:
        """Write configs and their goals in one transaction; nothing at all when nothing changes.

        The whole resulting state is checked inside the transaction (WATCH), so
        two writers cannot together break it, e.g. one deleting a deployment
        while another points an endpoint at it. A change made from what is
        stored (a scale, a delete, traffic: ``wanted`` is then a function of it)
        is made from what the transaction read: made from an earlier reading, a
        scale wrote back a config that a deploy had just replaced, or made a
        deleted deployment anew.
        """
        dkey, ekey = self._keys.deployments(), self._keys.endpoints()
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(dkey, ekey)
                    stored = Stored(await pipe.hgetall(dkey), await pipe.hgetall(ekey))
                    change = wanted(stored) if callable(wanted) else wanted
                    for cfg in change.deployments.values():
                        self._import_allow.check(cfg.import_path, cfg.name)
                    diff = Diff.between(stored, change)
                    if not diff:
                        await pipe.unwatch()  # type: ignore[no-untyped-call]
                        return Applied()
                    check_consistent(stored, change, diff, self._limits)
                    await self._check_response_limits(stored, change, diff)
                    now = now_ms()
                    goals = {n: new_goal(n, kind, change.deployments[n], now) for n in diff.deployments_changed}
                    goals.update({n: new_goal(n, "delete", None, now) for n in diff.deployments_removed})
                    pipe.multi()  # type: ignore[no-untyped-call]
                    for name in diff.deployments_changed:
                        pipe.hset(dkey, name, change.deployments[name].to_json())
                    if diff.deployments_removed:
                        pipe.hdel(dkey, *diff.deployments_removed)
                    for name in diff.endpoints_changed:
                        pipe.hset(ekey, name, change.endpoints[name].to_json())
                    if diff.endpoints_removed:
                        pipe.hdel(ekey, *diff.endpoints_removed)
                    for goal in goals.values():
                        self._goals.stage(pipe, goal)
                    changed = []
                    if diff.deployments_changed or diff.deployments_removed:
                        changed.append(ConfigKey.DEPLOYMENTS)
                    if diff.endpoints_changed or diff.endpoints_removed:
                        changed.append(ConfigKey.ENDPOINTS)
                    for config_key in changed:
                        bump_snapshot_id(pipe, self._keys, config_key)
                    results = await pipe.execute()
                    snapshot_ids = results[len(results) - len(changed) :]
                    await announce(self._redis, self._keys, dict(zip(changed, snapshot_ids, strict=True)))
                    written = diff.endpoints_changed + diff.endpoints_removed
                    return Applied({name: goal.goal_id for name, goal in goals.items()}, written)
                except WatchError:
                    continue
