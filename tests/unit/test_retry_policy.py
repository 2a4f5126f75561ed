"""The shared retry policy runs once per operation: redis-py's reconnect inside a command's retry loop tries once."""

from __future__ import annotations

import asyncio

import pytest
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from streamserve.transport.connections import RETRY_ATTEMPTS, OutermostAsyncRetry, OutermostRetry


def test_a_retry_loop_inside_another_one_tries_once() -> None:
    retry = OutermostRetry(NoBackoff(), RETRY_ATTEMPTS)
    connects, failures = 0, []

    def connect() -> None:  # what redis-py does, with the connection's policy, when a command finds it lost
        nonlocal connects
        connects += 1
        raise RedisConnectionError("refused")

    def command() -> None:
        retry.call_with_retry(connect, failures.append)

    with pytest.raises(RedisConnectionError):
        retry.call_with_retry(command, failures.append)
    assert connects == RETRY_ATTEMPTS + 1  # not (RETRY_ATTEMPTS + 1) ** 2
    assert len(failures) == 2 * (RETRY_ATTEMPTS + 1)  # every failed attempt still gets its clean-up
    assert retry.call_with_retry(lambda: "alone", failures.append) == "alone"


async def test_an_async_retry_loop_inside_another_one_in_the_same_task_tries_once() -> None:
    retry = OutermostAsyncRetry(NoBackoff(), RETRY_ATTEMPTS)
    connects = 0

    async def connect() -> None:
        nonlocal connects
        connects += 1
        raise RedisConnectionError("refused")

    async def command() -> None:
        await retry.call_with_retry(connect, _ignore)

    with pytest.raises(RedisConnectionError):
        await retry.call_with_retry(command, _ignore)
    assert connects == RETRY_ATTEMPTS + 1


async def test_a_task_started_inside_a_retry_loop_has_a_retry_loop_of_its_own() -> None:
    retry = OutermostAsyncRetry(NoBackoff(), RETRY_ATTEMPTS)
    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts <= RETRY_ATTEMPTS:
            raise RedisConnectionError("refused")
        return "done"

    async def starts_a_task() -> str:
        return await asyncio.create_task(retry.call_with_retry(flaky, _ignore))

    assert await retry.call_with_retry(starts_a_task, _ignore) == "done"
    assert attempts == RETRY_ATTEMPTS + 1


async def _ignore(_error: Exception) -> None:
    return None
