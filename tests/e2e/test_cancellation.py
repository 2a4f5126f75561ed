"""Cancellation end to end (issue 28, item 2), through real processes: `streamserve up`, its gateway, scheduler and
replica processes, HTTP clients on raw sockets that really hang up, and the Python clients.

What a handler went through is what it recorded on a Redis list (tests/cancel_deployments.py): a test reads that
list, waiting with a bound, for what a user of the handler would see happen to it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, cast

import httpx
import orjson
import pytest
import redis

from streamserve import AsyncClient, Client
from streamserve.client.cancels import Canceller
from streamserve.errors import RequestTimeoutError, UnavailableError
from streamserve.transport.connections import async_redis
from streamserve.transport.pipelining import Pipeliner
from streamserve.transport.streams import control_command
from streamserve.wire.keys import CONSUMER_GROUP, Keys
from streamserve.wire.messages import CancelRequest, Request, now_ms
from tests.cancel_deployments import events_key
from tests.harness.farm import Farm, running_farm_of
from tests.harness.paths import python_path
from tests.harness.waiting import wait_for, wait_for_async

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: await
    import_path: tests.cancel_deployments:wait_async
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: one-at-a-time
    import_path: tests.cancel_deployments:wait_async
    num_replicas: 1
    max_ongoing_requests: 1
    graceful_shutdown_timeout_s: 2
  - name: counted
    import_path: tests.cancel_deployments:wait_async
    num_replicas: 1
    max_ongoing_requests: 1
    graceful_shutdown_timeout_s: 2
  - name: loop
    import_path: tests.cancel_deployments:loop_sync
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: stubborn
    import_path: tests.cancel_deployments:ignore_sync
    num_replicas: 1
    max_ongoing_requests: 1
    graceful_shutdown_timeout_s: 2
  - name: gen-sync
    import_path: tests.cancel_deployments:gen_sync
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: gen-async
    import_path: tests.cancel_deployments:gen_async
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: counted-gen
    import_path: tests.cancel_deployments:gen_async
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: counted-loop
    import_path: tests.cancel_deployments:loop_sync
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
"""
KEYS = Keys()
# How long a cancellation may take to reach a handler here (the promise is 100 ms; this is a loaded test machine).
REACH_S = 5.0


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm_of(CONFIG, tmp_path_factory.mktemp("cancellation")) as farm:
        yield farm


@pytest.fixture(scope="module")
def store(farm: Farm) -> Iterator[redis.Redis]:
    """The farm's Redis, where the handlers record what happens to them."""
    with redis.Redis.from_url(farm.effective_redis_url) as connection:
        yield connection


@pytest.fixture
def tag(request: pytest.FixtureRequest) -> str:
    """A name for this test's requests, unique in the module's farm."""
    return cast(str, request.node.name)


def events(store: redis.Redis, tag: str) -> list[str]:
    return [e.decode() for e in cast(list[bytes], store.lrange(events_key(tag), 0, -1))]


def wait_events(store: redis.Redis, tag: str, *expected: str, timeout_s: float = REACH_S) -> list[str]:
    """Wait until the handler of request ``tag`` has recorded each of ``expected``; all it recorded."""
    wait_for(
        lambda: set(expected) <= set(events(store, tag)),
        timeout_s,
        lambda: f"request {tag} recorded {events(store, tag)}, not all of {list(expected)}",
        interval_s=0.02,
    )
    return events(store, tag)


@contextlib.contextmanager
def hanging_up(farm: Farm, path: str, body: Any, headers: dict[str, str] | None = None) -> Iterator[socket.socket]:
    """A POST sent on a raw socket, which the caller closes (hangs up) when the block ends, answered or not."""
    payload = orjson.dumps(body)
    head = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", farm.port), timeout=30)
    try:
        sock.sendall(request + payload)
        yield sock
    finally:
        sock.close()


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    """What the server sent until ``marker`` has come (a stream's first chunk, say)."""
    received = b""
    while marker not in received:
        data = sock.recv(65536)
        assert data, f"the connection closed before {marker!r} came: {received!r}"
        received += data
    return received


def queued_entries(store: redis.Redis, deployment: str) -> int:
    """Requests of ``deployment`` that are queued or running (its request stream's entries)."""
    return int(store.xlen(KEYS.requests(deployment)))


