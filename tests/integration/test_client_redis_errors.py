"""docs/api.md: a client's methods raise StreamServeErrors, never redis-py's own: its admin writes and status
reads as its calls do (a Redis away is RedisUnavailableError), and a URL naming a database the server does not have
is a ConfigError saying so, whichever method met it first."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import redis

from streamserve.client import AsyncClient, reply_stream, shared_calls
from streamserve.runtime.embedded_redis import EmbeddedRedis, redis_server_binary
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from streamserve.transport import connections
from streamserve.wire.errors import ConfigError, RedisUnavailableError, RequestTimeoutError, StreamServeError
from streamserve.wire.messages import Request
from tests.harness.waiting import wait_for_async
from tests.integration.conftest import deploy
from tests.integration.test_gateway_health_and_urls import redis_server
from tests.integration.test_redis_config_warning import start_redis

# A bound on what must end within a call's 1 s timeout: far below the connection's retries (about 30 s).
WITHIN_S = 10


async def test_calls_status_and_admin_writes_with_redis_away_are_redis_unavailable(tmp_path: Path) -> None:
    server = start_redis(tmp_path, "--save", "")
    client = AsyncClient(settings=Settings(redis_url=next(server)))
    await client.start()
    try:
        server.close()  # the server is stopped, by id
        # A call of a name the client has not seen looks it up in Redis first: that too.
        calls = (client.call("unseen", 1, timeout=10), client.status(), client.scale("echo", 2))
        for method in (*calls, client.wait_for_goal("g", timeout=1)):
            with pytest.raises(RedisUnavailableError, match="cannot reach Redis"):
                await method
    finally:
        await client.aclose()


async def test_a_redis_user_lacking_a_permission_is_a_streamserve_error(tmp_path: Path) -> None:
    """A Redis user that may read but not write: a call raised redis-py's NoPermissionError, which is no
    StreamServeError (docs/api.md: a client's methods raise those). It is one now, naming the URL and the fix."""
    port = free_port()
    read_only = ["reader", "on", ">readerpw", "~*", "&*", "-@all", "+@read", "+@connection"]
    args = ["--port", str(port), "--requirepass", "secret", "--user", *read_only]
    with redis_server(redis_server_binary(), args, f"redis://:secret@127.0.0.1:{port}/0", tmp_path):
        url = f"redis://reader:readerpw@127.0.0.1:{port}/0"
        client = AsyncClient(settings=Settings(redis_url=url))
        try:
            with pytest.raises(StreamServeError, match="its user lacks a permission streamserve needs") as raised:
                await client.call("echo", 1, timeout=5)
        finally:
            await client.aclose()
    assert "readerpw" not in str(raised.value)


@pytest.mark.parametrize("method", ["call", "status", "scale"])
async def test_a_database_the_server_does_not_have_is_named(settings: Settings, redis_url: str, method: str) -> None:
    url = redis_url.rsplit("/", 1)[0] + "/99"
    client = AsyncClient(settings=settings.model_copy(update={"redis_url": url}))
    try:
        with pytest.raises(ConfigError, match="has no database of the number its URL names"):
            if method == "call":
                await client.call("echo", 1)
            elif method == "status":
                await client.status()
            else:
                await client.scale("echo", 2)
    finally:
        await client.aclose()


async def test_a_calls_timeout_bounds_reaching_a_redis_that_never_answers(settings: Settings) -> None:
    """A server that takes the connection and never answers (a Redis stopped, a plain port named by rediss://): the
    first call of a client, with timeout=1, waited out the half minute of the connection's retries."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # (never accepted: the kernel completes the connections, and nobody answers)
    url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    client = AsyncClient(settings=settings.model_copy(update={"redis_url": url}))
    try:
        with pytest.raises(RedisUnavailableError, match=r"within the call's timeout \(1s\)"):
            await asyncio.wait_for(client.call("echo", 1, timeout=1), WITHIN_S)
        with pytest.raises(RedisUnavailableError, match=r"within the call's timeout \(1s\)"):
            await asyncio.wait_for(client.send("echo", 1, timeout=1), WITHIN_S)
    finally:
        await asyncio.wait_for(client.aclose(), WITHIN_S)
        silent.close()


async def test_a_calls_timeout_holds_when_the_redis_it_is_connected_to_stops_answering() -> None:
    """A client already connected, whose Redis stops answering without closing (here SIGSTOP): a call with
    timeout=1 waited 31 s for its enqueue (the socket timeout and the connection's retries). It ends at its deadline
    now, keyed or not; and what Redis queued once it answered again is cancelled: it never runs."""
    server = EmbeddedRedis(port=free_port()).start()
    try:
        assert server.proc is not None
        settings = Settings(redis_url=server.url)
        cfg = await deploy(settings)  # no replica: what is queued stays queued
        requests = settings.keys.requests(cfg.name)
        async with AsyncClient(settings=settings) as client:
            with pytest.raises(RequestTimeoutError):  # (connected, and the route known)
                await client.call(cfg.name, "before", timeout=0.5)
            server.proc.send_signal(signal.SIGSTOP)
            try:
                for key in (None, "k1"):
                    call = client.call(cfg.name, "stalled", timeout=1, idempotency_key=key)
                    with pytest.raises(RedisUnavailableError, match=r"did not take request \w+ within the call's"):
                        await asyncio.wait_for(call, WITHIN_S)
            finally:
                server.proc.send_signal(signal.SIGCONT)
            await client._cancels_sent(WITHIN_S)
            queued = await client.redis.xrange(requests)
        assert queued == [], f"requests left queued after their callers gave up: {queued}"
    finally:
        server.stop()


async def test_a_rediss_url_at_a_port_of_plain_redis_says_so_after_one_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each connection attempt waited out its TLS handshake (a plain Redis waits for a command): the client, the CLI
    and every role said so only after the retries, 34-72 s. A plain-text look at the port tells at the first one."""
    monkeypatch.setattr(connections, "CONNECT_TIMEOUT_S", 1.0)
    server = EmbeddedRedis(port=free_port()).start()
    try:
        tls_url = server.url.replace("redis://", "rediss://", 1)
        plain = "speaks plain Redis, not TLS: its URL starts with redis://"
        client = AsyncClient(tls_url)
        try:
            with pytest.raises(RedisUnavailableError, match=plain):
                await asyncio.wait_for(client.call("rec", 1, timeout=60), WITHIN_S)
        finally:
            await client.aclose()
        blocking = connections.sync_redis(tls_url)
        try:
            with pytest.raises(connections.PlainRedisAtTLSPort, match=plain):
                await asyncio.wait_for(asyncio.to_thread(blocking.ping), WITHIN_S)
        finally:
            blocking.close()
    finally:
        server.stop()


async def test_a_timeout_too_short_for_any_redis_is_the_deadlines_not_redis_fault(settings: Settings) -> None:
    """X-Request-Timeout: 0.001 (or timeout=) passed before the healthy, idle Redis took the enqueue, and the caller
    got 503 RedisUnavailableError blaming it (a monitor counting 503s saw an outage): it is 504 now."""
    cfg = await deploy(settings)  # no replica: what is queued stays queued
    async with AsyncClient(settings=settings) as client:
        with pytest.raises(RequestTimeoutError):  # (connected, and the route known)
            await client.call(cfg.name, "before", timeout=0.2)
        with pytest.raises(RequestTimeoutError, match=r"timeout \(1e-06s\) passed before request \w+ was queued"):
            await asyncio.wait_for(client.call(cfg.name, "short", timeout=1e-6), WITHIN_S)
        await client._cancels_sent(WITHIN_S)
        assert await client.redis.xlen(settings.keys.requests(cfg.name)) == 0  # both cancelled: nobody waits


async def test_calls_a_hanging_redis_failed_are_cancelled_once_it_answers_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that hangs (SIGSTOP) under load: the reply reader told the callers waiting that their replies could
    not reach them (503, and they may send their requests again), and so was a call whose enqueue Redis had read but
    not answered (its round trip gave up). Once Redis went on, both requests ran all the same: the one queued before,
    and the one Redis queued then. Both are cancelled now, and neither is left queued to run."""
    monkeypatch.setattr(reply_stream, "REPLY_OUTAGE_FAIL_S", 0.5)
    monkeypatch.setattr(connections, "CONNECT_TIMEOUT_S", 0.5)
    caplog.set_level(logging.INFO, logger="streamserve.client.cancels")
    server = EmbeddedRedis(port=free_port()).start()
    try:
        assert server.proc is not None
        settings = Settings(redis_url=f"{server.url}?socket_timeout=0.5")
        cfg = await deploy(settings)  # no replica: what is queued stays queued
        requests = settings.keys.requests(cfg.name)
        async with AsyncClient(settings=settings) as client:
            queued = asyncio.ensure_future(client.call(cfg.name, "queued", timeout=120))
            await wait_for_async(lambda: _holds(client, requests, 1), WITHIN_S)
            server.proc.send_signal(signal.SIGSTOP)
            try:
                late = asyncio.ensure_future(client.call(cfg.name, "late", timeout=120))
                for call in (queued, late):  # (both long before their deadline)
                    with pytest.raises(RedisUnavailableError):
                        await asyncio.wait_for(call, 3 * WITHIN_S)
                # Until an attempt to cancel has failed: the hang outlasts the connection's retries.
                await wait_for_async(lambda: _retried_cancel(caplog), 3 * WITHIN_S)
            finally:
                server.proc.send_signal(signal.SIGCONT)
            await client._cancels_sent(3 * WITHIN_S)
            left = await client.redis.xrange(requests)
        assert left == [], f"requests left queued after their callers were told they failed: {left}"
    finally:
        server.stop()


async def test_a_caller_cut_off_when_its_farm_is_gone_is_not_promised_a_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`up` killed -9: its gateway cannot cancel anything before it goes too, and the request runs when the farm is
    back. The gateway's callers were told it would be cancelled, and a plain retry ran it twice (found by an outside
    tester)."""
    monkeypatch.setattr(reply_stream, "REPLY_OUTAGE_FAIL_S", 0.5)
    monkeypatch.setattr(connections, "CONNECT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(connections, "_GIVEN_UP", threading.Event())
    server = EmbeddedRedis(port=free_port()).start()
    try:
        settings = Settings(redis_url=server.url)
        cfg = await deploy(settings)  # no replica: what is queued stays queued
        async with AsyncClient(settings=settings) as client:
            queued = asyncio.ensure_future(client.call(cfg.name, "queued", timeout=120))
            await wait_for_async(lambda: _holds(client, settings.keys.requests(cfg.name), 1), WITHIN_S)
            connections.stop_retrying()  # (what a gateway does once its `up` is gone)
            server.stop()
            with pytest.raises(RedisUnavailableError, match="the request cannot be cancelled: it may run when"):
                await asyncio.wait_for(queued, 3 * WITHIN_S)
    finally:
        server.stop()


async def _holds(client: AsyncClient, stream: str, count: int) -> bool:
    return bool(await client.redis.xlen(stream) == count)


async def _retried_cancel(caplog: pytest.LogCaptureFixture) -> bool:
    return any(record.message.startswith("cancelling request") for record in caplog.records)


async def test_a_look_at_a_shared_runs_record_gives_up_when_redis_stops_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A keyed call that joined another's run looks at the run's record now and then, and once more at its deadline:
    with its Redis stopped, each look held the call for half a minute past the deadline. A look gives up: no word."""
    monkeypatch.setattr(shared_calls, "RECORD_LOOK_S", 0.3)
    server = EmbeddedRedis(port=free_port()).start()
    try:
        assert server.proc is not None
        async with AsyncClient(settings=Settings(redis_url=server.url)) as client:
            await client.start()
            sharing = shared_calls.Sharing("rec:record", "rec:waiters", digest="d")
            request = Request("r1", "", 0, b"1", "", tag="1")
            assert (await client.redis.ping()) is True
            server.proc.send_signal(signal.SIGSTOP)
            try:
                found = await asyncio.wait_for(shared_calls.look_at_record(client.redis, sharing, request), WITHIN_S)
            finally:
                server.proc.send_signal(signal.SIGCONT)
        assert found is None  # (the call then waits on for its copy, until its deadline)
    finally:
        server.stop()


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking client", "asyncio client"])
async def test_a_rediss_url_at_a_redis_without_tls_fails_within_the_connect_timeout(
    redis_url: str, blocking: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server takes the TLS handshake for a command it waits to see end, and never answers: a job worker (the
    blocking client) waited for good, every other role 30-70 s. An attempt now ends at the connect timeout, and a
    look at the port in plain text says why."""
    monkeypatch.setattr(connections, "CONNECT_TIMEOUT_S", 0.3)
    monkeypatch.setattr(connections, "RETRY_ATTEMPTS", 1)
    url = redis_url.replace("redis://", "rediss://", 1)
    started = time.monotonic()
    if blocking:
        client = connections.sync_redis(url)
        try:
            with pytest.raises(redis.RedisError, match="speaks plain Redis, not TLS"):
                await asyncio.wait_for(asyncio.to_thread(client.ping), WITHIN_S)
        finally:
            client.close()
    else:
        aclient = connections.async_redis(url)
        try:
            with pytest.raises(redis.RedisError, match="speaks plain Redis, not TLS"):
                await asyncio.wait_for(aclient.ping(), WITHIN_S)
        finally:
            await aclient.aclose()
    assert time.monotonic() - started < WITHIN_S
