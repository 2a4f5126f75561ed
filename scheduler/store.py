"""Where the scheduler persists replica records, deployment verdicts and autoscaling decisions in Redis."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.typing import EncodableT, FieldT

from streamserve.control.heartbeats import queue_removal
from streamserve.control.long_poll import announce, bump_snapshot_id
from streamserve.scheduler.autoscaler import NO_LOAD, Load
from streamserve.transport.streams import LOG_STREAM_LINES
from streamserve.wire.errors import ProtocolError
from streamserve.wire.ids import NO_STREAM_ID, StreamId, stream_id
from streamserve.wire.keys import CONSUMER_GROUP, ConfigKey, Keys
from streamserve.wire.messages import AutoscaleRecord, DeploymentHealthRecord, Heartbeat, ReplicaRecord, text
from streamserve.wire.priorities import PRIORITIES

logger = logging.getLogger(__name__)

# Autoscaling decisions kept per deployment (Keys.autoscale_decisions).
AUTOSCALE_DECISIONS_KEPT = 50


class RedisReplicaStore:
    """The production ReplicaStore: one hash per deployment, plus the status hash."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    async def save(self, deployment: str, record: ReplicaRecord) -> None:
        await self._redis.hset(self._keys.replicas(deployment), record.replica_id, record.encode())

    async def remove(self, deployment: str, replica_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._keys.replicas(deployment), replica_id)
            queue_removal(pipe, self._keys, deployment, [replica_id])
            await pipe.execute()

    async def log_line(self, deployment: str, record: ReplicaRecord, line: str) -> None:
        """Add ``line`` to the deployment's logs (`streamserve logs`) as the replica's: what the scheduler saw of it
        that it could not say itself (its process killed by a signal, its heartbeat gone)."""
        fields: dict[FieldT, EncodableT] = {
            "replica": record.replica_id,
            "host": record.host,
            "pid": record.pid,
            "line": line,
        }
        await self._redis.xadd(self._keys.logs(deployment), fields, maxlen=LOG_STREAM_LINES, approximate=True)

    async def save_health(self, deployment: str, record: DeploymentHealthRecord) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._keys.deployment_status(), deployment, record.encode())
            bump_snapshot_id(pipe, self._keys, ConfigKey.DEPLOYMENT_STATUS)
            *_, snapshot_id = await pipe.execute()
        await announce(self._redis, self._keys, {ConfigKey.DEPLOYMENT_STATUS: snapshot_id})

    async def save_autoscale(self, deployment: str, record: AutoscaleRecord | None) -> None:
        """Keep the autoscaled count (None: autoscaling was turned off, forget it), and add each decision to the
        deployment's capped list of recent ones (the dashboard shows them)."""
        if record is None:
            await self._redis.hdel(self._keys.autoscaling(), deployment)
            return
        # Two slots on a Redis Cluster (farm-wide hash, deployment's stream): no transaction; the list is a log.
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._keys.autoscaling(), deployment, record.encode())
            pipe.xadd(
                self._keys.autoscale_decisions(deployment),
                {"record": record.encode()},
                maxlen=AUTOSCALE_DECISIONS_KEPT,
                approximate=False,
            )
            await pipe.execute()

    async def load_autoscale(self) -> dict[str, AutoscaleRecord]:
        """The autoscaled counts an earlier scheduler decided, by deployment (unreadable ones are skipped)."""
        found = {}
        for name, raw in (await self._redis.hgetall(self._keys.autoscaling())).items():
            try:
                found[text(name)] = AutoscaleRecord.decode(raw)
            except ProtocolError as exc:
                logger.warning("ignoring unreadable autoscaling record of %s: %s", text(name), exc)
        return found

    async def ongoing(self, names: list[str]) -> dict[str, Load]:
        """Queued + in-flight requests of several deployments, and the last request read from each priority level's
        stream, in one round trip.

        The count is the request streams' length: an entry stays in the stream while a replica works on it (pending
        in the group) and is deleted when the replica acknowledges it, so XLEN counts both without XPENDING (summed
        over the priority levels). A request that came and went between two ticks is in no length: the group's
        last-delivered-id (XINFO GROUPS) tells it, as the entry's id stays there after the entry is deleted. (Not
        XINFO STREAM's last-generated-id: its reply holds the stream's first and last entries, request bodies.)
        """
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                for stream in self._keys.request_streams(name).values():
                    pipe.xlen(stream)
                    pipe.xinfo_groups(stream)
            # An XINFO of a stream not made yet (a new deployment's, before its groups) is an error: nothing read.
            results = await pipe.execute(raise_on_error=False)
        per = len(PRIORITIES) * 2
        loads = {}
        for i, name in enumerate(names):
            replies, load = results[i * per : (i + 1) * per], NO_LOAD
            for length, groups in zip(replies[0::2], replies[1::2], strict=True):
                if isinstance(length, Exception):
                    raise length
                load = load.plus(int(length), _last_delivered(groups))
            loads[name] = load
        return loads

    async def held(self, deployment: str, replica_ids: list[str]) -> dict[str, int]:
        """How many requests each of ``replica_ids`` holds, as its last heartbeat says (a second old at most): read
        when a deployment scales down (not from the scheduler's heartbeat reader, which parses a heartbeat again only
        when it says something new, and the count is not news). 0 for a replica with no readable heartbeat."""
        raw = await self._redis.hmget(self._keys.heartbeats(deployment), replica_ids)
        held = {}
        for replica_id, beat in zip(replica_ids, raw, strict=True):
            try:
                held[replica_id] = Heartbeat.decode(beat).ongoing if beat is not None else 0
            except ProtocolError:
                held[replica_id] = 0
        return held

    async def with_models(self, names: list[str]) -> list[str]:
        """Those of ``names`` that have routed streams (a multiplexing deployment: wire/models.py), in one round
        trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.zcard(self._keys.routed_replicas(name))
            counts = await pipe.execute()
        return [name for name, count in zip(names, counts, strict=True) if int(count)]

    async def load_all(self) -> dict[str, list[ReplicaRecord]]:
        """Every recorded replica of every deployment (found by SCAN, so deleted deployments too)."""
        found: dict[str, list[ReplicaRecord]] = {}
        async for key in self._redis.scan_iter(match=self._keys.replicas_pattern(), count=500):
            name = self._keys.deployment_of_replicas_key(key.decode())
            raw = await self._redis.hgetall(key)
            found[name] = [ReplicaRecord.decode(v) for v in raw.values()]
        return found

    async def forget_jobs(self, jobs: aioredis.Redis, deployment: str) -> None:
        """Drop a deleted deployment's job idempotency keys from the jobs' Redis (``jobs``): the same name deployed
        again would otherwise answer them with the old deployment's jobs, never running them."""
        async for key in jobs.scan_iter(match=self._keys.job_idempotency_pattern(deployment), count=500):
            await jobs.delete(key)

    async def forget_deployment(self, deployment: str) -> None:
        """Drop every key of a deleted deployment whose replicas are all gone.

        Its own keys go first (one slot), then its entries in the farm-wide hashes (another slot on a cluster):
        a scheduler that dies in between finds the deployment still listed and forgets it again.
        """
        keys = self._keys
        await self._redis.delete(*keys.deployment_keys(deployment))
        for pattern in (
            keys.idempotency_pattern(deployment),
            keys.cache_pattern(deployment),
            keys.tenant_pattern(deployment),
            keys.model_pattern(deployment),
        ):
            async for key in self._redis.scan_iter(match=pattern, count=500):
                await self._redis.delete(key)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._keys.deployment_status(), deployment)
            pipe.hdel(self._keys.autoscaling(), deployment)
            bump_snapshot_id(pipe, self._keys, ConfigKey.DEPLOYMENT_STATUS)
            *_, snapshot_id = await pipe.execute()
        await announce(self._redis, self._keys, {ConfigKey.DEPLOYMENT_STATUS: snapshot_id})


def _last_delivered(groups: object) -> StreamId:
    """The consumer group's last-delivered-id in an XINFO GROUPS reply (NO_STREAM_ID for an error or no group)."""
    if isinstance(groups, list):
        for group in groups:
            if isinstance(group, dict) and text(group.get("name", b"")) == CONSUMER_GROUP:
                return stream_id(group.get("last-delivered-id"))
    return NO_STREAM_ID