# -- the HTTP caller hangs up --------------------------------------------------------------------------------------


def test_an_http_caller_hanging_up_cancels_its_async_handler(farm: Farm, store: redis.Redis, tag: str) -> None:
    with hanging_up(farm, "/await", {"tag": tag}):
        wait_events(store, tag, "start")
    assert wait_events(store, tag, "cancelled", "finally") == ["start", "cancelled", "finally"]


def test_a_queued_request_whose_caller_hangs_up_never_starts(farm: Farm, store: redis.Redis, tag: str) -> None:
    """One replica that runs one request at a time, kept busy: the request queued behind it is cancelled there."""
    with Client(farm.effective_redis_url) as client, holding_the_only_slot(client, store, "one-at-a-time", tag) as busy:
        cancel_while_queued(farm, store, "one-at-a-time", tag)
        assert busy.finish() == "done", "the busy request did not go on to its end"
    assert farm.post("/one-at-a-time", {"tag": f"{tag}-after", "sleep_s": 0}).json() == "done"  # had its turn after
    assert events(store, tag) == [], "the cancelled request started"
    assert events(store, f"{tag}-busy") == ["start", "done", "finally"]


class Busy:
    """A request that holds its deployment's only slot until ``finish()``."""

    def __init__(self, store: redis.Redis, hold: str, call: concurrent.futures.Future[Any]) -> None:
        self._store = store
        self._hold = hold
        self._call = call

    def cancel(self) -> None:
        """Its caller stops waiting."""
        assert self._call.cancel()

    def finish(self) -> Any:
        """Let it end; its result."""
        self._store.delete(self._hold)
        return self._call.result(timeout=30)


@contextlib.contextmanager
def holding_the_only_slot(client: Client, store: redis.Redis, deployment: str, tag: str) -> Iterator[Busy]:
    """A request (tagged ``tag``-busy) that runs until ``finish()`` or the block's end, holding ``deployment``'s
    only slot."""
    hold = f"cancel-test:hold:{tag}"
    store.set(hold, 1)
    try:
        busy = Busy(store, hold, client.submit(deployment, {"tag": f"{tag}-busy", "hold": hold}, timeout=60))
        wait_events(store, f"{tag}-busy", "start", timeout_s=10)
        yield busy
    finally:
        store.delete(hold)


def cancel_while_queued(farm: Farm, store: redis.Redis, deployment: str, tag: str) -> None:
    """Send a request that queues behind a busy one, hang up, and wait until it is gone from the queue."""
    with hanging_up(farm, f"/{deployment}", {"tag": tag, "sleep_s": 0}):
        wait_for(lambda: queued_entries(store, deployment) == 2, 10, "the request did not queue", interval_s=0.02)
    wait_for(lambda: queued_entries(store, deployment) == 1, REACH_S, "the cancelled request stayed queued")


def test_a_sync_handler_checking_cancelled_stops_early(farm: Farm, store: redis.Redis, tag: str) -> None:
    with hanging_up(farm, "/loop", {"tag": tag}):
        wait_events(store, tag, "start")
    assert wait_events(store, tag, "finally") == ["start", "stopped-early", "finally"]


# -- streams ---------------------------------------------------------------------------------------------------------


# How a generator stopped from outside ends: a sync one gets GeneratorExit at its next ``yield``; an async one,
# cancelled at once, gets asyncio.CancelledError where it awaits (between its chunks, here). Either way its ``finally``
# runs, and it never reaches its end.
CLOSED = {
    "gen-sync": ["start", "generator-exit", "finally"],
    "gen-async": ["start", "cancelled", "finally"],
}


@pytest.mark.parametrize("deployment", ["gen-sync", "gen-async"])
@pytest.mark.parametrize("accept", ["application/x-ndjson", "text/event-stream"], ids=["ndjson", "sse"])
def test_an_http_stream_reader_hanging_up_closes_the_generator(
    farm: Farm, store: redis.Redis, tag: str, deployment: str, accept: str
) -> None:
    with hanging_up(farm, f"/{deployment}", {"tag": tag}, {"Accept": accept}) as sock:
        first = read_until(sock, b"data: 1\n\n" if accept == "text/event-stream" else b"\r\n1\n")
        assert first.startswith(b"HTTP/1.1 200")
    assert wait_events(store, tag, "finally") == CLOSED[deployment]


