"""docs/api.md: a client's methods raise StreamServeErrors, never redis-py's own: its admin writes and status
reads as its calls do (a Redis away is RedisUnavailableError), and a URL naming a database the server does not have
is a ConfigError saying so, whichever method met it first."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
import redis

from streamserve.client import AsyncClient
from streamserve.runtime.settings import Settings
from streamserve.transport import connections
from streamserve.wire.errors import ConfigError, RedisUnavailableError
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


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking client", "asyncio client"])
async def test_a_rediss_url_at_a_redis_without_tls_fails_within_the_connect_timeout(
    redis_url: str, blocking: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server takes the TLS handshake for a command it waits to see end, and never answers: a job worker (the
    blocking client) waited for good, every other role 30-70 s. Each attempt now ends at the connect timeout."""
    monkeypatch.setattr(connections, "CONNECT_TIMEOUT_S", 0.3)
    monkeypatch.setattr(connections, "RETRY_ATTEMPTS", 1)
    url = redis_url.replace("redis://", "rediss://", 1)
    started = time.monotonic()
    if blocking:
        client = connections.sync_redis(url)
        with pytest.raises(redis.RedisError, match="Timeout"):
            await asyncio.wait_for(asyncio.to_thread(client.ping), WITHIN_S)
        client.close()
    else:
        aclient = connections.async_redis(url)
        with pytest.raises(redis.RedisError, match="Timeout"):
            await asyncio.wait_for(aclient.ping(), WITHIN_S)
        await aclient.aclose()
    assert time.monotonic() - started < WITHIN_S
