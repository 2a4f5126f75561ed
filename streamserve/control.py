"""Desired-state writes and status reads, shared by the CLI and the gateway's admin API.

Writes are idempotent: applying a config equal to what is stored changes
nothing and publishes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import WatchError

from streamserve import scripts
from streamserve.config import (
    AppConfig,
    DeploymentConfig,
    EndpointConfig,
    desired_state_problems,
    format_validation_error,
)
from streamserve.errors import (
    ConfigError,
    ConflictError,
    GoalFailedError,
    NotFoundError,
    RequestTimeoutError,
)
from streamserve.ids import new_request_id
from streamserve.keys import CONSUMER_GROUP, ConfigKey, Keys
from streamserve.longpoll import publish_change
from streamserve.messages import (
    AutoscaleRecord,
    DeploymentHealthRecord,
    GoalRecord,
    Heartbeat,
    ReplicaRecord,
    now_ms,
    text,
)
from streamserve.states import FINAL_GOAL_STATUSES, GoalStatus, ReplicaState


@dataclass
class ReplicaStatus:
    """One replica as `status` shows it."""

    replica_id: str
    state: str
    version: str
    pid: int
    host: str
    ongoing: int
    heartbeat_age_s: float | None
    message: str


@dataclass
class AutoscalingStatus:
    """An autoscaled deployment's bounds and the scheduler's last decision."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float
    reason: str
    """Why the target is what it is ("" until the scheduler has decided)."""
    decided_ms: int
    """When the scheduler last changed the target (0 until it has decided)."""


@dataclass
class DeploymentStatus:
    """One deployment as `status` shows it; ``target`` is the autoscaled count when autoscaling is on."""

    name: str
    route_prefix: str | None
    version: str
    health: str
    message: str
    target: int
    running: int
    starting: int
    stopping: int
    queued: int
    in_flight: int
    dead_letters: int
    replicas: list[ReplicaStatus] = field(default_factory=list)
    autoscaling: AutoscalingStatus | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


GOAL_RETENTION_MS = 3_600_000
"""Finished goals are pruned this long after they finish."""
GOAL_POLL_S = 0.1

ProgressCallback = Callable[[GoalRecord], Awaitable[None]]


def _new_goal(name: str, kind: str, cfg: DeploymentConfig | None, now: int) -> GoalRecord:
    return GoalRecord(
        goal_id=new_request_id(),
        deployment=name,
        kind=kind,
        version=cfg.code_version() if cfg is not None else "",
        replicas=cfg.target_replicas if cfg is not None else 0,
        created_ms=now,
        updated_ms=now,
    )


@dataclass(frozen=True)
class DesiredChange:
    """One atomic write to the desired state: upserts and deletions of deployments and endpoints."""

    deployments: dict[str, DeploymentConfig] = field(default_factory=dict)
    endpoints: dict[str, EndpointConfig] = field(default_factory=dict)
    delete_deployments: tuple[str, ...] = ()
    delete_endpoints: tuple[str, ...] = ()


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


def _check_change(
    stored_d: Mapping[Any, Any], stored_e: Mapping[Any, Any], change: DesiredChange, removed: list[str]
) -> None:
    """Refuse a change that would leave the desired state inconsistent (see config.desired_state_problems).

    Only problems the change adds count, so a state that was already broken
    can still be mended one write at a time.
    """
    before_d = {text(k): DeploymentConfig.from_json(v) for k, v in stored_d.items()}
    before_e = {text(k): EndpointConfig.from_json(v) for k, v in stored_e.items()}
    after_d = {**before_d, **change.deployments}
    after_e = {**before_e, **change.endpoints}
    for name in change.delete_deployments:
        after_d.pop(name, None)
    for name in change.delete_endpoints:
        after_e.pop(name, None)
    for name in removed:
        users = sorted(e.name for e in after_e.values() if name in e.deployments)
        if users:
            raise ConflictError(
                f"cannot delete deployment {name!r}: endpoint {', '.join(map(repr, users))} still sends traffic to "
                "it; change that endpoint's traffic (streamserve traffic) or delete the endpoint first"
            )
    new = [p for p in desired_state_problems(after_d, after_e) if p not in desired_state_problems(before_d, before_e)]
    if new:
        raise ConfigError("; ".join(new))


