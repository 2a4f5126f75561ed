"""Raw pipelined commands on a Redis Cluster: each sent to the master that owns its key, redirections followed.

The hot path (pipelining.Pipeliner, BlockingReader) writes raw commands on a
connection of its own. On a cluster one loop turn's commands may belong to
several masters (a replica's replies go to each caller's reply stream): they
are grouped by master and each group goes out as one write, all at once. A
command refused with MOVED (the slot moved: resharding, a failover) is sent
again after the slot map is re-read; with ASK, to the node named, after
ASKING; with TRYAGAIN or CLUSTERDOWN, again after a pause. Only when that
fails RETRY_ATTEMPTS times does a caller see the error; a blocking read, whose
caller is a loop that only reads again, tries for as long as a failover may
take (FAILOVER_WAIT_S) instead.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection, Connection
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AskError, ClusterDownError, MovedError, ResponseError, TryAgainError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from streamserve.transport.connections import (
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    RETRY_ATTEMPTS,
    RETRYABLE_ERRORS,
    refresh_cluster_map,
)

Command = tuple[EncodableT, ...]

# Replies that mean "not here, not now": the command was not run, so sending it again is safe.
_REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)

# How long a blocking read is refused (CLUSTERDOWN, mostly) before its caller hears of it: a failed master's
# failover takes cluster-node-timeout (Redis's default: 15 s) to notice it, then a replica's election (1-2 s).
# Every master refuses every command meanwhile, so RETRY_ATTEMPTS (about a second) would end well within it.
FAILOVER_WAIT_S = 20.0


def command_key(command: Command) -> EncodableT:
    """The key a raw command routes by: EVALSHA's first key, a stream read's stream, else the first argument."""
    name = command[0]
    name = name.upper() if isinstance(name, str) else name
    if name in ("EVALSHA", "EVAL", "FCALL", b"EVALSHA", b"EVAL"):
        return command[3]
    if name in ("XREAD", "XREADGROUP", b"XREAD", b"XREADGROUP"):
        for i, arg in enumerate(command):
            if arg in ("STREAMS", b"STREAMS"):
                return command[i + 1]
    return command[1]


async def read_reply(connection: AbstractConnection) -> Any:
    """One reply; an error reply (the command failed in Redis) is returned, not raised."""
    try:
        return await connection.read_response(timeout=math.inf)  # bounded by the caller's timeout
    except ResponseError as exc:
        return exc


class ClusterRouter:
    """Finds the master of a command's key, and re-reads the slot map when Redis says it moved."""

    def __init__(self, cluster: aioredis.RedisCluster) -> None:
        self.cluster = cluster
        self._backoff = ExponentialWithJitterBackoff(BACKOFF_CAP_S, BACKOFF_BASE_S)

    async def node_of(self, command: Command) -> ClusterNode:
        await self.cluster.initialize()  # a no-op once the slot map is known
        slot = self.cluster.keyslot(command_key(command))
        return self.cluster.nodes_manager.get_node_from_slot(slot)

    def asked_node(self, error: AskError) -> ClusterNode | None:
        """The node an ASK redirection names; None when the slot map does not know it yet (re-read it)."""
        return self.cluster.nodes_manager.get_node(error.host, error.port)

    async def refresh(self) -> None:
        """Re-read the slot map (after MOVED, a lost node, or CLUSTERDOWN)."""
        await refresh_cluster_map(self.cluster)  # type: ignore[arg-type]

    async def pause(self, attempt: int) -> None:
        await asyncio.sleep(self._backoff.compute(attempt))


async def exchange(node: ClusterNode, commands: Sequence[Command], *, asking: bool = False) -> list[Any]:
    """Send ``commands`` to ``node`` in one write and read their replies (ASKING before each, if ``asking``)."""
    if asking:
        packed = b"".join(hiredis.pack_command(("ASKING",)) + hiredis.pack_command(c) for c in commands)  # type: ignore[arg-type]
    else:
        packed = b"".join(hiredis.pack_command(c) for c in commands)  # type: ignore[arg-type]
    connection = node.acquire_connection()
    try:
        try:
            async with asyncio.timeout(connection.socket_timeout):
                await connection.send_packed_command(packed)
                replies = []
                for _ in commands:
                    if asking:
                        await read_reply(connection)
                    replies.append(await read_reply(connection))
                return replies
        except TimeoutError as exc:
            raise RedisTimeoutError(f"no reply from Redis at {node.name} within {connection.socket_timeout}s") from exc
    except BaseException:
        await connection.disconnect(nowait=True)  # replies may be left unread on it
        raise
    finally:
        node.release(connection)