@pytest.mark.parametrize("deployment", ["gen-sync", "gen-async"])
def test_closing_a_python_stream_closes_the_generator(
    farm: Farm, store: redis.Redis, tag: str, deployment: str
) -> None:
    with Client(farm.effective_redis_url) as client:
        chunks = client.stream(deployment, {"tag": f"{tag}-close"}, timeout=60)
        assert [next(chunks), next(chunks)] == [0, 1]
        chunks.close()
        assert wait_events(store, f"{tag}-close", "finally") == CLOSED[deployment]

        for chunk in client.stream(deployment, {"tag": f"{tag}-break"}, timeout=60):
            if chunk == 2:
                break
        assert wait_events(store, f"{tag}-break", "finally") == CLOSED[deployment]


def test_an_async_generator_paused_at_its_yield_gets_generator_exit(farm: Farm, store: redis.Redis, tag: str) -> None:
    """With no pause between chunks it runs max_unread_chunks ahead of its reader and waits at its ``yield``."""
    with Client(farm.effective_redis_url) as client:
        chunks = client.stream("gen-async", {"tag": tag, "pause_s": 0}, timeout=60)
        assert next(chunks) == 0
        chunks.close()
    assert wait_events(store, tag, "finally") == ["start", "generator-exit", "finally"]


