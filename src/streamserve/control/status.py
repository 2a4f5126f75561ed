"""What `status`, ``GET /-/status`` and ``deploy --wait`` show: deployments, replicas, queues, goal progress.

Read-only: the figures come from the hashes the scheduler and replicas
write (replicas, heartbeats, deployment health, autoscaling) and from the
request stream itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import redis.asyncio as aioredis

from streamserve.control.desired_state import DesiredState
from streamserve.transport.model_streams import ModelStreams
from streamserve.wire import scripts
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import NotFoundError
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import (
    AutoscaleRecord,
    DeploymentHealthRecord,
    GoalRecord,
    Heartbeat,
    ReplicaRecord,
    now_ms,
    text,
)
from streamserve.wire.priorities import Priority
from streamserve.wire.states import ACTIVE_REPLICA_STATES, ReplicaState
from streamserve.wire.tenants import LIMITED_SHOWN_MS


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
    gpus: list[str] = field(default_factory=list)  # the devices it was given (CUDA_VISIBLE_DEVICES)
    age_s: float = 0.0  # since the scheduler created its record (or adopted it)
    models: list[str] = field(default_factory=list)  # the models it holds loaded (a multiplexing deployment's)


@dataclass
class AutoscalingStatus:
    """An autoscaled deployment's bounds and the scheduler's last decision."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float
    reason: str  # why the target is what it is ("" until the scheduler has decided)
    decided_ms: int  # when the scheduler last changed the target (0 until it has decided)


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
    # ``queued`` by priority level (wire/priorities.py): high, normal, low.
    queued_by_priority: dict[str, int] = field(default_factory=dict)
    # The tenants its tenant_limits refused a request of in the last minute (wire/tenants.py), most recent first.
    limited_tenants: list[str] = field(default_factory=list)
    replicas: list[ReplicaStatus] = field(default_factory=list)
    autoscaling: AutoscalingStatus | None = None
    # Its replicas are workers started elsewhere; ``target`` is then how many are live.
    external_scaler_enabled: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StatusReader:
    """Reads the farm's state for people and scripts."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._desired = DesiredState(redis, keys)
        self._queue_depth = redis.register_script(scripts.QUEUE_DEPTH)
        self._model_streams = ModelStreams(redis, keys)

    async def report(self) -> dict[str, Any]:
        """What ``status --json`` and ``GET /-/status`` show: every deployment and every endpoint."""
        deployments = await self.status()
        endpoints = await self._desired.endpoints()
        return {
            "deployments": [s.to_dict() for s in deployments],
            "endpoints": [endpoints[name].model_dump(mode="json") for name in sorted(endpoints)],
        }

    async def status(self) -> list[DeploymentStatus]:
        """Every deployment with its replicas and queue figures, sorted by name."""
        deployments = await self._desired.deployments()
        return [await self._deployment_status(name, cfg) for name, cfg in sorted(deployments.items())]

    async def holding(self, name: str) -> int:
        """How many requests deployment ``name`` holds now, queued or running (NotFoundError when there is none of
        that name)."""
        status = await self._deployment_status(name, await self._desired.get(name))
        return status.queued + status.in_flight

    async def progress(self, goal: GoalRecord) -> str:
        """One line on how far a pending goal is, e.g. "echo: 1/2 replicas of version ab12 running"."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._keys.replicas(goal.deployment))
            pipe.hget(self._keys.autoscaling(), goal.deployment)
            raw, autoscaled_raw = await pipe.execute()
        records = [ReplicaRecord.decode(v) for v in raw.values()]
        if goal.kind == "delete":
            return f"{goal.deployment}: {len(records)} replica(s) still stopping"
        try:
            cfg = await self._desired.get(goal.deployment)
        except NotFoundError:
            return f"{goal.deployment}: deleted"
        ready = sum(1 for r in records if r.state is ReplicaState.RUNNING and r.version == goal.version)
        # Those of another version: running, or with a process starting or stopping (one never started, SHOULD_START
        # still, is not counted: it will not be).
        others = [r.state for r in records if r.version != goal.version and r.state is not ReplicaState.SHOULD_START]
        serving = others.count(ReplicaState.RUNNING)
        if cfg.external_scaler_enabled:
            line = f"{goal.deployment}: {ready}/{len(records)} live worker(s) run version {goal.version}"
            return line + " (externally scaled: workers on the old code start again on the new one)"
        autoscaled, auto = _autoscaled(autoscaled_raw), cfg.autoscaling_config
        if autoscaled is None and auto is not None:  # turned on just now: the scheduler starts from what runs
            autoscaled = auto.first_count(sum(1 for r in records if r.state in ACTIVE_REPLICA_STATES))
        wanted = cfg.wanted_replicas(autoscaled)
        if ready > wanted:  # scaling down: what counts is how many are still to stop
            return f"{goal.deployment}: {ready} replica(s) running, scaling down to {wanted}"
        line = f"{goal.deployment}: {ready}/{wanted} replica(s) of version {goal.version} running"
        if serving:  # older ones, or a failed update's that this one undoes
            line += f", {serving} of another version still running"
        if len(others) > serving:
            line += f", {len(others) - serving} of another version starting or stopping"
        return line

    async def health_of_all(self) -> dict[str, DeploymentHealthRecord]:
        """The scheduler's last verdict on every deployment it has judged."""
        raw = await self._redis.hgetall(self._keys.deployment_status())
        return {text(k): DeploymentHealthRecord.decode(v) for k, v in raw.items()}

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
            pipe.zrevrangebyscore(k.limited_tenants(name), "+inf", now_ms() - LIMITED_SHOWN_MS)
            records_raw, beats_raw, dead, health_raw, autoscaled_raw, limited = await pipe.execute()
        # Length and pending read in one step, as the admission check reads them (scripts.ENQUEUE).
        streams = k.request_streams(name)
        figures = [int(n) for n in await self._queue_depth(keys=list(streams.values()), args=[CONSUMER_GROUP])]
        queued_by_priority = {
            priority.value: max(0, figures[2 * i] - figures[2 * i + 1]) for i, priority in enumerate(streams)
        }
        in_flight = sum(figures[1::2])
        routed = await self._model_streams.figures(name)  # normal-priority requests routed to replicas by model
        queued_by_priority[Priority.NORMAL.value] += routed.queued
        in_flight += routed.pending
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
                    gpus=rec.gpus,
                    age_s=round(max(0, now - rec.created_ms) / 1000, 1),
                    models=beat.models if beat else [],
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
            target=cfg.wanted_replicas(_autoscaled(autoscaled_raw), live=count(*ACTIVE_REPLICA_STATES)),
            running=count(ReplicaState.RUNNING),
            starting=count(ReplicaState.SHOULD_START, ReplicaState.STARTING),
            stopping=count(ReplicaState.SHOULD_STOP, ReplicaState.STOPPING),
            queued=sum(queued_by_priority.values()),
            in_flight=in_flight,
            dead_letters=int(dead),
            queued_by_priority=queued_by_priority,
            limited_tenants=[text(tenant) for tenant in limited],
            replicas=replicas,
            autoscaling=_autoscaling_status(cfg, autoscaled_raw),
            external_scaler_enabled=cfg.external_scaler_enabled,
        )


def _autoscaled(raw: bytes | None) -> int | None:
    """The autoscaler's count from its record (only autoscaled deployments have one)."""
    return None if raw is None else int(AutoscaleRecord.decode(raw).replicas)


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
