"""A real replica and a real client over a real redis-server."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis

import streamserve
from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import (
    BadRequestError,
    ConfigError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RemoteError,
    RequestTimeoutError,
    UnavailableError,
)
from streamserve.wire.keys import CONSUMER_GROUP
from streamserve.wire.messages import Reply, ReplyStatus, Request, now_ms
from tests import deployments
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import StartReplica, deploy


async def test_call_returns_the_result_with_user_config(start_replica: StartReplica, client: AsyncClient) -> None:
    await start_replica(user_config={"greeting": "hi"}, init_kwargs={"tag": "t1"})
    assert await client.call("rec", {"x": [1, 2]}) == {"tag": "t1", "body": {"x": [1, 2]}, "config": {"greeting": "hi"}}


async def test_a_client_closed_starts_again_when_used(start_replica: StartReplica, settings: Settings) -> None:
    """Used after aclose(), or entered again, an AsyncClient connects anew (it queued its request and waited out the
    whole timeout: the reply reader was gone)."""
    await start_replica()
    client = AsyncClient(settings=settings)
    async with client:
        assert (await client.call("rec", 1, timeout=10))["body"] == 1
    assert (await client.call("rec", 2, timeout=10))["body"] == 2
    await client.aclose()
    async with client:
        assert (await client.call("rec", 3, timeout=10))["body"] == 3
    await client.aclose()  # (twice: nothing to close)


async def test_user_exception_becomes_remote_error_and_replica_keeps_serving(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    replica = await start_replica()
    with pytest.raises(RemoteError) as info:
        await client.call("rec", 7, method="boom")
    assert info.value.error_type == "ValueError"
    assert info.value.message == "boom: 7"
    assert info.value.replica_id == replica.replica_id.to_str()
    assert (await client.call("rec", 1))["body"] == 1


async def test_awkward_handler_outcomes_are_clear_answers_and_serving_goes_on(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    await start_replica(import_path="tests.deployments:Awkward")
    with pytest.raises(RemoteError) as info:
        await client.call("rec", 1, method="not_json")
    assert info.value.error_type == "TypeError"
    with pytest.raises(RemoteError) as info:
        await client.call("rec", 1, method="no_body")
    assert info.value.error_type == "TypeError"
    assert "argument" in info.value.message
    assert await client.call("rec", 5, method="lazy") == {"later": 5}
    assert await client.call("rec", "still serving") == "still serving"


async def test_unknown_method_and_private_method_are_bad_requests(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    await start_replica()
    with pytest.raises(BadRequestError, match="no public method 'nope'"):
        await client.call("rec", 1, method="nope")
    with pytest.raises(BadRequestError, match="no public method '__init__'"):
        await client.call("rec", 1, method="__init__")
    for sending in (client.call, client.send, client.submit_job):
        with pytest.raises(BadRequestError, match=r"method must be a method's name \(a string\), got 123"):
            await sending("rec", 1, method=123)


async def test_the_lifecycle_hooks_are_not_for_requests(start_replica: StartReplica, client: AsyncClient) -> None:
    """A caller could set one replica's user_config apart from the others' with ``method="reconfigure"``."""
    await start_replica(user_config={"v": 1})
    with pytest.raises(
        BadRequestError, match=r"Recorder\.reconfigure is called by the replica itself, not by requests"
    ):
        await client.call("rec", {"v": "mine"}, method="reconfigure")
    with pytest.raises(BadRequestError, match=r"Recorder\.check_health is called by the replica itself"):
        await client.call("rec", None, method="check_health")
    assert (await client.call("rec", 1))["config"] == {"v": 1}


async def test_sync_handlers_run_concurrently_up_to_max_ongoing(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    # Rendezvous(4) returns only when 4 calls run at once: a serial replica would time out instead.
    await start_replica(import_path="tests.deployments:Rendezvous", init_args=[4], max_ongoing_requests=4)
    results = await asyncio.gather(*(client.call("rec", i, timeout=20) for i in range(4)))
    assert sorted(results) == [0, 1, 2, 3]


async def test_replica_never_holds_more_than_max_ongoing(
    start_replica: StartReplica, client: AsyncClient, settings: Settings, aredis: aioredis.Redis
) -> None:
    deployments.GATE = asyncio.Event()
    await start_replica(import_path="tests.deployments:gate", max_ongoing_requests=2)
    calls = [asyncio.ensure_future(client.call("rec", i)) for i in range(6)]
    stream = settings.keys.requests("rec")

    async def two_pending_four_waiting() -> bool:
        pending = await aredis.xpending(stream, CONSUMER_GROUP)
        return pending["pending"] == 2 and await aredis.xlen(stream) == 6

    await wait_for_async(two_pending_four_waiting, 10)
    deployments.GATE.set()
    assert sorted(await asyncio.gather(*calls)) == [0, 1, 2, 3, 4, 5]
    assert await aredis.xlen(stream) == 0  # acknowledged entries are deleted, not left to pile up


async def test_expired_request_is_answered_without_running_user_code(
    start_replica: StartReplica, client: AsyncClient, settings: Settings, aredis: aioredis.Redis
) -> None:
    deployments.CALLS.clear()
    await start_replica()
    await client.start()
    reply_stream = settings.keys.reply_stream(client.caller_id)
    stale = Request("stale-1", reply_to=reply_stream, deadline_ms=now_ms() - 1000, body=b'"late"')
    await aredis.xadd(settings.keys.requests("rec"), stale.encode())

    async def replied() -> bool:
        entries = await aredis.xrange(reply_stream)
        return any(fields.get(b"id") == b"stale-1" for _id, fields in entries)

    await wait_for_async(replied, 10)
    entries = await aredis.xrange(reply_stream)
    status = next(f[b"status"] for _i, f in entries if f.get(b"id") == b"stale-1")
    assert status == b"deadline_exceeded"
    assert "late" not in deployments.CALLS


async def test_malformed_entry_is_dropped_and_serving_continues(
    start_replica: StartReplica, client: AsyncClient, settings: Settings, aredis: aioredis.Redis
) -> None:
    await start_replica()
    await aredis.xadd(settings.keys.requests("rec"), {"garbage": "yes"})
    assert (await client.call("rec", "after"))["body"] == "after"
    pending = await aredis.xpending(settings.keys.requests("rec"), CONSUMER_GROUP)
    assert pending["pending"] == 0


@pytest.mark.parametrize(
    "bad",
    [{"v": "999"}, {"deadline_ms": "soon"}, {"priority": "urgent"}, {"attempts": "x"}],
    ids=["another schema version", "a bad deadline", "a bad priority", "bad attempts"],
)
async def test_a_malformed_entry_that_says_whom_to_answer_is_answered_400(
    bad: dict[str, str], start_replica: StartReplica, settings: Settings, aredis: aioredis.Redis
) -> None:
    """Its caller (a producer of another version, say) is told at once, not left to wait out its deadline."""
    await start_replica()
    deployments.CALLS.clear()
    reply_stream = "streamserve:replies:malformed-test"
    await aredis.xadd(reply_stream, {"opened": "1"})
    fields = {"v": "1", "id": "bad-1", "reply_to": reply_stream, "deadline_ms": str(now_ms() + 30_000)}
    await aredis.xadd(settings.keys.requests("rec"), {**fields, "body": "1", "tag": "t9", **bad})

    async def answered() -> list[Reply]:
        return [Reply.decode(f) for _i, f in (await aredis.xrange(reply_stream))[1:]]

    await wait_for_async(answered, 10, "the malformed entry's caller was never answered")
    [reply] = await answered()
    assert (reply.request_id, reply.tag, reply.status) == ("bad-1", "t9", ReplyStatus.BAD_REQUEST)
    assert reply.error_message.startswith("the request could not be read, and was not run: ")
    assert deployments.CALLS == []


async def test_a_request_whose_caller_timed_out_leaves_the_queue(
    settings: Settings, client: AsyncClient, aredis: aioredis.Redis, start_replica: StartReplica
) -> None:
    """Past its deadline it would never run, yet it stayed queued until a replica read it: a deployment scaled to
    zero was started (by its autoscaler, or KEDA) for callers long gone. A keyed one held its key as long."""
    await deploy(settings)  # no replica: nothing reads the queue
    stream = settings.keys.requests("rec")
    for key in (None, "k-late"):
        with pytest.raises(RequestTimeoutError):
            await client.call("rec", {"late": key}, timeout=0.3, idempotency_key=key)

        async def left() -> bool:
            return await aredis.xlen(stream) == 0

        await wait_for_async(left, 10, "the timed-out request stayed queued")
    deployments.CALLS.clear()
    await start_replica()
    assert (await client.call("rec", {"late": "k-late"}, idempotency_key="k-late"))["body"] == {"late": "k-late"}
    assert deployments.CALLS == [{"late": "k-late"}]  # its key was freed: the retry ran


async def test_drain_finishes_in_flight_work_on_stop(
    start_replica: StartReplica, client: AsyncClient, aredis: aioredis.Redis, settings: Settings
) -> None:
    deployments.GATE = asyncio.Event()
    replica = await start_replica(import_path="tests.deployments:gate")
    call = asyncio.ensure_future(client.call("rec", "in flight"))

    async def held() -> bool:
        return (await aredis.xpending(settings.keys.requests("rec"), CONSUMER_GROUP))["pending"] == 1

    await wait_for_async(held, 10)
    replica.request_stop()
    await asyncio.sleep(0)  # the replica is draining; now let the handler finish
    deployments.GATE.set()
    assert await call == "in flight"


async def test_full_queue_is_refused_at_once(client: AsyncClient, settings: Settings) -> None:
    await deploy(settings, max_queued_requests=2)  # no replica: nothing is taken off the queue
    await client.send("rec", 1)
    await client.send("rec", 2)
    with pytest.raises(OverloadedError, match="max_queued_requests"):
        await client.send("rec", 3)


async def test_unknown_and_scaled_to_zero(client: AsyncClient, settings: Settings) -> None:
    with pytest.raises(NotFoundError):
        await client.call("nothing-here", 1)
    await deploy(settings, num_replicas=0)

    async def known() -> bool:
        return "rec" in client.deployments()

    await wait_for_async(known, 10)
    with pytest.raises(UnavailableError, match="scaled to 0"):
        await client.call("rec", 1)


async def test_a_call_queued_before_its_deployment_was_scaled_to_0_is_told_so_at_its_deadline(
    client: AsyncClient, settings: Settings
) -> None:
    await deploy(settings)  # no replica: the call stays queued
    call = asyncio.ensure_future(client.call("rec", 1, timeout=2))
    await deploy(settings, num_replicas=0)
    await wait_for_async(lambda: asyncio.sleep(0, client.deployments()["rec"].num_replicas == 0), 10)
    with pytest.raises(RequestTimeoutError) as timed_out:
        await call
    assert str(timed_out.value).endswith("): deployment 'rec' is scaled to 0 replicas"), timed_out.value


async def test_timeout_when_nobody_serves(client: AsyncClient, settings: Settings) -> None:
    await deploy(settings)
    with pytest.raises(RequestTimeoutError, match=r"no reply within 0\.2s"):
        await client.call("rec", 1, timeout=0.2)


async def test_more_concurrent_calls_than_pooled_connections_all_succeed(
    start_replica: StartReplica, client: AsyncClient
) -> None:
    await start_replica(max_ongoing_requests=16)
    results = await asyncio.gather(*(client.call("rec", i) for i in range(500)))
    assert [r["body"] for r in results] == list(range(500))


async def test_bad_input_from_python_is_a_clear_streamserve_error(
    start_replica: StartReplica, client: AsyncClient, settings: Settings
) -> None:
    await start_replica()
    with pytest.raises(BadRequestError, match="cannot be sent as JSON"):
        await client.call("rec", {"x": object()})
    bad_timeouts: tuple[object, ...] = (0, -1, float("nan"), float("inf"), 1e16, "5", True, [1])
    for timeout in bad_timeouts:  # 1e16 s once crashed a job worker; "5" was a bare TypeError
        with pytest.raises(BadRequestError, match="timeout must be a positive number of seconds"):
            await client.call("rec", 1, timeout=timeout)  # type: ignore[arg-type]
        with pytest.raises(BadRequestError, match="timeout must be a positive number of seconds"):
            await client.send("rec", 1, timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="deployment 'rec': num_replicas"):
        await client.scale("rec", -1)
    for name in (None, 123, b"rec"):  # was redis-py's DataError, outside our errors
        with pytest.raises(BadRequestError, match="name is a string"):
            await client.call(name, 1)  # type: ignore[arg-type]
        with pytest.raises(BadRequestError, match="name is a string"):
            streamserve.handle(name)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError, match="no deployment or endpoint named 'a\\\\udcffb'"):  # (not UTF-8)
        await client.call("a\udcffb", 1)
    with pytest.raises(BadRequestError, match="method 'a\\\\ud800' is not a method's name"):
        await client.call("rec", 1, method="a\ud800")
    admin_writes: list[tuple[Callable[[], Awaitable[object]], type[Exception], str]] = [
        (lambda: client.delete(None), BadRequestError, "a deployment or endpoint's name is a string, got None"),  # type: ignore[arg-type]
        (lambda: client.delete("a\udcff"), NotFoundError, "no deployment or endpoint named"),
        (lambda: client.scale(None, 1), BadRequestError, "a deployment's name is a string, got None"),  # type: ignore[arg-type]
        (lambda: client.scale("rec", "2"), BadRequestError, "num_replicas is a whole number, got '2'"),  # type: ignore[arg-type]
        (lambda: client.set_traffic(5, {"rec": 1}), BadRequestError, "an endpoint's name is a string, got 5"),  # type: ignore[arg-type]
        (lambda: client.wait_for_goal(5), BadRequestError, "a goal id is a string"),  # type: ignore[arg-type]
        (lambda: client.wait_for_goal("g", timeout="2"), BadRequestError, "timeout is a number of seconds"),  # type: ignore[arg-type]
        (lambda: client.deploy({"deployments": []}), BadRequestError, "deploy takes an AppConfig or a YAML"),  # type: ignore[arg-type]
    ]
    for write, error, message in admin_writes:  # were AttributeError, TypeError and redis-py's DataError
        with pytest.raises(error, match=re.escape(message)):
            await write()
    await client.set_traffic("rec-ep", {"rec": 1})
    assert await client.delete("rec-ep") is None  # an endpoint, deleted at once (it said no deployment was so named)
    with pytest.raises(NotFoundError, match="no deployment or endpoint named 'rec-ep'"):
        await client.delete("rec-ep")
    assert await client.scale("rec", 2) is not None  # (no scheduler runs here: that goal is never reached)
    assert await client.wait_for_goal(await client.scale("rec", 2), timeout=5) is None  # (README: no change)
    with pytest.raises(ConfigError, match="redis_url: a Redis URL is a string, got 5"):
        AsyncClient(5)  # type: ignore[arg-type]
    async with AsyncClient(settings=settings.model_copy(update={"max_request_bytes": 100})) as small:
        with pytest.raises(PayloadTooLargeError, match="above max_request_bytes"):
            await small.call("rec", "x" * 200)
        with pytest.raises(PayloadTooLargeError):
            await small.send("rec", "x" * 200)


async def test_a_user_config_with_no_reconfigure_to_take_it_is_warned_about(
    start_replica: StartReplica, client: AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A function has no reconfigure(): its user_config reaches no code (it still keys the response cache), said once
    its replica loads instead of ignored without a word."""
    with caplog.at_level(logging.WARNING, logger="streamserve.workers.serving"):
        await start_replica(import_path="tests.deployments:pid", user_config={"a": 1})
    assert await client.call("rec", None) == os.getpid()
    assert (
        "deployment 'rec' has a user_config, but tests.deployments:pid has no reconfigure(user_config) method to take "
        "it: it reaches no code"
    ) in caplog.text