def test_a_stream_still_open_when_its_client_closes_is_dropped_quietly(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """An iterator that outlives its Client, dropped later (outside the client's loop): nothing is raised or
    warned (pytest would fail the test on either)."""
    with Client(farm.effective_redis_url) as client:
        chunks = client.stream("gen-sync", {"tag": tag, "n": 60}, timeout=10)
        assert next(chunks) == 0
    del chunks
    gc.collect()


# -- the Python caller stops waiting -----------------------------------------------------------------------------------


async def test_cancelling_the_task_awaiting_a_call_cancels_the_handler(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    async with AsyncClient(farm.effective_redis_url) as client:
        call = asyncio.create_task(client.call("await", {"tag": tag}, timeout=60))
        await wait_for_async(lambda: "start" in events(store, tag), REACH_S, "the handler did not start")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await wait_for_async(lambda: "finally" in events(store, tag), REACH_S, lambda: str(events(store, tag)))
    assert events(store, tag) == ["start", "cancelled", "finally"]


async def test_closing_the_client_under_a_call_cancels_the_handler(farm: Farm, store: redis.Redis, tag: str) -> None:
    """Nobody waits for the reply of a call whose client closed (the call raises UnavailableError): its handler is
    cancelled, as a stream's generator is."""
    client = AsyncClient(farm.effective_redis_url)
    call = asyncio.create_task(client.call("await", {"tag": tag}, timeout=60))
    await wait_for_async(lambda: "start" in events(store, tag), REACH_S, "the handler did not start")
    await client.aclose()
    with pytest.raises(UnavailableError, match="client closed"):
        await call
    await wait_for_async(lambda: "finally" in events(store, tag), REACH_S, lambda: str(events(store, tag)))
    assert events(store, tag) == ["start", "cancelled", "finally"]


def test_closing_a_blocking_client_under_a_call_cancels_the_handler(farm: Farm, store: redis.Redis, tag: str) -> None:
    client = Client(farm.effective_redis_url)
    future = client.submit("await", {"tag": tag}, timeout=60)
    wait_events(store, tag, "start")
    client.close()
    with pytest.raises(UnavailableError, match="client closed"):
        future.result(timeout=5)
    assert wait_events(store, tag, "finally") == ["start", "cancelled", "finally"]


async def test_a_call_cancelled_while_its_enqueue_is_on_its_way_never_runs(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """Behind a request that holds the only slot, calls are cancelled at every moment from before their enqueue is
    sent to after it is answered: none stays queued, none runs, and the keyed ones' keys are free again (an enqueue
    whose answer the cancelled caller never read stayed queued, and ran)."""
    tags = [f"{tag}-{n}" for n in range(36)]
    keyed = {each: f"key-{each}" for each in tags[1::2]}  # a keyed call's enqueue is another script
    with Client(farm.effective_redis_url) as holder, holding_the_only_slot(holder, store, "one-at-a-time", tag) as busy:
        async with AsyncClient(farm.effective_redis_url) as client:
            await client.route("one-at-a-time")  # its routes are loaded: no round trip before the enqueue
            for n, each in enumerate(tags):
                if n % 3 == 0:  # its enqueue finds its script gone (a restarted Redis), and loads it first
                    store.script_flush()
                body = {"tag": each, "sleep_s": 0}
                call = asyncio.create_task(client.call("one-at-a-time", body, idempotency_key=keyed.get(each)))
                for _ in range(n % 18):  # its enqueue queued, sent, or answered, by the loop turns it had
                    await asyncio.sleep(0)
                if n >= 18:
                    await asyncio.sleep(0.0002 * (n - 18))
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call

            def left() -> str:
                return f"cancelled calls stayed queued: {store.xrange(KEYS.requests('one-at-a-time'))}"

            await wait_for_async(lambda: queued_entries(store, "one-at-a-time") == 1, REACH_S, left)
        assert busy.finish() == "done"
    assert {each: events(store, each) for each in tags} == {each: [] for each in tags}
    assert not any(store.exists(KEYS.idempotency("one-at-a-time", key)) for key in keyed.values())


def test_cancelling_a_submitted_future_cancels_the_handler(farm: Farm, store: redis.Redis, tag: str) -> None:
    with Client(farm.effective_redis_url) as client:
        future = client.submit("await", {"tag": tag}, timeout=60)
        wait_events(store, tag, "start")
        assert future.cancel()
        assert wait_events(store, tag, "finally") == ["start", "cancelled", "finally"]


# A script whose blocking call, or loop over a blocking stream, is cut short by Ctrl-C that it does not catch, then
# ends (its Client left open, as a script's often is). With "loop-thread", the SIGINT lands on the client's loop
# thread, as the kernel may hand a process's signal to any of its threads: the waiting main thread must see it all the
# same.
INTERRUPTED_SCRIPT = """
import logging, signal, sys, threading, time
import redis
from streamserve import Client
from tests.cancel_deployments import events_key

# Ctrl-C raises KeyboardInterrupt, as in a terminal (a test run started in the background hands SIGINT down ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
url, tag, to, what = sys.argv[1:5]
logging.basicConfig(level=logging.INFO)  # what the client did about the cancellation, for a failure's message
client = Client(url)

def interrupt_the_loop_thread_once_started():
    events = redis.Redis.from_url(url)
    for _ in range(1000):
        if b"start" in events.lrange(events_key(tag), 0, -1):
            signal.pthread_kill(client._thread.ident, signal.SIGINT)
            return
        time.sleep(0.01)

if to == "loop-thread":
    threading.Thread(target=interrupt_the_loop_thread_once_started, daemon=True).start()
if what == "call":
    client.call("await", {"tag": tag}, timeout=60)
elif what == "stream":
    for chunk in client.stream("gen-async", {"tag": tag}, timeout=60):
        pass
else:  # Ctrl-C between two steps of the stream, in the loop's body
    for chunk in client.stream("gen-async", {"tag": tag}, timeout=60):
        time.sleep(0.5)
"""


@pytest.mark.parametrize("what", ["call", "stream", "stream-body"])
@pytest.mark.parametrize("to", ["process", "loop-thread"])
def test_ctrl_c_during_a_blocking_call_or_stream_cancels_the_handler(
    farm: Farm, store: redis.Redis, tag: str, to: str, what: str
) -> None:
    """A stream is cancelled wherever its handler was: awaiting (CancelledError) or paused at a yield (closed)."""
    command = [sys.executable, "-c", INTERRUPTED_SCRIPT, farm.effective_redis_url, tag, to, what]
    env = {**os.environ, "PYTHONPATH": python_path()}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as script:
        try:
            wait_events(store, tag, "start")
            if to == "process":
                script.send_signal(signal.SIGINT)
            _out, err = script.communicate(timeout=REACH_S)
        finally:
            if script.poll() is None:
                script.kill()
                script.communicate()
    assert b"KeyboardInterrupt" in err, err
    stopped = ["cancelled"] if what == "call" else ["cancelled", "generator-exit"]
    try:
        recorded = wait_events(store, tag, "finally")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the script's stderr:\n{err.decode()}") from None
    assert recorded in (["start", how, "finally"] for how in stopped)


# -- the deadline passes while it runs -------------------------------------------------------------------------------


def test_the_deadline_passing_cancels_an_async_handler(farm: Farm, store: redis.Redis, tag: str) -> None:
    response = farm.post("/await", {"tag": tag, "sleep_s": 30}, headers={"X-Request-Timeout": "1"})
    assert response.status_code == 504
    assert wait_events(store, tag, "finally") == ["start", "cancelled", "finally"]


def test_a_sync_handler_sees_cancelled_past_its_deadline(farm: Farm, store: redis.Redis, tag: str) -> None:
    response = farm.post("/loop", {"tag": tag, "sleep_s": 30}, headers={"X-Request-Timeout": "1"})
    assert response.status_code == 504
    assert wait_events(store, tag, "finally") == ["start", "stopped-early", "finally"]


# -- what is counted -------------------------------------------------------------------------------------------------


def test_cancellations_are_counted_by_stage(farm: Farm, store: redis.Redis, tag: str) -> None:
    """On a deployment of its own: one request cancelled while queued, then one while running."""
    with Client(farm.effective_redis_url) as client, holding_the_only_slot(client, store, "counted", tag) as busy:
        cancel_while_queued(farm, store, "counted", tag)
        assert busy.finish() == "done"
    with hanging_up(farm, "/counted", {"tag": f"{tag}-running"}):
        wait_events(store, f"{tag}-running", "start")
    wait_events(store, f"{tag}-running", "finally")

    def counted() -> dict[str, float]:
        return {stage: cancelled_count(farm, "counted", stage) for stage in ("queued", "running")}

    wait_for(lambda: counted() == {"queued": 1, "running": 1}, 10, lambda: f"counted {counted()}")


@pytest.mark.parametrize("deployment", ["counted-gen", "counted-loop"])
def test_a_deadline_passing_while_it_runs_is_counted_as_a_cancellation(
    farm: Farm, store: redis.Redis, tag: str, deployment: str
) -> None:
    """The deadline stops an async generator, or a sync handler sees it in cancelled() and returns early: each is
    counted as cancelled while running, as an async handler stopped by its deadline is (each on a deployment of its
    own: nothing else counted there)."""
    with Client(farm.effective_redis_url) as client, pytest.raises(RequestTimeoutError):
        if deployment == "counted-gen":
            for _ in client.stream(deployment, {"tag": tag}, timeout=1.0):
                pass
        else:
            client.call(deployment, {"tag": tag}, timeout=1.0)
    wait_events(store, tag, "finally")
    wait_for(
        lambda: cancelled_count(farm, deployment, "running") == 1,
        10,
        lambda: f"cancelled while running: {cancelled_count(farm, deployment, 'running')}",
    )


def cancelled_count(farm: Farm, deployment: str, stage: str) -> float:
    """streamserve_cancelled_requests_total of ``deployment`` and ``stage`` in the farm's /metrics (0 when absent)."""
    line = f'streamserve_cancelled_requests_total{{deployment="{deployment}",stage="{stage}"}} '
    text = httpx.get(f"{farm.base_url}/metrics", timeout=10).text
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)), 0.0)