class Control:
    """Reads and writes the desired state in Redis."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._queue_depth = redis.register_script(scripts.QUEUE_DEPTH)

    async def deployments(self) -> dict[str, DeploymentConfig]:
        """Every desired deployment, by name."""
        raw = await self._redis.hgetall(self._keys.deployments())
        return {text(k): DeploymentConfig.from_json(v) for k, v in raw.items()}

    async def get(self, name: str) -> DeploymentConfig:
        raw = await self._redis.hget(self._keys.deployments(), name)
        if raw is None:
            raise NotFoundError(f"no deployment named {name!r}")
        return DeploymentConfig.from_json(raw)

    async def endpoints(self) -> dict[str, EndpointConfig]:
        """Every endpoint, by name."""
        raw = await self._redis.hgetall(self._keys.endpoints())
        return {text(k): EndpointConfig.from_json(v) for k, v in raw.items()}

    async def apply(self, app: AppConfig) -> Applied:
        """Upsert every deployment and endpoint in ``app``; goals for the deployments whose config changed."""
        change = DesiredChange(
            deployments={d.name: d for d in app.deployments}, endpoints={e.name: e for e in app.endpoints}
        )
        return await self._write(change, kind="apply")

    async def scale(self, name: str, num_replicas: int) -> str | None:
        """Set a fixed replica count (turning autoscaling off); the goal id, or None if nothing changed."""
        current = await self.get(name)
        data = {**current.model_dump(), "num_replicas": num_replicas, "autoscaling_config": None}
        try:
            updated = DeploymentConfig.model_validate(data)  # re-run the field checks
        except ValidationError as exc:
            raise ConfigError(f"deployment {name!r}: {format_validation_error(exc, data)}") from exc
        return (await self._write(DesiredChange(deployments={name: updated}), kind="scale")).goals.get(name)

    async def delete(self, name: str) -> str:
        """Remove a deployment; the scheduler then stops its replicas and drops its keys. Returns the goal id.

        Refused with ConflictError while an endpoint still sends traffic to it.
        """
        await self.get(name)
        return (await self._write(DesiredChange(delete_deployments=(name,)), kind="delete")).goals[name]

    async def set_traffic(
        self, name: str, traffic: dict[str, float], shadow: dict[str, float] | None = None
    ) -> EndpointConfig:
        """Create or change an endpoint's weights (and its shadows, unless None: then they stay); live at once.

        A new endpoint gets the route ``/<name>``. Returns the endpoint as stored.
        """
        raw = await self._redis.hget(self._keys.endpoints(), name)
        data: dict[str, Any] = {"name": name} if raw is None else orjson.loads(raw)
        data["traffic"] = traffic
        if shadow is not None:
            data["shadow"] = shadow
        endpoint = parse_endpoint(data)
        await self._write(DesiredChange(endpoints={name: endpoint}), kind="traffic")
        return endpoint

    async def delete_endpoint(self, name: str) -> None:
        """Remove an endpoint (its deployments stay)."""
        if not await self._redis.hexists(self._keys.endpoints(), name):
            raise NotFoundError(f"no endpoint named {name!r}")
        await self._write(DesiredChange(delete_endpoints=(name,)), kind="delete")

    async def goal(self, goal_id: str) -> GoalRecord:
        raw = await self._redis.hget(self._keys.goals(), goal_id)
        if raw is None:
            raise NotFoundError(f"no goal {goal_id!r} (goals are kept for {GOAL_RETENTION_MS // 60_000} minutes)")
        record: GoalRecord = GoalRecord.decode(raw)
        return record

    async def wait_for_goal(
        self, goal_id: str, timeout: float | None = None, on_progress: ProgressCallback | None = None
    ) -> GoalRecord:
        """Block until the goal is DONE; raise GoalFailedError if it failed or was cancelled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            goal = await self.goal(goal_id)
            if goal.status is GoalStatus.DONE:
                return goal
            if goal.status is GoalStatus.FAILED:
                raise GoalFailedError(f"{goal.deployment}: {goal.message}")
            if goal.status in FINAL_GOAL_STATUSES:
                raise GoalFailedError(f"{goal.deployment}: goal {goal_id} cancelled: {goal.message}")
            if on_progress is not None:
                await on_progress(goal)
            if deadline is not None and time.monotonic() > deadline:
                raise RequestTimeoutError(f"goal {goal_id} ({goal.kind} {goal.deployment}) not reached in {timeout}s")
            await asyncio.sleep(GOAL_POLL_S)

    async def progress(self, goal: GoalRecord) -> str:
        """One line on how far a pending goal is, e.g. "echo: 1/2 replicas of version ab12 running"."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._keys.replicas(goal.deployment))
            pipe.hget(self._keys.autoscaling(), goal.deployment)
            raw, autoscaled_raw = await pipe.execute()
        records = [ReplicaRecord.decode(v) for v in raw.values()]
        if goal.kind == "delete":
            return f"{goal.deployment}: {len(records)} replica(s) still stopping"
        # Only autoscaled deployments have an autoscaling record (the scheduler drops it when autoscaling is off).
        wanted = AutoscaleRecord.decode(autoscaled_raw).replicas if autoscaled_raw else goal.replicas
        ready = sum(1 for r in records if r.state is ReplicaState.RUNNING and r.version == goal.version)
        others = sum(1 for r in records if r.version != goal.version)
        if ready > wanted:  # scaling down: what counts is how many are still to stop
            return f"{goal.deployment}: {ready} replica(s) running, scaling down to {wanted}"
        line = f"{goal.deployment}: {ready}/{wanted} replica(s) of version {goal.version} running"
        return line + (f", {others} of an older version still up" if others else "")

    async def _write(self, change: DesiredChange, kind: str) -> Applied:
        """Write configs and their goals in one transaction; nothing at all when nothing changes.

        The whole resulting state is checked inside the transaction (WATCH), so
        two writers cannot together break it, e.g. one deleting a deployment
        while another points an endpoint at it.
        """
        dkey, ekey = self._keys.deployments(), self._keys.endpoints()
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(dkey, ekey)
                    stored_d, stored_e = await pipe.hgetall(dkey), await pipe.hgetall(ekey)
                    changed = [n for n, cfg in change.deployments.items() if stored_d.get(n.encode()) != cfg.to_json()]
                    removed = [n for n in change.delete_deployments if n.encode() in stored_d]
                    e_changed = [n for n, e in change.endpoints.items() if stored_e.get(n.encode()) != e.to_json()]
                    e_removed = [n for n in change.delete_endpoints if n.encode() in stored_e]
                    if not (changed or removed or e_changed or e_removed):
                        await pipe.unwatch()  # type: ignore[no-untyped-call]
                        return Applied()
                    _check_change(stored_d, stored_e, change, removed)
                    now = now_ms()
                    goals = {n: _new_goal(n, kind, change.deployments[n], now) for n in changed}
                    goals.update({n: _new_goal(n, "delete", None, now) for n in removed})
                    pipe.multi()  # type: ignore[no-untyped-call]
                    for name in changed:
                        pipe.hset(dkey, name, change.deployments[name].to_json())
                    if removed:
                        pipe.hdel(dkey, *removed)
                    for name in e_changed:
                        pipe.hset(ekey, name, change.endpoints[name].to_json())
                    if e_removed:
                        pipe.hdel(ekey, *e_removed)
                    for goal in goals.values():
                        pipe.hset(self._keys.goals(), goal.goal_id, goal.encode())
                    if changed or removed:
                        publish_change(pipe, self._keys, ConfigKey.DEPLOYMENTS)
                    if e_changed or e_removed:
                        publish_change(pipe, self._keys, ConfigKey.ENDPOINTS)
                    await pipe.execute()
                    return Applied({name: goal.goal_id for name, goal in goals.items()}, e_changed + e_removed)
                except WatchError:
                    continue

    async def report(self) -> dict[str, Any]:
        """What ``status --json`` and ``GET /-/status`` show: every deployment and every endpoint."""
        deployments = await self.status()
        endpoints = await self.endpoints()
        return {
            "deployments": [s.to_dict() for s in deployments],
            "endpoints": [endpoints[name].model_dump(mode="json") for name in sorted(endpoints)],
        }

    async def status(self) -> list[DeploymentStatus]:
        """Every deployment with its replicas and queue figures, sorted by name."""
        deployments = await self.deployments()
        return [await self._deployment_status(name, cfg) for name, cfg in sorted(deployments.items())]

    async def settled(self, cfg: DeploymentConfig) -> bool:
        """True when exactly the target number of replicas of this config's version are RUNNING."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._keys.replicas(cfg.name))
            pipe.hget(self._keys.autoscaling(), cfg.name)
            raw, autoscaled_raw = await pipe.execute()
        records = [ReplicaRecord.decode(v) for v in raw.values()]
        version = cfg.code_version()
        return len(records) == _target(cfg, autoscaled_raw) and all(
            r.state is ReplicaState.RUNNING and r.version == version for r in records
        )

    async def health(self, name: str) -> DeploymentHealthRecord | None:
        """The scheduler's last verdict on a deployment, if it gave one."""
        raw = await self._redis.hget(self._keys.deployment_status(), name)
        return DeploymentHealthRecord.decode(raw) if raw is not None else None

    async def _deployment_status(self, name: str, cfg: DeploymentConfig) -> DeploymentStatus:
        k = self._keys
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(k.replicas(name))
            pipe.hgetall(k.heartbeats(name))
            pipe.xlen(k.dead_letters(name))
            pipe.hget(k.deployment_status(), name)
            pipe.hget(k.autoscaling(), name)
            records_raw, beats_raw, dead, health_raw, autoscaled_raw = await pipe.execute()
        # Length and pending read in one step, as the admission check reads them (scripts.ENQUEUE).
        length, in_flight = await self._queue_depth(keys=[k.requests(name)], args=[CONSUMER_GROUP])
        now = now_ms()
        beats = {text(rid): Heartbeat.decode(raw) for rid, raw in beats_raw.items()}
        replicas = []
        for raw in records_raw.values():
            rec = ReplicaRecord.decode(raw)
            beat = beats.get(rec.replica_id)
            replicas.append(
                ReplicaStatus(
                    replica_id=rec.replica_id,
                    state=rec.state.value,
                    version=rec.version,
                    pid=rec.pid,
                    host=rec.host,
                    ongoing=beat.ongoing if beat else 0,
                    heartbeat_age_s=round((now - beat.ts_ms) / 1000, 3) if beat else None,
                    message=rec.message or (beat.message if beat else ""),
                )
            )
        replicas.sort(key=lambda r: r.replica_id)

        def count(*states: ReplicaState) -> int:
            return sum(1 for r in replicas if r.state in {s.value for s in states})

        health = DeploymentHealthRecord.decode(health_raw) if health_raw else None
        return DeploymentStatus(
            name=name,
            route_prefix=cfg.route_prefix,
            version=cfg.code_version(),
            health=health.health.value if health else "PENDING",
            message=health.message if health else "",
            target=_target(cfg, autoscaled_raw),
            running=count(ReplicaState.RUNNING),
            starting=count(ReplicaState.SHOULD_START, ReplicaState.STARTING),
            stopping=count(ReplicaState.SHOULD_STOP, ReplicaState.STOPPING),
            queued=max(0, int(length) - int(in_flight)),
            in_flight=int(in_flight),
            dead_letters=int(dead),
            replicas=replicas,
            autoscaling=_autoscaling_status(cfg, autoscaled_raw),
        )


def _target(cfg: DeploymentConfig, autoscaled_raw: bytes | None) -> int:
    """The replica count the scheduler keeps: its autoscaled count when autoscaling is on, else the config's."""
    if cfg.autoscaling_config is not None and autoscaled_raw is not None:
        replicas: int = AutoscaleRecord.decode(autoscaled_raw).replicas
        return replicas
    return cfg.target_replicas


def _autoscaling_status(cfg: DeploymentConfig, autoscaled_raw: bytes | None) -> AutoscalingStatus | None:
    auto = cfg.autoscaling_config
    if auto is None:
        return None
    record = AutoscaleRecord.decode(autoscaled_raw) if autoscaled_raw is not None else None
    return AutoscalingStatus(
        min_replicas=auto.min_replicas,
        max_replicas=auto.max_replicas,
        target_ongoing_requests=auto.target_ongoing_requests,
        reason=record.reason if record else "",
        decided_ms=record.updated_ms if record else 0,
    )
