"""Tenant limits in the enqueue scripts, on a real redis-server (wire/tenants.py, scripts._TENANT): the token bucket,
the bound on a tenant's held requests, what a refusal says and records, and that no other tenant is touched."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.transport.streams import ensure_groups
from streamserve.wire.config import DeploymentConfig, TenantLimitConfig
from streamserve.wire.errors import OverloadedError, RateLimitedError
from streamserve.wire.messages import Request, now_ms
from streamserve.wire.tenants import LIMITED_SHOWN_MS

NAME = "rec"


@pytest.fixture
async def client(settings: Settings, aredis: aioredis.Redis) -> AsyncIterator[AsyncClient]:
    await ensure_groups(aredis, settings.keys, NAME)
    async with AsyncClient(settings=settings) as client:
        yield client


def config(**limits: dict[str, float]) -> DeploymentConfig:
    return DeploymentConfig(
        name=NAME,
        import_path="tests.deployments:Recorder",
        max_queued_requests=100,
        tenant_limits={tenant: TenantLimitConfig(**limit) for tenant, limit in limits.items()},
    )


async def add(client: AsyncClient, cfg: DeploymentConfig, tenant: str, deadline_ms: int = 0) -> str:
    request = Request("r", "", deadline_ms or now_ms() + 60_000, b"1", tenant=tenant)
    return await client._add(cfg, request)


async def test_a_tenants_bucket_admits_its_burst_then_says_when_the_next_token_comes(client: AsyncClient) -> None:
    cfg = config(default={"requests_per_s": 0.5, "burst": 3})
    for _ in range(3):
        await add(client, cfg, "a")
    with pytest.raises(RateLimitedError, match="tenant 'a' is over its rate on deployment 'rec'") as refused:
        await add(client, cfg, "a")
    assert 1.0 < refused.value.retry_after_s <= 2.0  # a token every 2 s
    await add(client, cfg, "b")  # another tenant has a bucket of its own


async def test_a_fast_bucket_refills(client: AsyncClient, aredis: aioredis.Redis, settings: Settings) -> None:
    cfg = config(gold={"requests_per_s": 1000, "burst": 1})
    await add(client, cfg, "gold")
    # The bucket's state is a hash of two fields that expires once the bucket would be full again.
    bucket = await aredis.hgetall(settings.keys.tenant_bucket(NAME, "gold"))
    assert set(bucket) == {b"tokens", b"at"} and float(bucket[b"tokens"]) < 1
    assert 0 < await aredis.pttl(settings.keys.tenant_bucket(NAME, "gold")) <= 1001
    admitted = 0
    for _ in range(50):
        try:
            await add(client, cfg, "gold")
            admitted += 1
        except RateLimitedError:
            pass
    assert admitted >= 1  # 1,000 a second: the next token comes within a millisecond


async def test_a_tenants_held_requests_are_bounded_and_each_frees_its_place(
    client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    cfg = config(default={"max_queued": 2})
    held_key = settings.keys.tenant_held(NAME, "a")
    await add(client, cfg, "a")
    await add(client, cfg, "a")
    with pytest.raises(
        RateLimitedError,
        match="tenant 'a' has reached its max_queued of 2 requests queued or running on deployment 'rec'",
    ) as e:
        await add(client, cfg, "a")
    assert e.value.retry_after_s == 1.0
    await add(client, cfg, "b")
    tokens = await aredis.zrange(held_key, 0, -1)
    assert len(tokens) == 2
    # A replica that finishes one removes its token (workers/serving.py): room for one more.
    await aredis.zrem(held_key, tokens[0])
    await add(client, cfg, "a")


async def test_a_held_request_past_its_deadline_counts_no_more(client: AsyncClient) -> None:
    cfg = config(default={"max_queued": 1})
    await add(client, cfg, "a", deadline_ms=now_ms() + 30)  # queued, and never run before its deadline
    with pytest.raises(RateLimitedError):
        await add(client, cfg, "a")
    await _until_passed(now_ms() + 60)
    await add(client, cfg, "a")


async def _until_passed(when_ms: int) -> None:
    from tests.harness.waiting import wait_for_async

    async def passed() -> bool:
        return now_ms() > when_ms

    await wait_for_async(passed, 2, "the clock did not move")


async def test_a_refusal_names_the_tenant_as_limited_for_a_minute(
    client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    cfg = config(default={"max_queued": 1})
    await add(client, cfg, "a")
    with pytest.raises(RateLimitedError):
        await add(client, cfg, "a")
    limited = await aredis.zrange(settings.keys.limited_tenants(NAME), 0, -1, withscores=True)
    assert [tenant for tenant, _ in limited] == [b"a"]
    assert now_ms() - LIMITED_SHOWN_MS < limited[0][1] <= now_ms()


async def test_a_full_queue_is_503_and_takes_no_token(client: AsyncClient, aredis: aioredis.Redis) -> None:
    cfg = config(default={"requests_per_s": 0.001, "burst": 1}).model_copy(update={"max_queued_requests": 1})
    await add(client, cfg.model_copy(update={"tenant_limits": {}}), "x")  # fills the queue, outside the limits
    with pytest.raises(OverloadedError) as full:
        await add(client, cfg, "a")
    assert not isinstance(full.value, RateLimitedError)
    await aredis.xtrim(client._keys.requests(NAME), maxlen=0)
    await add(client, cfg, "a")  # its one token was still there


async def test_a_request_cancelled_while_queued_frees_its_tenants_place(
    client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    cfg = config(default={"max_queued": 1})
    request = Request("r", "", now_ms() + 60_000, b"1", tenant="a")
    entry_id = await client._add(cfg, request)
    assert request.held and await aredis.zcard(settings.keys.tenant_held(NAME, "a")) == 1
    assert client._canceller is not None
    assert await client._canceller.cancel(NAME, entry_id, "r", request) == "queued"
    assert await aredis.zcard(settings.keys.tenant_held(NAME, "a")) == 0
    await add(client, cfg, "a")