# -- never run again ---------------------------------------------------------------------------------------------------


def test_a_request_cancelled_on_a_replica_that_dies_is_never_run_again(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """A sync handler deaf to cancelled(): its caller hangs up, its replica is killed; the scheduler reclaims what the
    dead replica held, and drops the cancelled request instead of delivering it again."""
    stream = KEYS.requests("stubborn")
    hold = f"cancel-test:hold:{tag}"
    store.set(hold, 1)
    with hanging_up(farm, "/stubborn", {"tag": tag, "hold": hold}):
        wait_events(store, tag, "start")
        [pending] = store.xpending_range(stream, CONSUMER_GROUP, "-", "+", 10)
        entry_id, holder = pending["message_id"], pending["consumer"].decode()
    wait_for(lambda: store.zscore(KEYS.cancelled("stubborn"), entry_id) is not None, REACH_S, "never marked")
    [replica] = [r for r in farm.status()["stubborn"]["replicas"] if r["replica_id"] == holder]
    os.kill(int(replica["pid"]), signal.SIGKILL)
    store.delete(hold)  # run again, it would end at once

    def reclaimed() -> bool:
        return not store.xpending_range(stream, CONSUMER_GROUP, "-", "+", 10, consumername=holder)

    wait_for(reclaimed, 30, "the dead replica's request was not reclaimed")
    assert farm.post("/stubborn", {"tag": f"{tag}-after", "sleep_s": 0}).json() == "done"
    assert events(store, tag) == ["start"], "the cancelled request ran again"
    assert store.xlen(KEYS.dead_letters("stubborn")) == 0


# -- a cancel that comes too late ------------------------------------------------------------------------------------


async def test_a_cancel_for_a_finished_request_does_nothing(farm: Farm, store: redis.Redis, tag: str) -> None:
    """Cancelled once answered (CANCEL finds it finished), and told to its replica anyway (as when CANCEL found it
    just before its acknowledgement): the replica's next request is answered as ever."""
    stream = KEYS.requests("await")
    request = Request(f"{tag}-id", "", now_ms() + 60_000, orjson.dumps({"tag": tag, "sleep_s": 0}))
    entry_id = cast(bytes, store.xadd(stream, dict(request.encode()))).decode()
    wait_events(store, tag, "finally")
    wait_for(lambda: not store.xrange(stream, entry_id, entry_id), REACH_S, "the request was not finished")

    async with AsyncClient(farm.effective_redis_url) as client:
        # A request cancelled after the late cancel: once it is, the replica has read the late one too.
        fence = asyncio.create_task(client.call("await", {"tag": f"{tag}-fence"}, timeout=60))
        await wait_for_async(lambda: "start" in events(store, f"{tag}-fence"), REACH_S, "the fence did not start")
        connection = async_redis(farm.effective_redis_url)
        pipeliner = Pipeliner(connection)
        try:
            canceller = Canceller(connection, pipeliner, KEYS)
            assert await canceller.cancel("await", entry_id, request.request_id) == "finished"
        finally:
            await pipeliner.aclose()
            await connection.aclose()
        tell_replica(farm, store, "await", entry_id, request.request_id)
        fence.cancel()
        await wait_for_async(lambda: "finally" in events(store, f"{tag}-fence"), REACH_S, "the fence was not cancelled")

        assert await client.call("await", {"tag": f"{tag}-after", "sleep_s": 0}, timeout=30) == "done"
    assert events(store, tag) == ["start", "done", "finally"]
    assert events(store, f"{tag}-after") == ["start", "done", "finally"]


# -- a cancel that comes early ---------------------------------------------------------------------------------------


def test_a_cancel_that_reaches_the_replica_before_its_request_keeps_it_from_starting(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """CANCEL found the request held, but the replica has not started it yet (the read that delivered it is on its
    way): told first, the replica never starts it. Played here with a request queued behind a busy one, which the
    replica reads only once the busy one ends, after the cancel."""
    stream = KEYS.requests("one-at-a-time")
    request = Request(f"{tag}-id", "", now_ms() + 60_000, orjson.dumps({"tag": tag, "sleep_s": 0}))
    with Client(farm.effective_redis_url) as client, holding_the_only_slot(client, store, "one-at-a-time", tag) as busy:
        entry_id = cast(bytes, store.xadd(stream, dict(request.encode()))).decode()
        tell_replica(farm, store, "one-at-a-time", entry_id, request.request_id)
        busy.cancel()  # its cancel comes after the early one: once the busy one is cancelled, the replica has both
        wait_events(store, f"{tag}-busy", "finally")
    assert farm.post("/one-at-a-time", {"tag": f"{tag}-after", "sleep_s": 0}).json() == "done"
    assert events(store, tag) == [], "the cancelled request started"
    assert not store.xrange(stream, entry_id, entry_id) and not store.xpending(stream, CONSUMER_GROUP)["pending"]


def tell_replica(farm: Farm, store: redis.Redis, deployment: str, entry_id: str, request_id: str) -> None:
    """Send ``deployment``'s one replica the CancelRequest a caller sends once CANCEL found the request held."""
    [replica] = farm.status()[deployment]["replicas"]
    control = KEYS.replica_control(deployment, replica["replica_id"])
    store.execute_command(*control_command(control, CancelRequest(entry_id, request_id)))
