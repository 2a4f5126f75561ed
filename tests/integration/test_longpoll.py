"""Long poll: a subscriber that loses its connection catches up by comparing snapshot ids."""

from __future__ import annotations

import redis.asyncio as aioredis

from streamserve.control.long_poll import EVERYTHING, LongPollSubscriber, announce, bump_snapshot_id
from streamserve.wire.keys import ConfigKey, Keys
from tests.harness.waiting import wait_for_async

KEYS = Keys()


async def change(redis: aioredis.Redis, key: str) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        bump_snapshot_id(pipe, KEYS, key)
        [snapshot_id] = await pipe.execute()
    await announce(redis, KEYS, {key: snapshot_id})


async def test_sees_changes_and_catches_up_after_losing_its_connection(redis_url: str) -> None:
    seen: list[set[str]] = []

    async def on_change(changed: set[str]) -> None:
        seen.append(changed)

    sub_redis = aioredis.Redis.from_url(redis_url)
    writer = aioredis.Redis.from_url(redis_url)
    # A long resync interval: only the pub/sub message or the reconnect can deliver the change in time.
    sub = LongPollSubscriber(sub_redis, KEYS, lambda k: k != "ignored", on_change, resync_interval_s=60)
    try:
        await sub.start()
        assert seen == [{EVERYTHING}]

        async def subscribed() -> bool:
            return bool((await writer.pubsub_numsub(KEYS.config_channel()))[0][1])

        # Subscribed before the change: only its message can bring it.
        await wait_for_async(subscribed, 4, "the subscriber did not subscribe")
        await change(writer, ConfigKey.DEPLOYMENTS)
        await wait_for_async(lambda: len(seen) == 2, 10)
        assert seen[1] == {ConfigKey.DEPLOYMENTS}

        await change(writer, "ignored")
        # Drop every pub/sub connection, and change config while the subscriber is away.
        await writer.client_kill_filter(_type="pubsub")
        await change(writer, ConfigKey.ENDPOINTS)
        await wait_for_async(lambda: any(ConfigKey.ENDPOINTS in s for s in seen), 10)
        assert all("ignored" not in s for s in seen)
    finally:
        await sub.close()
        await sub_redis.aclose()
        await writer.aclose()


async def test_a_change_it_cannot_take_is_tried_again_and_the_next_is_seen(redis_url: str) -> None:
    """A change whose handling fails with no Redis error (a config written by hand, or by another version) ended the
    subscription: routes went stale for good, and an AsyncClient took the ended task for its loop's end."""
    seen: list[set[str]] = []
    failures = [1]  # the first change after the start fails once

    async def on_change(changed: set[str]) -> None:
        if changed != {EVERYTHING} and failures:
            failures.pop()
            raise ValueError("a config this version cannot read")
        seen.append(changed)

    sub_redis = aioredis.Redis.from_url(redis_url)
    writer = aioredis.Redis.from_url(redis_url)
    sub = LongPollSubscriber(sub_redis, KEYS, lambda k: True, on_change, resync_interval_s=60)
    try:
        await sub.start()

        async def subscribed() -> bool:
            return bool((await writer.pubsub_numsub(KEYS.config_channel()))[0][1])

        await wait_for_async(subscribed, 4, "the subscriber did not subscribe")
        await change(writer, ConfigKey.DEPLOYMENTS)  # fails, and is tried again (resubscribed: a full sync)
        await wait_for_async(lambda: len(seen) >= 2, 10, lambda: f"nothing seen after the failure: {seen}")
        await wait_for_async(subscribed, 10, "the subscriber did not subscribe again")
        await change(writer, ConfigKey.ENDPOINTS)
        await wait_for_async(lambda: any(ConfigKey.ENDPOINTS in s for s in seen), 10, lambda: f"seen: {seen}")
    finally:
        await sub.close()
        await sub_redis.aclose()
        await writer.aclose()