class ClusterRoundTrip:
    """Pipeliner's round trip on a cluster: one write per master, all at once; redirections followed."""

    def __init__(self, cluster: aioredis.RedisCluster) -> None:
        self._router = ClusterRouter(cluster)

    async def __call__(self, commands: list[Command], again: Callable[[], list[Command]]) -> list[Any]:
        """The replies of ``commands``; those sent again after a lost connection are sent as ``again()`` has them
        (they may have run: see Pipeliner.execute)."""
        commands = list(commands)
        replies: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        asked: dict[int, ClusterNode] = {}
        resend: set[int] = set()  # commands whose connection was lost: they may have run
        for attempt in range(RETRY_ATTEMPTS + 1):
            if resend:  # asked for right before the writes (see Pipeliner._round_trip)
                fresh = again()
                for i in resend:
                    commands[i] = fresh[i]
            groups: dict[tuple[str, bool], tuple[ClusterNode, list[int]]] = {}
            for i in todo:
                node = asked.get(i) or await self._router.node_of(commands[i])
                groups.setdefault((node.name, i in asked), (node, []))[1].append(i)
            results = await asyncio.gather(
                *(exchange(node, [commands[i] for i in idx], asking=ask) for (_, ask), (node, idx) in groups.items()),
                return_exceptions=True,
            )
            todo, asked, refresh = [], {}, False
            for (_, idx), result in zip(groups.values(), results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, RETRYABLE_ERRORS) or attempt == RETRY_ATTEMPTS:
                        raise result
                    resend.update(idx)
                    todo += idx
                    refresh = True
                    continue
                for i, reply in zip(idx, result, strict=True):
                    replies[i] = reply
                    if isinstance(reply, _REDIRECTED) and attempt < RETRY_ATTEMPTS:
                        todo.append(i)
                        target = self._router.asked_node(reply) if isinstance(reply, AskError) else None
                        if target is not None:
                            asked[i] = target
                        elif not isinstance(reply, TryAgainError):
                            refresh = True
            if not todo:
                break
            if refresh:
                await self._router.refresh()
            await self._router.pause(attempt)
        return replies


class ClusterBlockingReader:
    """BlockingReader on a cluster: the read goes to the master of its stream, on a connection kept for it."""

    def __init__(self, cluster: aioredis.RedisCluster) -> None:
        self._router = ClusterRouter(cluster)
        self._node: ClusterNode | None = None
        self._connection: Connection | None = None
        self.before_reply: Any = None  # the last read's ``before`` reply (an error as a ResponseError)

    async def read_raw(self, command: Command, block_ms: int, before: Command | None = None) -> Any:
        """The raw reply of the blocking read (``before``, on the same stream, goes ahead of it in one write)."""
        self.before_reply = None
        refused_until: float | None = None  # (the loop's clock) when a refusal that keeps coming is raised
        attempt = 0
        while True:
            node = await self._router.node_of(command)
            if node is not self._node:
                await self.aclose()
                self._node, self._connection = node, node.acquire_connection()
            connection = self._connection
            assert connection is not None
            limit_s = block_ms / 1000 + (connection.socket_timeout or 0)
            packed = hiredis.pack_command(command)  # type: ignore[arg-type]
            if before is not None:
                packed = hiredis.pack_command(before) + packed  # type: ignore[arg-type]
            try:
                async with asyncio.timeout(limit_s):
                    await connection.send_packed_command(packed)
                    if before is not None:
                        self.before_reply = await read_reply(connection)
                    return await connection.read_response(timeout=math.inf)
            except _REDIRECTED:
                now = asyncio.get_running_loop().time()
                refused_until = refused_until or now + FAILOVER_WAIT_S
                if now >= refused_until:
                    raise
                await self._router.refresh()
                await self._router.pause(attempt)
                attempt = min(attempt + 1, RETRY_ATTEMPTS)  # the pauses grow up to the backoff's cap
            except ResponseError:
                raise  # the command failed (e.g. NOGROUP); the connection is fine
            except BaseException as exc:
                await self.aclose()
                if isinstance(exc, RETRYABLE_ERRORS):
                    await self._router.refresh()
                if isinstance(exc, TimeoutError):
                    raise RedisTimeoutError(f"no reply from Redis within {limit_s:g}s") from exc
                raise

    async def aclose(self) -> None:
        """Give the connection back (disconnected: a read may still be running on it)."""
        node, connection = self._node, self._connection
        self._node = self._connection = None
        if node is not None and connection is not None:
            await connection.disconnect(nowait=True)
            node.release(connection)
