"""Handles through real processes: a deployment calls another with ``streamserve.handle`` (sync and async handlers),
over HTTP; the child inherits the parent's deadline and request id, and is cancelled when the parent's HTTP caller
hangs up; streams go through a handle; a plain script uses handles with REDIS_URL."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import httpx
import orjson
import pytest
import redis

from streamserve.wire.keys import DEFAULT_PREFIX, Keys
from tests.harness.farm import Farm, marked_env, running_farm_of
from tests.harness.paths import ROOT, python_path
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: child
    import_path: tests.handle_deployments:child
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: parent-async
    import_path: tests.handle_deployments:parent_async
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: parent-sync
    import_path: tests.handle_deployments:parent_sync
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: parent-threads
    import_path: tests.handle_deployments:parent_threads
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: blocking-in-async
    import_path: tests.handle_deployments:blocking_call_in_async
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: tokens
    import_path: tests.handle_deployments:tokens
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: slow-tokens
    import_path: tests.handle_deployments:slow_tokens
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: parent-stream-sync
    import_path: tests.handle_deployments:parent_stream_sync
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: parent-stream-async
    import_path: tests.handle_deployments:parent_stream_async
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: late-caller
    import_path: tests.handle_deployments:late_caller
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: late-streamer
    import_path: tests.handle_deployments:late_streamer
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: first-chunk-sync
    import_path: tests.handle_deployments:first_chunk_sync
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: recursive
    import_path: tests.handle_deployments:recursive
    num_replicas: 1
    max_delivery_attempts: 2  # (its first delivery again is its last: run alone)
    graceful_shutdown_timeout_s: 2
"""

PARENTS = ["parent-async", "parent-sync"]


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm_of(CONFIG, tmp_path_factory.mktemp("handles")) as farm:
        yield farm


@pytest.fixture
def notes(farm: Farm) -> Iterator[tuple[str, redis.Redis]]:
    """A fresh Redis list for the deployments' notes (handle_deployments._note), and a connection to read it."""
    connection = redis.Redis.from_url(farm.effective_redis_url)
    key = f"test-notes:{uuid.uuid4().hex}"
    try:
        yield key, connection
    finally:
        connection.delete(key)
        connection.close()


def _noted(notes: tuple[str, redis.Redis]) -> list[str]:
    key, connection = notes
    return [note.decode() for note in connection.lrange(key, 0, -1)]


@pytest.mark.parametrize("parent", PARENTS)
def test_a_parent_returns_its_childs_answer_with_the_childs_id_and_deadline_from_its_own(
    farm: Farm, parent: str
) -> None:
    headers = {"X-Request-ID": f"handles-{parent}", "X-Request-Timeout": "3"}
    response = farm.post(f"/{parent}", {"echo": "hello"}, headers=headers)
    assert response.status_code == 200, response.text
    answer = response.json()
    mine, child = answer["served"], answer["child"]["served"]
    assert answer["child"]["echo"] == "hello"
    assert mine["request_id"] == f"handles-{parent}"
    assert child["request_id"].startswith(f"handles-{parent}.")
    # The child's own timeout (the default 30 s) is longer: it gets the parent's deadline, never a later one.
    assert mine["deadline_ms"] - 1000 < child["deadline_ms"] <= mine["deadline_ms"], answer


def test_calls_from_threads_of_the_handler_s_own_are_children_in_a_copy_of_its_context(farm: Farm) -> None:
    response = farm.post("/parent-threads", {}, headers={"X-Request-ID": "threads", "X-Request-Timeout": "3"})
    assert response.status_code == 200, response.text
    answer = response.json()
    for child in answer["children"]:
        assert child["served"]["request_id"].startswith("threads."), answer
        assert child["served"]["deadline_ms"] <= answer["served"]["deadline_ms"], answer


