"""The shared-run scripts for a response cache on a real redis-server: identical requests miss, coalesce and hit
(counted in the deployment's metrics), a failed run is shared but not kept, a refresh runs anew, the oldest entries
go past max_entries, and a reply from a replica of another version is not kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from streamserve.client.shared_calls import Admission, by_cache, enqueue_shared
from streamserve.metrics.definitions import CACHE_REQUESTS
from streamserve.transport import settling
from streamserve.transport.pipelining import Pipeliner
from streamserve.transport.streams import ensure_group
from streamserve.wire.config import DeploymentConfig, ResponseCacheConfig
from streamserve.wire.keys import Keys
from streamserve.wire.messages import SHARED_STORED, Reply, ReplyStatus, Request, now_ms
from streamserve.wire.response_cache import cache_digest
from streamserve.wire.shared_runs import new_run_token

CFG = DeploymentConfig(
    name="cached", import_path="m:f", user_config={"a": 1}, response_cache=ResponseCacheConfig(ttl_s=60, max_entries=2)
)
KEYS = Keys()


@pytest.fixture
async def pipeliner(aredis: aioredis.Redis) -> AsyncIterator[Pipeliner]:
    await ensure_group(aredis, KEYS.requests(CFG.name))
    pipeliner = Pipeliner(aredis)
    yield pipeliner
    await pipeliner.aclose()


def request(request_id: str, body: bytes = b'{"x":1}') -> Request:
    return Request(request_id, "streamserve:replies:c1", now_ms() + 60_000, body, tag=f"t-{request_id}")


async def enqueue(pipeliner: Pipeliner, call: Request, cfg: DeploymentConfig = CFG, refresh: bool = False) -> Admission:
    call.run = new_run_token()
    return await enqueue_shared(pipeliner, KEYS, cfg, call, by_cache(KEYS, cfg, call, refresh))


async def settle(redis: aioredis.Redis, call: Request, reply: Reply, cfg: DeploymentConfig = CFG) -> list[Any]:
    settlement = settling.settle(KEYS, cfg, call, reply)
    return settlement.answers(await redis.execute_command(*settlement.with_source()))


def answered(commands: list[Any]) -> list[dict[Any, Any]]:
    return [dict(zip(command[7::2], command[8::2], strict=True)) for command in commands]


async def counts(redis: aioredis.Redis) -> dict[str, int]:
    figures = await redis.hgetall(KEYS.metrics(CFG.name))
    return {r: int(figures.get(CACHE_REQUESTS.field(r).encode(), 0)) for r in ("hit", "miss", "coalesced")}


async def test_identical_requests_miss_then_coalesce_then_hit(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    first = request("r1")
    assert (await enqueue(pipeliner, first)).entry_id
    # The same value written otherwise is the same request.
    assert (await enqueue(pipeliner, request("r2", b'{ "x" : 1 }'))).joined
    assert (await enqueue(pipeliner, request("r3"))).joined
    assert await aredis.xlen(KEYS.requests(CFG.name)) == 1
    answers = answered(await settle(aredis, first, first.reply(ReplyStatus.OK, "cached#a", body=b"42")))
    assert [(a["id"], a["status"], a["body"]) for a in answers] == [("r2", "ok", b"42"), ("r3", "ok", b"42")]
    hit = await enqueue(pipeliner, request("r4"))
    assert hit.stored is not None
    assert (hit.stored.request_id, hit.stored.body, hit.stored.shared) == ("r4", b"42", SHARED_STORED)
    assert 55_000 < await aredis.pttl(KEYS.cache_entry(CFG.name, first.cache)) <= 60_000
    assert await counts(aredis) == {"hit": 1, "miss": 1, "coalesced": 2}
    other = request("r5", b'{"x":2}')
    assert (await enqueue(pipeliner, other)).entry_id


async def test_a_failed_run_is_shared_but_not_kept(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    first = request("r1")
    await enqueue(pipeliner, first)
    await enqueue(pipeliner, request("r2"))
    failed = first.reply(ReplyStatus.USER_ERROR, "cached#a", error_type="ValueError", error_message="no")
    [answer] = answered(await settle(aredis, first, failed))
    assert (answer["status"], answer["error_message"]) == ("user_error", "no")
    assert not await aredis.exists(KEYS.cache_entry(CFG.name, first.cache))
    # One that never ran sends its waiters to run anew.
    again = request("r3")
    await enqueue(pipeliner, again)
    await enqueue(pipeliner, request("r4"))
    [retry] = answered(await settle(aredis, again, again.reply(ReplyStatus.DEADLINE_EXCEEDED, "cached#a")))
    assert retry["status"] == "retry"


async def test_a_refresh_runs_anew_and_replaces_the_entry(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    first = request("r1")
    await enqueue(pipeliner, first)
    await settle(aredis, first, first.reply(ReplyStatus.OK, "cached#a", body=b"1"))
    fresh = request("r2")
    assert (await enqueue(pipeliner, fresh, refresh=True)).entry_id
    assert (await enqueue(pipeliner, request("r3"))).joined  # the refresh in flight is the run to wait for
    await settle(aredis, fresh, fresh.reply(ReplyStatus.OK, "cached#a", body=b"2"))
    hit = (await enqueue(pipeliner, request("r4"))).stored
    assert hit is not None and hit.body == b"2"


async def test_the_callers_that_joined_a_replaced_run_are_answered_by_the_new_one(
    aredis: aioredis.Redis, pipeliner: Pipeliner
) -> None:
    """A caller joined run 1; a refresh replaced it with run 2 before it ended. Run 1's end settles nothing (the
    record names run 2), so run 2's end must answer that caller, though nobody joined run 2 itself."""
    first = request("r1")
    await enqueue(pipeliner, first)
    assert (await enqueue(pipeliner, request("r2"))).joined
    fresh = request("r3")
    assert (await enqueue(pipeliner, fresh, refresh=True)).entry_id
    assert await settle(aredis, first, first.reply(ReplyStatus.OK, "cached#a", body=b"1")) == []
    answers = answered(await settle(aredis, fresh, fresh.reply(ReplyStatus.OK, "cached#a", body=b"2")))
    assert [(a["id"], a["body"]) for a in answers] == [("r2", b"2")]