@pytest.mark.parametrize("parent", PARENTS)
def test_a_parent_past_its_deadline_gets_504_at_once_and_its_child_is_stopped(
    farm: Farm, notes: tuple[str, redis.Redis], parent: str
) -> None:
    """The child's timeout is the parent's deadline: the parent is stopped by its deadline, and counted so (a
    cancellation while running), not logged as a handler that raised."""
    cancelled = f'streamserve_cancelled_requests_total{{deployment="{parent}",stage="running"}}'
    before = _metric(farm, cancelled)
    started = time.monotonic()
    body = {"notes": notes[0], "sleep_s": 5}
    request_id = f"deadline-{parent}-{uuid.uuid4().hex[:8]}"
    response = farm.post(f"/{parent}", body, headers={"X-Request-Timeout": "1", "X-Request-ID": request_id})
    took = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert took < 2.5, f"the 504 took {took:.1f}s"
    wait_for(lambda: "child cancelled" in _noted(notes), 3, lambda: f"the child ran on: {_noted(notes)}")
    wait_for(lambda: _metric(farm, cancelled) > before, 10, f"{parent}'s deadline was not counted: {cancelled}")
    assert f"the handler raised on request {request_id}".encode() not in farm.log()


@pytest.mark.parametrize("parent", ["late-caller", "late-streamer"])
def test_a_sync_handler_that_calls_past_its_deadline_is_told_so_and_counted_as_its_deadline(
    farm: Farm, notes: tuple[str, redis.Redis], parent: str
) -> None:
    """Its caller's 504 cancels the request too: the call it makes once the deadline has passed still raises
    RequestTimeoutError (as docs/api.md says), and letting that out ends the request as its deadline, not as a
    handler error (logged with a traceback)."""
    cancelled = f'streamserve_cancelled_requests_total{{deployment="{parent}",stage="running"}}'
    before = _metric(farm, cancelled)
    request_id = f"late-{parent}-{uuid.uuid4().hex[:8]}"
    headers = {"X-Request-Timeout": "1", "X-Request-ID": request_id}
    body = {"notes": notes[0], "sleep_s": 1.5}
    if parent == "late-caller":
        response = farm.post(f"/{parent}", body, headers=headers)
        assert response.status_code == 504, response.text
    else:  # the stream's first chunk, then its error line, and the response cut (how NDJSON tells an error)
        lines = []
        url = f"{farm.base_url}/{parent}"
        with (
            httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response,
            pytest.raises(httpx.RemoteProtocolError),
        ):
            lines.extend(response.iter_lines())
        assert lines[0] == '{"i":0}' and lines[-1].startswith('{"error":"RequestTimeoutError"'), lines
    wait_for(lambda: _noted(notes) == ["late call raised RequestTimeoutError"], 5, lambda: f"{_noted(notes)}")
    wait_for(lambda: _metric(farm, cancelled) > before, 10, f"{parent}'s deadline was not counted: {cancelled}")
    assert f"the handler raised on request {request_id}".encode() not in farm.log()


def _metric(farm: Farm, series: str) -> float:
    text = httpx.get(f"{farm.base_url}/metrics", timeout=10).text
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(series + " ")), 0.0)


def _hang_up_once_the_child_started(
    farm: Farm, notes: tuple[str, redis.Redis], parent: str, body: dict[str, object]
) -> None:
    """POST ``body`` to ``parent`` (request id ``hangup-<parent>``), and close the connection once the child it
    calls has started."""
    raw = orjson.dumps({**body, "notes": notes[0]})
    request = (
        f"POST /{parent} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"X-Request-ID: hangup-{parent}\r\nContent-Length: {len(raw)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", farm.port), timeout=30) as sock:
        sock.sendall(request + raw)
        wait_for(lambda: any(n.startswith("child started") for n in _noted(notes)), 10, "the child never started")
    assert _noted(notes)[0].startswith(f"child started hangup-{parent}.")


@pytest.mark.parametrize(
    ("parent", "body"),
    [
        ("parent-async", {"sleep_s": 30}),
        ("parent-sync", {"sleep_s": 30}),
        ("parent-stream-async", {"child": "slow-tokens"}),
        ("parent-stream-sync", {"child": "slow-tokens"}),
    ],
)
def test_a_parent_whose_caller_hangs_up_cancels_its_child(
    farm: Farm, notes: tuple[str, redis.Redis], parent: str, body: dict[str, object]
) -> None:
    _hang_up_once_the_child_started(farm, notes, parent, body)
    # The connection is closed: the parent is cancelled, and with it its child.
    wait_for(lambda: "child cancelled" in _noted(notes), 5, lambda: f"the child ran on: {_noted(notes)}")
    if parent.endswith("-sync"):  # an async parent's task is cancelled; a sync one's call raises
        wait_for(lambda: "parent saw RequestCancelledError" in _noted(notes), 5, lambda: f"{_noted(notes)}")


@pytest.mark.parametrize("parent", ["parent-stream-sync", "parent-stream-async"])
def test_a_stream_through_a_handle(farm: Farm, parent: str) -> None:
    headers = {"X-Request-ID": f"stream-{parent}"}
    with httpx.stream("POST", f"{farm.base_url}/{parent}", json={"n": 4}, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        chunks = [orjson.loads(line) for line in response.iter_lines()]
    assert [chunk["i"] for chunk in chunks] == [0, 1, 2, 3]
    assert all(chunk["request_id"].startswith(f"stream-{parent}.") for chunk in chunks), chunks


def test_a_sync_handler_that_leaves_a_handle_s_stream_early_cancels_it(
    farm: Farm, notes: tuple[str, redis.Redis]
) -> None:
    response = farm.post("/first-chunk-sync", {"child": "slow-tokens", "notes": notes[0]})
    assert response.status_code == 200 and response.json()["i"] == 0, response.text
    # No reference is left to the stream its handler left: the child is cancelled at once, while the parent still
    # runs, not once the parent's scope is collected or at the child's deadline.
    assert response.json()["child_cancelled_while_parent_ran"], f"the child ran on: {_noted(notes)}"


def test_the_blocking_call_in_an_async_handler_says_to_await_acall(farm: Farm) -> None:
    response = farm.post("/blocking-in-async", {"echo": 1})
    assert response.status_code == 500
    assert response.json()["error"] == "RuntimeError" and "await handle.acall" in response.json()["message"]


def test_a_deployment_that_calls_itself_goes_on_after_its_only_replica_died(
    farm: Farm, notes: tuple[str, redis.Redis]
) -> None:
    """The dead replica's requests are delivered again, for the last time (max_delivery_attempts 2), so each is run
    alone (nothing else read beside it), in case it is what killed the replica; one that calls its own deployment
    must let the replica read its call."""
    key, store = notes
    hold = f"{key}:hold"
    store.set(hold, 1)
    body = {"notes": key, "hold": hold, "depth": 1}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(farm.post, "/recursive", body, headers={"X-Request-Timeout": "25"})
        wait_for(lambda: _noted(notes), 10, "the innermost call never started")
        [replica] = farm.status()["recursive"]["replicas"]
        os.kill(int(replica["pid"]), signal.SIGKILL)
        store.delete(hold)
        response = answer.result(timeout=40)
    assert response.status_code == 200, response.text
    assert response.json() == {"depth": 1, "inner": {"depth": 0}}


SCRIPT = """\
import asyncio

import streamserve

print(streamserve.handle("child").call({"echo": "sync"})["echo"])
print([chunk["i"] for chunk in streamserve.handle("tokens").stream({"n": 3})])


async def main():
    answer = await streamserve.handle("child").acall({"echo": "async"})
    chunks = [chunk["i"] async for chunk in streamserve.handle("tokens").astream({"n": 2})]
    return answer["echo"], chunks


print(asyncio.run(main()))
try:
    streamserve.handle("nope").call(1)
except streamserve.NotFoundError:
    print("NotFoundError")
"""


def test_a_plain_script_uses_handles_with_redis_url(
    farm: Farm, notes: tuple[str, redis.Redis], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Outside any handler: the environment's REDIS_URL; the script ends promptly and quietly, and closes its client
    (its reply stream is gone)."""
    script = tmp_path_factory.mktemp("script") / "use_handles.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**marked_env(farm.token, {}), "REDIS_URL": farm.effective_redis_url, "PYTHONPATH": python_path()}
    connection = notes[1]
    every_reply_stream = Keys(DEFAULT_PREFIX).reply_stream("*")
    reply_streams = set(connection.scan_iter(match=every_reply_stream))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["sync", "[0, 1, 2]", "('async', [0, 1])", "NotFoundError"]
    assert done.stderr == ""
    assert took < 15, f"the script took {took:.1f}s"
    assert set(connection.scan_iter(match=every_reply_stream)) == reply_streams