async def test_the_oldest_entries_go_past_max_entries(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    calls = [request(f"r{n}", f'{{"n":{n}}}'.encode()) for n in range(5)]
    for call in calls:
        await enqueue(pipeliner, call)
        await settle(aredis, call, call.reply(ReplyStatus.OK, "cached#a", body=b"1"))
    kept = [bool(await aredis.exists(KEYS.cache_entry(CFG.name, call.cache))) for call in calls]
    assert kept == [False, False, False, True, True]
    assert await aredis.zcard(KEYS.cache_index(CFG.name)) == 2


async def test_entries_kept_under_a_longer_ttl_go_once_a_deploy_lowers_it(
    aredis: aioredis.Redis, pipeliner: Pipeliner
) -> None:
    """Kept for 600 s; a deploy lowers ttl_s to 2 (a new config: the old entries are never served again). Once
    they are older than the new ttl_s, the next kept reply deletes them, not only their index entries: max_entries
    still bounds what the cache holds."""
    long_lived = CFG.model_copy(update={"response_cache": ResponseCacheConfig(ttl_s=600, max_entries=2)})
    short = CFG.model_copy(update={"response_cache": ResponseCacheConfig(ttl_s=2, max_entries=2)})
    old = [request(f"old{n}", f'{{"n":{n}}}'.encode()) for n in range(2)]
    for call in old:
        await enqueue(pipeliner, call, long_lived)
        await settle(aredis, call, call.reply(ReplyStatus.OK, "cached#a", body=b"1"), long_lived)
    index = KEYS.cache_index(CFG.name)
    members = await aredis.zrange(index, 0, -1, withscores=True)
    await aredis.zadd(index, {member: score - 3_000 for member, score in members})  # kept 3 s ago
    new = request("new")
    await enqueue(pipeliner, new, short)
    await settle(aredis, new, new.reply(ReplyStatus.OK, "cached#a", body=b"2"), short)
    assert [bool(await aredis.exists(KEYS.cache_entry(CFG.name, call.cache))) for call in old] == [False, False]
    assert await aredis.zrange(index, 0, -1) == [new.cache.encode()]


async def test_a_kept_reply_is_served_while_redis_refuses_writes(aredis: aioredis.Redis, pipeliner: Pipeliner) -> None:
    """A hit writes nothing but its count: Redis refusing writes for memory must not refuse the hit."""
    first = request("r1")
    await enqueue(pipeliner, first)
    await settle(aredis, first, first.reply(ReplyStatus.OK, "cached#a", body=b"1"))
    await aredis.config_set("maxmemory", "1")  # below what it holds: every write that needs memory is refused
    try:
        hit = (await enqueue(pipeliner, request("r2"))).stored
    finally:
        await aredis.config_set("maxmemory", "0")
    assert hit is not None and hit.body == b"1"


async def test_a_reply_from_another_version_is_shared_but_not_kept(
    aredis: aioredis.Redis, pipeliner: Pipeliner
) -> None:
    first = request("r1")
    await enqueue(pipeliner, first)
    await enqueue(pipeliner, request("r2"))
    old = CFG.model_copy(update={"user_config": {"a": 0}})  # the replica has not taken the new user_config yet
    [answer] = answered(await settle(aredis, first, first.reply(ReplyStatus.OK, "cached#a", body=b"old"), old))
    assert answer["body"] == b"old"
    assert not await aredis.exists(KEYS.cache_entry(CFG.name, first.cache))


def test_a_deploy_that_changes_code_or_user_config_changes_every_digest() -> None:
    digest = cache_digest(CFG, "", b'{"x":1}')
    assert cache_digest(CFG, "", b'{ "x": 1 }') == digest
    assert cache_digest(CFG.model_copy(update={"version": "2"}), "", b'{"x":1}') != digest
    assert cache_digest(CFG.model_copy(update={"user_config": {"a": 2}}), "", b'{"x":1}') != digest
    assert cache_digest(CFG, "other", b'{"x":1}') != digest
    assert cache_digest(CFG.model_copy(update={"name": "twin"}), "", b'{"x":1}') != digest
