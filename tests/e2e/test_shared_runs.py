"""Shared runs end to end (issue 29): idempotency keys and the response cache, through real processes: `streamserve
up`, its gateway, scheduler and replica processes, a second gateway, HTTP callers (some on raw sockets that hang up)
and the Python client.

How often a handler really ran is what it recorded on a Redis list (tests/shared_run_deployments.py)."""

from __future__ import annotations

import concurrent.futures
import http.client
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
from rq.job import Job

from streamserve import BadRequestError, Client, GoalFailedError, RemoteError
from streamserve.metrics.flusher import FLUSH_INTERVAL_S
from streamserve.wire.config import AppConfig, DeploymentConfig, ResponseCacheConfig
from streamserve.wire.errors import IdempotencyKeyMismatchError, shown
from streamserve.wire.keys import Keys
from tests.harness.farm import Farm, Processes, running_farm_of
from tests.harness.waiting import wait_for
from tests.shared_run_deployments import runs_key

pytestmark = pytest.mark.e2e

CONFIG = """\
deployments:
  - name: counted
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: narrow
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    max_ongoing_requests: 1
    max_queued_requests: 1
    graceful_shutdown_timeout_s: 2
  - name: small
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    max_response_bytes: 100
    graceful_shutdown_timeout_s: 2
  - name: fragile
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    max_delivery_attempts: 1
    graceful_shutdown_timeout_s: 2
  - name: brief
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    idempotency_ttl_s: 1
    graceful_shutdown_timeout_s: 2
  - name: cached
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    max_ongoing_requests: 64
    response_cache: {ttl_s: 300, max_entries: 10000}
    graceful_shutdown_timeout_s: 2
  - name: brief-cache
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    response_cache: {ttl_s: 2, local_ttl_s: 60}
    graceful_shutdown_timeout_s: 2
  - name: shared-cache
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    response_cache: {local_ttl_s: 0}
    graceful_shutdown_timeout_s: 2
  - name: tiny-cache
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    response_cache: {max_entries: 3}
    graceful_shutdown_timeout_s: 2
  - name: reconfigured
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    user_config: {v: 1}
    response_cache: {}
    graceful_shutdown_timeout_s: 2
  - name: slow-config
    import_path: tests.shared_run_deployments:Configured
    num_replicas: 1
    user_config: {v: 1}
    response_cache: {}
    graceful_shutdown_timeout_s: 2
  - name: versioned
    import_path: tests.shared_run_deployments:Versioned
    init_kwargs: {name: one}
    num_replicas: 1
    user_config: {v: 1}
    response_cache: {}
    graceful_shutdown_timeout_s: 2
  - name: streamed
    import_path: tests.shared_run_deployments:counted_stream
    num_replicas: 1
    graceful_shutdown_timeout_s: 2
  - name: doomed
    import_path: tests.shared_run_deployments:counted
    num_replicas: 1
    graceful_shutdown_timeout_s: 1
endpoints:
  - name: split
    traffic: {counted: 1, fragile: 1}
"""
KEYS = Keys()
WAIT_S = 20.0


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm_of(CONFIG, tmp_path_factory.mktemp("shared-runs")) as farm:
        yield farm


def runs(store: redis.Redis, tag: str) -> int:
    """How often the handler ran on bodies tagged ``tag``."""
    return int(store.llen(runs_key(tag)))


def post(url: str, path: str, body: Any, key: str | None, **headers: str | bytes) -> httpx.Response:
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(url + path, json=body, headers=headers, timeout=60)


def record_exists(store: redis.Redis, deployment: str, key: str) -> bool:
    return bool(store.exists(KEYS.idempotency(deployment, key)))


def cache_waiting(store: redis.Redis) -> int:
    """How many requests to ``cached`` wait for a run of an identical one (its waiters lists, gone once it ends)."""
    return sum(int(store.llen(key)) for key in store.scan_iter(match=KEYS.cache_waiters("cached", "*")))


def run_with_a_waiter(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> tuple[dict[str, str], concurrent.futures.Future[httpx.Response], concurrent.futures.Future[httpx.Response]]:
    """A keyed call to /counted held running, and its retry joined to it: (body, first, retry); release the run by
    deleting ``body["hold"]``."""
    hold = f"hold:{tag}"
    store.set(hold, 1)
    body = {"tag": tag, "hold": hold}
    first = pool.submit(post, farm.base_url, "/counted", body, tag)
    wait_for(lambda: runs(store, tag) == 1, WAIT_S, "the first request did not start")
    retry = pool.submit(post, farm.base_url, "/counted", body, tag)
    waiters = KEYS.idempotency_waiters("counted", tag)
    wait_for(lambda: store.llen(waiters) == 1, WAIT_S, "the retry did not join the run")
    return body, first, retry


def test_a_retry_while_the_first_runs_waits_for_it_and_one_after_gets_the_stored_reply(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    body, first, retry = run_with_a_waiter(farm, store, tag, pool)
    store.delete(body["hold"])
    answers = [first.result(timeout=WAIT_S), retry.result(timeout=WAIT_S)]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json() == {"tag": tag, "run": 1}
    later = post(farm.base_url, "/counted", body, tag)
    assert later.status_code == 200
    assert later.json() == {"tag": tag, "run": 1}
    assert later.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in answers[0].headers
    assert runs(store, tag) == 1


def test_a_run_settles_and_answers_its_waiters_after_redis_forgot_its_scripts(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    body, first, retry = run_with_a_waiter(farm, store, tag, pool)
    store.script_flush()  # as a restarted Redis would: the replica's settle by SHA1 is answered NOSCRIPT
    store.delete(body["hold"])
    answers = [first.result(timeout=WAIT_S), retry.result(timeout=WAIT_S)]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json() == {"tag": tag, "run": 1}
    assert store.hget(KEYS.idempotency("counted", tag), "state") == b"done"  # settled: kept for later retries
    later = post(farm.base_url, "/counted", body, tag)
    assert (later.status_code, later.headers.get("idempotent-replayed")) == (200, "true")
    assert runs(store, tag) == 1


def test_the_same_key_with_another_body_is_422(farm: Farm, store: redis.Redis, tag: str) -> None:
    assert post(farm.base_url, "/counted", {"tag": tag}, tag).status_code == 200
    other = post(farm.base_url, "/counted", {"tag": tag, "more": 1}, tag)
    assert other.status_code == 422
    assert other.json()["error"] == "IdempotencyKeyMismatchError"
    assert "another method, model or body" in other.json()["message"]
    # The same JSON value written otherwise (spaces, key order) is the same body.
    same = httpx.post(
        farm.base_url + "/counted",
        content=b'{ "tag" : "' + tag.encode() + b'" }',
        headers={"Idempotency-Key": tag, "Content-Type": "application/json"},
    )
    assert same.status_code == 200
    assert same.headers["idempotent-replayed"] == "true"
    assert runs(store, tag) == 1


@pytest.mark.parametrize("key", ["", "k" * 256, "caf\u00e9"])
def test_a_malformed_key_is_400_and_runs_nothing(farm: Farm, store: redis.Redis, tag: str, key: str) -> None:
    answer = httpx.post(
        farm.base_url + "/counted",
        json={"tag": tag},
        headers=[("Idempotency-Key", key.encode("utf-8"))],
    )
    assert answer.status_code == 400
    message = answer.json()["message"]
    assert "idempotency key must be 1-255 printable ASCII characters" in message
    assert shown(key) in message  # as the client sent it (a UTF-8 key not shown as latin-1), a long one cut
    assert runs(store, tag) == 0


def test_two_keys_on_one_request_are_400_and_run_nothing(farm: Farm, store: redis.Redis, tag: str) -> None:
    answer = httpx.post(
        farm.base_url + "/counted", json={"tag": tag}, headers=[("Idempotency-Key", tag), ("Idempotency-Key", "b")]
    )
    assert (answer.status_code, answer.json()["message"]) == (400, "a request takes one Idempotency-Key header, got 2")
    assert runs(store, tag) == 0


def test_whitespace_around_a_key_is_no_part_of_it(farm: Farm, store: redis.Redis, tag: str) -> None:
    """A proxy may drop it (RFC 9110): the retry must find the same key."""
    connection = http.client.HTTPConnection("127.0.0.1", farm.port, timeout=30)  # (httpx refuses to send it)
    try:
        connection.request("POST", "/counted", orjson.dumps({"tag": tag}), {"Idempotency-Key": f"{tag} \t "})
        first = connection.getresponse().status
    finally:
        connection.close()
    retry = post(farm.base_url, "/counted", {"tag": tag}, tag)
    assert (first, retry.status_code, retry.headers.get("idempotent-replayed")) == (200, 200, "true")
    assert runs(store, tag) == 1


def test_a_handler_error_is_kept_for_the_retries(farm: Farm, store: redis.Redis, tag: str) -> None:
    body = {"tag": tag, "fail": True}
    first = post(farm.base_url, "/counted", body, tag)
    assert first.status_code == 500
    retry = post(farm.base_url, "/counted", body, tag)
    assert retry.status_code == 500
    assert retry.json()["message"] == first.json()["message"] == "failed on purpose (run 1)"
    assert retry.headers["idempotent-replayed"] == "true"
    assert runs(store, tag) == 1


def test_a_reply_too_large_to_keep_is_409_for_the_retries(farm: Farm, store: redis.Redis, tag: str) -> None:
    body = {"tag": tag, "size": 1000}
    first = post(farm.base_url, "/small", body, tag)
    assert first.status_code == 500
    assert first.json()["error"] == "ResponseTooLargeError"
    retry = post(farm.base_url, "/small", body, tag)
    assert retry.status_code == 409
    assert "reply was not stored" in retry.json()["message"]
    assert "max_response_bytes" in retry.json()["message"]
    assert runs(store, tag) == 1


# -- streams with a key --------------------------------------------------------------------------------------------


def lines(answer: httpx.Response) -> list[Any]:
    return [orjson.loads(line) for line in answer.content.splitlines()]


def test_a_stream_sent_again_with_its_key_gets_the_same_chunks(farm: Farm, store: redis.Redis, tag: str) -> None:
    body = {"tag": tag, "n": 3}
    first = post(farm.base_url, "/streamed", body, tag)
    assert (first.status_code, lines(first)) == (200, [{"i": 0}, {"i": 1}, {"i": 2}])
    again = post(farm.base_url, "/streamed", body, tag)
    assert (again.status_code, lines(again)) == (200, [{"i": 0}, {"i": 1}, {"i": 2}])
    assert again.headers["content-type"] == "application/x-ndjson"
    assert again.headers["idempotent-replayed"] == "true"
    with Client(farm.effective_redis_url) as client:
        assert list(client.stream("streamed", body, idempotency_key=tag)) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert runs(store, tag) == 1


def test_a_stream_that_failed_keeps_its_chunks_and_its_error(farm: Farm, store: redis.Redis, tag: str) -> None:
    body = {"tag": tag, "n": 3, "fail_after": 2}
    sse = {"Accept": "text/event-stream"}
    first = post(farm.base_url, "/streamed", body, tag, **sse)
    again = post(farm.base_url, "/streamed", body, tag, **sse)
    assert again.headers["idempotent-replayed"] == "true"
    for answer in (first, again):
        *chunks, error, _end = answer.text.split("\n\n")
        assert chunks == ['data: {"i":0}', 'data: {"i":1}']
        assert error.startswith("event: error\ndata: ")
        assert orjson.loads(error.partition("data: ")[2])["message"] == "failed on purpose after 2 chunks"
    with Client(farm.effective_redis_url) as client:
        taken = []
        with pytest.raises(RemoteError, match="failed on purpose after 2 chunks"):
            for chunk in client.stream("streamed", body, idempotency_key=tag):
                taken.append(chunk)
        assert taken == [{"i": 0}, {"i": 1}]
    assert runs(store, tag) == 1


def test_a_stream_sent_again_while_the_first_runs_gets_its_chunks_once_it_ends(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    hold = f"hold:{tag}"
    store.set(hold, 1)
    body = {"tag": tag, "n": 3, "hold": hold}
    try:
        first = pool.submit(post, farm.base_url, "/streamed", body, tag)
        wait_for(lambda: runs(store, tag) == 1, WAIT_S, "the first stream did not start")
        retry = pool.submit(post, farm.base_url, "/streamed", body, tag)
        waiters = KEYS.idempotency_waiters("streamed", tag)
        wait_for(lambda: store.llen(waiters) == 1, WAIT_S, "the retry did not join the run")
    finally:
        store.delete(hold)
    for answer in (first.result(timeout=WAIT_S), retry.result(timeout=WAIT_S)):
        assert (answer.status_code, lines(answer)) == (200, [{"i": 0}, {"i": 1}, {"i": 2}])
    assert runs(store, tag) == 1


# -- a caller who leaves once the run goes on does not stop it ---------------------------------------------------


def hang_up_while_it_runs(farm: Farm, store: redis.Redis, path: str, body: dict[str, Any], key: str | None) -> None:
    """POST ``body`` (with Idempotency-Key ``key``) on a raw socket, wait until its handler runs (for a stream, until
    its first chunk came), hang up, and wait until the gateway has seen the caller go (its 499 access line)."""
    request_id = f"{body['tag']}-gone"
    payload = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Request-ID: {request_id}\r\n"
    )
    if key is not None:
        head += f"Idempotency-Key: {key}\r\n"
    with socket.create_connection(("127.0.0.1", farm.port), timeout=30) as sock:
        sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        wait_for(lambda: runs(store, body["tag"]) == 1, WAIT_S, "the request did not start")
        if path == "/streamed":
            received = b""
            while b'{"i":0}' not in received:
                received += sock.recv(65536)
    left = b" 499 "
    wait_for(
        lambda: any(left in line and request_id.encode() in line for line in farm.log().splitlines()),
        WAIT_S,
        "the gateway did not log the caller gone",
    )


def test_a_keyed_request_whose_caller_hangs_up_while_it_runs_runs_on_for_the_retry(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """The phone that lost its connection mid-request: its retry gets the one run's answer."""
    hold = f"hold:{tag}"
    store.set(hold, 1)
    body = {"tag": tag, "hold": hold}
    try:
        hang_up_while_it_runs(farm, store, "/counted", body, tag)
    finally:
        store.delete(hold)
    record = KEYS.idempotency("counted", tag)
    wait_for(lambda: store.hget(record, "state") == b"done", WAIT_S, "the run did not go on to its end")
    retry = post(farm.base_url, "/counted", body, tag)
    assert (retry.status_code, retry.headers.get("idempotent-replayed")) == (200, "true")
    assert retry.json() == {"tag": tag, "run": 1}
    assert runs(store, tag) == 1


def test_a_keyed_stream_whose_caller_hangs_up_runs_to_its_end_without_a_reader(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """More chunks than its window (max_unread_chunks, 64): nobody reading them does not hold the generator back."""
    hold = f"hold:{tag}"
    store.set(hold, 1)
    body = {"tag": tag, "n": 100, "hold": hold}
    try:
        hang_up_while_it_runs(farm, store, "/streamed", body, tag)
    finally:
        store.delete(hold)
    record = KEYS.idempotency("streamed", tag)
    wait_for(lambda: store.hget(record, "state") == b"done", WAIT_S, "the stream did not go on to its end")
    retry = post(farm.base_url, "/streamed", body, tag)
    assert (retry.status_code, retry.headers.get("idempotent-replayed")) == (200, "true")
    assert lines(retry) == [{"i": i} for i in range(100)]
    assert runs(store, tag) == 1


def test_identical_requests_keep_their_run_when_the_first_caller_hangs_up(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    hold = f"hold:{tag}"
    store.set(hold, 1)
    body = {"tag": tag, "hold": hold}
    try:
        first_gone = pool.submit(hang_up_while_it_runs, farm, store, "/cached", body, None)
        wait_for(lambda: runs(store, tag) == 1, WAIT_S, "the first request did not start")
        joined = pool.submit(post, farm.base_url, "/cached", body, None)
        wait_for(lambda: cache_waiting(store) == 1, WAIT_S, "the second request did not join the run")
        first_gone.result(timeout=WAIT_S)
    finally:
        store.delete(hold)
    answer = joined.result(timeout=WAIT_S)
    assert (answer.status_code, answer.headers.get("x-cache")) == (200, "coalesced")
    assert answer.json() == {"tag": tag, "run": 1}
    assert runs(store, tag) == 1


# -- a request that never started frees its key ------------------------------------------------------------------


class Busy:
    """The one slot (and the one queue place) of ``narrow`` taken by held requests."""

    def __init__(self, farm: Farm, store: redis.Redis, pool: concurrent.futures.ThreadPoolExecutor, tag: str) -> None:
        self.store = store
        self.hold = f"hold:{tag}:busy"
        store.set(self.hold, 1)
        body = {"tag": f"{tag}-busy", "hold": self.hold}
        self.running = pool.submit(post, farm.base_url, "/narrow", body, None)
        wait_for(lambda: runs(store, f"{tag}-busy") == 1, WAIT_S, "the busy request did not start")

    def release(self) -> None:
        self.store.delete(self.hold)
        assert self.running.result(timeout=WAIT_S).status_code == 200


def test_a_request_refused_for_a_full_queue_frees_its_key(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    busy = Busy(farm, store, pool, tag)
    queued = pool.submit(post, farm.base_url, "/narrow", {"tag": f"{tag}-queued"}, None)
    wait_for(lambda: store.xlen(KEYS.requests("narrow")) == 2, WAIT_S, "the second request was not queued")
    refused = post(farm.base_url, "/narrow", {"tag": tag}, tag)
    assert refused.status_code == 503
    assert not record_exists(store, "narrow", tag)
    busy.release()
    assert queued.result(timeout=WAIT_S).status_code == 200
    retry = post(farm.base_url, "/narrow", {"tag": tag}, tag)
    assert retry.status_code == 200
    assert "idempotent-replayed" not in retry.headers
    assert runs(store, tag) == 1


def test_a_queued_request_whose_caller_hangs_up_frees_its_key(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    busy = Busy(farm, store, pool, tag)
    payload = orjson.dumps({"tag": tag})
    request = (
        f"POST /narrow HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nIdempotency-Key: {tag}\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", farm.port), timeout=30) as sock:
        sock.sendall(request + payload)
        wait_for(lambda: record_exists(store, "narrow", tag), WAIT_S, "the request was not queued")
    wait_for(lambda: not record_exists(store, "narrow", tag), WAIT_S, "the cancelled request kept its key")
    busy.release()
    retry = post(farm.base_url, "/narrow", {"tag": tag}, tag)
    assert retry.status_code == 200
    assert runs(store, tag) == 1


def test_a_request_whose_deadline_passed_before_it_started_frees_its_key(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    busy = Busy(farm, store, pool, tag)
    late = post(farm.base_url, "/narrow", {"tag": tag}, tag, **{"X-Request-Timeout": "0.5"})
    assert late.status_code == 504
    busy.release()  # the replica reads it now, past its deadline: it never runs, and frees the key
    wait_for(lambda: not record_exists(store, "narrow", tag), WAIT_S, "the late request kept its key")
    retry = post(farm.base_url, "/narrow", {"tag": tag}, tag)
    assert retry.status_code == 200
    assert runs(store, tag) == 1


def test_a_request_dead_lettered_when_its_replica_died_frees_its_key(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    hold = f"hold:{tag}"
    store.set(hold, 1)
    body = {"tag": tag, "hold": hold}
    first = pool.submit(post, farm.base_url, "/fragile", body, tag)
    wait_for(lambda: runs(store, tag) == 1, WAIT_S, "the first request did not start")
    os.kill(int(store.lindex(runs_key(tag), 0)), signal.SIGKILL)  # the replica running it
    answer = first.result(timeout=WAIT_S)
    assert answer.status_code == 500
    assert answer.json()["error"] == "DeadLetterError"
    wait_for(lambda: not record_exists(store, "fragile", tag), WAIT_S, "the dead-lettered request kept its key")
    store.delete(hold)
    retry = post(farm.base_url, "/fragile", body, tag)
    assert retry.status_code == 200
    assert retry.json() == {"tag": tag, "run": 2}


def test_a_stored_reply_expires_after_idempotency_ttl_s(farm: Farm, store: redis.Redis, tag: str) -> None:
    assert post(farm.base_url, "/brief", {"tag": tag}, tag).json() == {"tag": tag, "run": 1}
    wait_for(lambda: not record_exists(store, "brief", tag), WAIT_S, "the stored reply did not expire")
    assert post(farm.base_url, "/brief", {"tag": tag}, tag).json() == {"tag": tag, "run": 2}


# -- many callers, one run -------------------------------------------------------------------------------------------


def test_callers_racing_with_one_key_through_two_gateways_run_the_handler_once(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor, tmp_path: Path
) -> None:
    processes = Processes(farm.effective_redis_url, tmp_path)
    try:
        urls = [farm.base_url, processes.start_gateway().url]
        hold = f"hold:{tag}"
        store.set(hold, 1)
        body = {"tag": tag, "hold": hold}
        calls = [pool.submit(post, urls[i % 2], "/counted", body, tag) for i in range(10)]
        waiters = KEYS.idempotency_waiters("counted", tag)
        wait_for(lambda: store.llen(waiters) == 9, WAIT_S, lambda: f"{store.llen(waiters)} callers joined, not 9")
        store.delete(hold)
        answers = [call.result(timeout=WAIT_S) for call in calls]
    finally:
        processes.stop_all()
    assert [a.status_code for a in answers] == [200] * 10
    assert {orjson.dumps(a.json()) for a in answers} == {orjson.dumps({"tag": tag, "run": 1})}
    assert runs(store, tag) == 1


def test_retries_through_an_endpoint_go_to_the_deployment_of_their_key(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    answers = [post(farm.base_url, "/split", {"tag": tag}, tag) for _ in range(8)]
    assert [a.status_code for a in answers] == [200] * 8
    assert len({a.headers["x-deployment"] for a in answers}) == 1
    assert runs(store, tag) == 1


def test_the_python_client_takes_idempotency_keys(farm: Farm, store: redis.Redis, tag: str) -> None:
    with Client(farm.effective_redis_url) as client:
        assert client.call("counted", {"tag": tag}, idempotency_key=tag) == {"tag": tag, "run": 1}
        assert client.call("counted", {"tag": tag}, idempotency_key=tag) == {"tag": tag, "run": 1}
        with pytest.raises(IdempotencyKeyMismatchError):
            client.call("counted", {"tag": tag, "other": True}, idempotency_key=tag)
        for bad in ("", "k" * 256, "caf\u00e9", 17, f"{tag} ", f" {tag}"):  # (spaces: HTTP would drop them)
            with pytest.raises(BadRequestError, match="1-255 printable ASCII characters"):
                client.call("counted", {"tag": tag}, idempotency_key=bad)  # type: ignore[arg-type]
            with pytest.raises(BadRequestError, match="1-255 printable ASCII characters"):
                client.stream("counted", {"tag": tag}, idempotency_key=bad)  # type: ignore[arg-type]
        sent = f"{tag}-sent"
        sent_as = client.send("counted", {"tag": sent}, idempotency_key=sent)
        assert client.send("counted", {"tag": sent}, idempotency_key=sent) == sent_as  # the request that runs for it
        assert client.submit("counted", {"tag": sent}, idempotency_key=sent).result() == {"tag": sent, "run": 1}
    assert runs(store, tag) == 1
    assert runs(store, sent) == 1


def test_a_job_submitted_again_with_its_key_is_the_same_job(farm: Farm, store: redis.Redis, tag: str) -> None:
    prefer = {"Prefer": "respond-async"}
    first = post(farm.base_url, "/counted", {"tag": tag}, tag, **prefer)
    assert first.status_code == 202
    job_id = first.json()["job_id"]
    again = post(farm.base_url, "/counted", {"tag": tag}, tag, **prefer)
    assert again.status_code == 202
    assert again.json()["job_id"] == job_id
    assert again.headers["location"] == f"/-/jobs/{job_id}"
    assert post(farm.base_url, "/counted", {"tag": tag, "other": 1}, tag, **prefer).status_code == 422

    def finished() -> bool:
        return httpx.get(f"{farm.base_url}/-/jobs/{job_id}").json()["status"] == "finished"

    wait_for(finished, WAIT_S, "the job did not finish")
    with Client(farm.effective_redis_url) as client:
        assert client.submit_job("counted", {"tag": tag}, idempotency_key=tag) == job_id
    # Sent again once its job finished, it names that job as it is now.
    assert post(farm.base_url, "/counted", {"tag": tag}, tag, **prefer).json() == {
        "job_id": job_id,
        "status": "finished",
    }
    assert runs(store, tag) == 1
    # Its result's TTL (an hour by default, the key's a day) passes: RQ deletes the job. A retry with the key then
    # queues a new job, which runs, rather than being told "queued" of one that is gone.
    claim = KEYS.job_idempotency("counted", tag)
    named, digest, claimed_ms = orjson.loads(store.get(claim))
    store.set(claim, orjson.dumps([named, digest, claimed_ms - 61_000]), keepttl=True)  # (long queued)
    assert store.delete(Job.key_for(job_id)) == 1
    retried = post(farm.base_url, "/counted", {"tag": tag}, tag, **prefer)
    assert retried.status_code == 202 and retried.json()["job_id"] != job_id, retried.text
    assert retried.json()["status"] in {"queued", "started", "finished"}  # (the new job, as it is now: it may run)
    wait_for(lambda: runs(store, tag) == 2, WAIT_S, "the new job did not run")


def test_a_deployment_deleted_and_made_again_runs_its_keyed_jobs_again(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """Deleting a deployment forgets its jobs' idempotency keys (they live with the jobs, outside its own keys): the
    same name deployed again runs a job sent with an old key, instead of answering with the deleted one's job."""
    reborn = DeploymentConfig(
        name="reborn", import_path="tests.shared_run_deployments:counted", num_replicas=1, graceful_shutdown_timeout_s=1
    )
    prefer = {"Prefer": "respond-async"}
    with Client(farm.effective_redis_url) as client:

        def finished(job_id: str) -> bool:
            return httpx.get(f"{farm.base_url}/-/jobs/{job_id}").json()["status"] == "finished"

        job_ids = []
        try:
            for _ in range(2):
                [goal] = client.deploy(AppConfig(deployments=[reborn])).values()
                client.wait_for_goal(goal, timeout=60)
                wait_for(lambda: post(farm.base_url, "/reborn", {"tag": "ready"}, None).status_code == 200, WAIT_S)
                sent = post(farm.base_url, "/reborn", {"tag": tag}, tag, **prefer)
                assert sent.status_code == 202, sent.text
                job_ids.append(sent.json()["job_id"])
                wait_for(lambda: finished(job_ids[-1]), WAIT_S, "the job did not finish")
                client.wait_for_goal(client.delete("reborn"), timeout=60)
                wait_for(
                    lambda: not store.exists(KEYS.job_idempotency("reborn", tag)),
                    WAIT_S,
                    "the deleted deployment's job key is still there",
                )
        finally:
            if "reborn" in client.deployments():
                client.wait_for_goal(client.delete("reborn"), timeout=60)
    assert job_ids[0] != job_ids[1]
    assert runs(store, tag) == 2


# -- the response cache ----------------------------------------------------------------------------------------------


def settled_cache_counts(farm: Farm, deployment: str) -> dict[str, float]:
    """cache_counts once the same over two reads more than a flush apart: what the gateways counted earlier is all
    in."""
    last = (time.monotonic(), cache_counts(farm, deployment))

    def unchanged() -> bool:
        nonlocal last
        if time.monotonic() - last[0] <= FLUSH_INTERVAL_S:
            return False
        now = (time.monotonic(), cache_counts(farm, deployment))
        same, last = now[1] == last[1], now
        return same

    wait_for(unchanged, WAIT_S, "the cache counts did not settle")
    return last[1]


def cache_counts(farm: Farm, deployment: str) -> dict[str, float]:
    """streamserve_cache_requests_total by result, as GET /metrics shows it."""
    found = {}
    for line in httpx.get(farm.base_url + "/metrics").text.splitlines():
        head = f'streamserve_cache_requests_total{{deployment="{deployment}",result="'
        if line.startswith(head):
            result, value = line[len(head) :].split('"} ')
            found[result] = float(value)
    return found


def test_an_identical_request_is_answered_from_the_cache(farm: Farm, store: redis.Redis, tag: str) -> None:
    before = cache_counts(farm, "cached")
    first = post(farm.base_url, "/cached", {"tag": tag}, None)
    assert (first.status_code, first.headers["x-cache"]) == (200, "miss")
    again = post(farm.base_url, "/cached", {"tag": tag}, None)
    assert (again.status_code, again.headers["x-cache"], again.json()) == (200, "hit", {"tag": tag, "run": 1})
    with Client(farm.effective_redis_url) as client:
        assert client.call("cached", {"tag": tag}) == {"tag": tag, "run": 1}
    assert runs(store, tag) == 1
    after = cache_counts(farm, "cached")
    assert after["hit"] - before.get("hit", 0) == 2
    assert after["miss"] - before.get("miss", 0) == 1
    # Another body is another request.
    assert post(farm.base_url, "/cached", {"tag": tag, "n": 2}, None).headers["x-cache"] == "miss"


def test_cache_control_asking_for_a_fresh_reply_runs_anew_and_refreshes_the_entry(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    assert post(farm.base_url, "/cached", {"tag": tag}, None).json() == {"tag": tag, "run": 1}
    assert post(farm.base_url, "/cached", {"tag": tag}, None).headers["x-cache"] == "hit"  # the gateway keeps a copy
    fresh = post(farm.base_url, "/cached", {"tag": tag}, None, **{"Cache-Control": "no-cache"})
    assert (fresh.headers["x-cache"], fresh.json()) == ("miss", {"tag": tag, "run": 2})
    hit = post(farm.base_url, "/cached", {"tag": tag}, None)
    assert (hit.headers["x-cache"], hit.json()) == ("hit", {"tag": tag, "run": 2})
    assert runs(store, tag) == 2
    # The other ways to ask for a fresh reply do the same, as does a directive among others.
    fresh_ways = ["no-store", "max-age=0", "max-age=00", 'max-age="0"', "private, No-Cache"]
    for run, directive in enumerate(fresh_ways, start=3):
        fresh = post(farm.base_url, "/cached", {"tag": tag}, None, **{"Cache-Control": directive})
        assert (fresh.headers["x-cache"], fresh.json()) == ("miss", {"tag": tag, "run": run}), directive
    last = 2 + len(fresh_ways)
    assert post(farm.base_url, "/cached", {"tag": tag}, None, **{"Cache-Control": "max-age=60"}).json()["run"] == last
    # A max-age of no ASCII digits (a latin-1 superscript two, which str.isdigit() takes) asks for nothing: a hit.
    odd = post(farm.base_url, "/cached", {"tag": tag}, None, **{"Cache-Control": b"max-age=\xb2"})
    assert (odd.status_code, odd.headers.get("x-cache"), odd.json().get("run")) == (200, "hit", last), odd.text
    # An HTTP/1.0 cache's Pragma: no-cache, when no Cache-Control says otherwise.
    fresh = post(farm.base_url, "/cached", {"tag": tag}, None, Pragma="no-cache")
    assert (fresh.headers["x-cache"], fresh.json()) == ("miss", {"tag": tag, "run": last + 1})
    hit = post(farm.base_url, "/cached", {"tag": tag}, None, **{"Pragma": "no-cache", "Cache-Control": "max-age=60"})
    assert (hit.headers["x-cache"], hit.json()["run"]) == ("hit", last + 1)


def test_a_gateway_answers_hits_from_its_copy_for_at_most_local_ttl_s(farm: Farm, store: redis.Redis, tag: str) -> None:
    """A hit read from Redis is kept by the gateway for local_ttl_s (1 s by default): an entry deleted from Redis by
    hand is still served from that copy, then no more. Hits from the copy are counted all the same."""
    body = {"tag": tag}
    assert post(farm.base_url, "/cached", body, None).headers["x-cache"] == "miss"
    before = settled_cache_counts(farm, "cached")  # (other tests' hits, flushed a second late, are in it)
    assert post(farm.base_url, "/cached", body, None).headers["x-cache"] == "hit"  # read from Redis, and kept
    [entry] = [
        key for key in store.scan_iter(match="streamserve:{cached}:cache:*") if tag in str(store.hget(key, "body"))
    ]
    store.delete(entry)
    copy = post(farm.base_url, "/cached", body, None)
    assert (copy.headers["x-cache"], copy.json()) == ("hit", {"tag": tag, "run": 1})

    def hits() -> float:
        return cache_counts(farm, "cached").get("hit", 0) - before.get("hit", 0)

    wait_for(lambda: hits() == 2, WAIT_S, lambda: f"hits counted: {hits()}, not 2")
    wait_for(lambda: post(farm.base_url, "/cached", body, None).headers["x-cache"] == "miss", 5.0, "the copy lived on")
    assert runs(store, tag) == 2


def test_with_local_ttl_s_0_every_hit_asks_redis(farm: Farm, store: redis.Redis, tag: str) -> None:
    body = {"tag": tag}
    assert post(farm.base_url, "/shared-cache", body, None).headers["x-cache"] == "miss"
    assert post(farm.base_url, "/shared-cache", body, None).headers["x-cache"] == "hit"
    for key in store.scan_iter(match="streamserve:{shared-cache}:cache:*"):
        store.delete(key)
    assert post(farm.base_url, "/shared-cache", body, None).headers["x-cache"] == "miss"
    assert runs(store, tag) == 2


def test_a_gateways_copy_never_outlives_the_entry_in_redis(farm: Farm, store: redis.Redis, tag: str) -> None:
    """``brief-cache`` keeps entries 2 s and asks for copies of 60 s: a copy lapses with its entry."""
    body = {"tag": tag}
    assert post(farm.base_url, "/brief-cache", body, None).headers["x-cache"] == "miss"
    assert post(farm.base_url, "/brief-cache", body, None).headers["x-cache"] == "hit"  # kept, for the 2 s at most
    wait_for(lambda: not any(store.scan_iter(match="streamserve:{brief-cache}:cache:*")), WAIT_S, "the entry lived on")
    assert post(farm.base_url, "/brief-cache", body, None).headers["x-cache"] == "miss"
    assert runs(store, tag) == 2


def test_fifty_identical_requests_in_flight_through_two_gateways_run_once(
    farm: Farm, store: redis.Redis, tag: str, tmp_path: Path
) -> None:
    processes = Processes(farm.effective_redis_url, tmp_path)
    hold = f"hold:{tag}"
    store.set(hold, 1)
    body = {"tag": tag, "hold": hold}
    try:
        urls = [farm.base_url, processes.start_gateway().url]
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            calls = [pool.submit(post, urls[i % 2], "/cached", body, None) for i in range(50)]
            wait_for(
                lambda: cache_waiting(store) == 49,
                WAIT_S,
                lambda: f"{cache_waiting(store)} requests joined the run, not 49",
            )
            store.delete(hold)
            answers = [call.result(timeout=WAIT_S) for call in calls]
    finally:
        store.delete(hold)
        processes.stop_all()
    assert [a.status_code for a in answers] == [200] * 50
    assert {orjson.dumps(a.json()) for a in answers} == {orjson.dumps({"tag": tag, "run": 1})}
    assert sorted(a.headers["x-cache"] for a in answers) == ["coalesced"] * 49 + ["miss"]
    assert runs(store, tag) == 1


def test_the_cache_keeps_at_most_max_entries(farm: Farm, store: redis.Redis, tag: str) -> None:
    for n in range(20):
        assert post(farm.base_url, "/tiny-cache", {"tag": tag, "n": n}, None).headers["x-cache"] == "miss"
    assert len(list(store.scan_iter(match="streamserve:{tiny-cache}:cache:*"))) == 3
    assert store.zcard(KEYS.cache_index("tiny-cache")) == 3
    # The newest are the ones kept.
    assert post(farm.base_url, "/tiny-cache", {"tag": tag, "n": 19}, None).headers["x-cache"] == "hit"
    assert post(farm.base_url, "/tiny-cache", {"tag": tag, "n": 0}, None).headers["x-cache"] == "miss"


def test_a_deploy_that_changes_user_config_never_serves_an_old_entry(farm: Farm, store: redis.Redis, tag: str) -> None:
    assert post(farm.base_url, "/reconfigured", {"tag": tag}, None).headers["x-cache"] == "miss"
    assert post(farm.base_url, "/reconfigured", {"tag": tag}, None).headers["x-cache"] == "hit"
    changed = DeploymentConfig(
        name="reconfigured",
        import_path="tests.shared_run_deployments:counted",
        num_replicas=1,
        user_config={"v": 2},
        response_cache=ResponseCacheConfig(),
        graceful_shutdown_timeout_s=2,
    )
    with Client(farm.effective_redis_url) as client:
        for goal in client.deploy(AppConfig(deployments=[changed])).values():
            client.wait_for_goal(goal, timeout=WAIT_S)

    def missed() -> bool:  # hits until the gateway has the new config (long-polled), then one miss
        return bool(post(farm.base_url, "/reconfigured", {"tag": tag}, None).headers["x-cache"] == "miss")

    wait_for(missed, WAIT_S, "the new user_config was never a miss")
    assert runs(store, tag) == 2


def test_a_reply_made_before_the_new_user_config_took_effect_is_not_kept_for_it(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """The replica has the new config while its reconfigure still runs: what it answers meanwhile is the old state's,
    and must not become the new config's cache entry."""
    body = {"tag": tag}
    assert post(farm.base_url, "/slow-config", body, None).json() == {"tag": tag, "v": 1}
    hold = f"hold:{tag}"
    store.set(hold, 1)
    try:
        changed = DeploymentConfig(
            name="slow-config",
            import_path="tests.shared_run_deployments:Configured",
            num_replicas=1,
            user_config={"v": 2, "hold": hold},
            response_cache=ResponseCacheConfig(),
            graceful_shutdown_timeout_s=2,
        )
        with Client(farm.effective_redis_url) as client:
            client.deploy(AppConfig(deployments=[changed]))
        wait_for(lambda: store.exists(f"{hold}:begun"), WAIT_S, "the replica did not begin to reconfigure")

        def missed() -> bool:  # hits until the gateway has the new config (long-polled), then a miss
            return bool(post(farm.base_url, "/slow-config", body, None).headers["x-cache"] == "miss")

        wait_for(missed, WAIT_S, "the new user_config was never a miss")
        meanwhile = post(farm.base_url, "/slow-config", body, None)
        assert (meanwhile.headers["x-cache"], meanwhile.json()) == ("miss", {"tag": tag, "v": 1})
    finally:
        store.delete(hold)

    def new_state() -> bool:
        return bool(post(farm.base_url, "/slow-config", body, None).json()["v"] == 2)

    wait_for(new_state, WAIT_S, "the new user_config never took effect")
    kept = post(farm.base_url, "/slow-config", body, None)
    assert (kept.headers["x-cache"], kept.json()) == ("hit", {"tag": tag, "v": 2})


def test_old_code_serving_through_a_rollout_runs_its_own_user_config_and_fills_no_new_entry(
    farm: Farm, store: redis.Redis, tag: str
) -> None:
    """A deploy that changes the code and the user_config at once: the old replica, which serves until the new one
    is up, keeps its user_config, and what it answers is not kept as the new version's entry."""
    body = {"tag": tag}
    assert post(farm.base_url, "/versioned", body, None).json() == {"tag": tag, "v": 1, "name": "one"}
    hold = f"hold:{tag}"
    store.set(hold, 1)
    changed = DeploymentConfig(
        name="versioned",
        import_path="tests.shared_run_deployments:Versioned",
        init_kwargs={"name": "two", "hold": hold},
        num_replicas=1,
        user_config={"v": 2},
        response_cache=ResponseCacheConfig(),
        graceful_shutdown_timeout_s=2,
    )
    with Client(farm.effective_redis_url) as client:
        try:
            (goal,) = client.deploy(AppConfig(deployments=[changed])).values()
            wait_for(lambda: store.exists(f"{hold}:begun"), WAIT_S, "the new code did not begin to load")

            def missed() -> bool:  # hits until the gateway has the new config (long-polled), then a miss
                return bool(post(farm.base_url, "/versioned", body, None).headers["x-cache"] == "miss")

            wait_for(missed, WAIT_S, "the new version was never a miss")
            for _ in range(2):  # answered by the old code as it was, and never kept for the new version
                meanwhile = post(farm.base_url, "/versioned", body, None)
                assert (meanwhile.headers["x-cache"], meanwhile.json()) == ("miss", {"tag": tag, "v": 1, "name": "one"})
        finally:
            store.delete(hold)
        client.wait_for_goal(goal, timeout=WAIT_S)

    def new_code() -> bool:  # the gateway's own copy of an old entry lives local_ttl_s at most
        return bool(post(farm.base_url, "/versioned", body, None).json()["name"] == "two")

    wait_for(new_code, WAIT_S, "the new code never answered")
    kept = post(farm.base_url, "/versioned", body, None)
    assert (kept.headers["x-cache"], kept.json()) == ("hit", {"tag": tag, "v": 2, "name": "two"})


def test_a_streaming_deployment_with_response_cache_is_a_config_error(farm: Farm) -> None:
    streaming = DeploymentConfig(
        name="cached-stream", import_path="examples.tokens:generate", num_replicas=1, response_cache={}
    )
    with Client(farm.effective_redis_url) as client:
        [goal] = client.deploy(AppConfig(deployments=[streaming])).values()
        try:
            with pytest.raises(GoalFailedError, match=r"response_cache: examples\.tokens:generate is a generator"):
                client.wait_for_goal(goal, timeout=WAIT_S)
        finally:
            client.wait_for_goal(client.delete("cached-stream"), timeout=WAIT_S)


def test_identical_streams_after_a_failed_cache_update_each_get_every_chunk(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    """response_cache added to a running streaming deployment: the update fails (new replicas refuse it) and the old
    replica serves on, while the gateway takes its requests as cacheable. Identical streams that joined one run get
    no copy of it (its chunks went to its own caller only): they run anew, and every caller gets every chunk."""
    fields: dict[str, Any] = {"import_path": "tests.shared_run_deployments:counted_stream", "num_replicas": 1}
    plain = DeploymentConfig(name="later-cached", graceful_shutdown_timeout_s=1, **fields)
    cached = DeploymentConfig(name="later-cached", graceful_shutdown_timeout_s=1, response_cache={}, **fields)
    hold = f"hold:{tag}"
    with Client(farm.effective_redis_url) as client:
        try:
            client.wait_for_goal(*client.deploy(AppConfig(deployments=[plain])).values(), timeout=60)
            with pytest.raises(GoalFailedError, match="is a generator"):
                client.wait_for_goal(*client.deploy(AppConfig(deployments=[cached])).values(), timeout=60)
            probe = {"tag": f"{tag}-probe", "n": 1}
            wait_for(lambda: "x-cache" in post(farm.base_url, "/later-cached", probe, None).headers, WAIT_S)
            store.set(hold, 1)
            body = {"tag": tag, "hold": hold}
            first = pool.submit(post, farm.base_url, "/later-cached", body, None)
            wait_for(lambda: runs(store, tag) == 1, WAIT_S, "the first stream did not start")
            joined = [pool.submit(post, farm.base_url, "/later-cached", body, None) for _ in range(2)]
            waiters = KEYS.cache_waiters("later-cached", "*")
            wait_for(lambda: sum(int(store.llen(k)) for k in store.scan_iter(match=waiters)) == 2, WAIT_S)
            store.delete(hold)
            answers = [answer.result(timeout=WAIT_S) for answer in (first, *joined)]
        finally:
            store.delete(hold)
            client.wait_for_goal(client.delete("later-cached"), timeout=60)
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert [orjson.loads(line) for line in answer.text.splitlines()] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [answer.headers["x-cache"] for answer in answers] == ["miss", "miss", "miss"]  # each its own run
    assert runs(store, tag) == 3


def test_a_caller_waiting_on_a_deleted_deployment_gets_an_error_not_a_hang(
    farm: Farm, store: redis.Redis, tag: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    hold = f"hold:{tag}"
    store.set(hold, 1)
    body = {"tag": tag, "hold": hold}
    try:
        first = pool.submit(post, farm.base_url, "/doomed", body, tag, **{"X-Request-Timeout": "15"})
        wait_for(lambda: runs(store, tag) == 1, WAIT_S, "the first request did not start")
        waiter = pool.submit(post, farm.base_url, "/doomed", body, tag)
        waiters = KEYS.idempotency_waiters("doomed", tag)
        wait_for(lambda: store.llen(waiters) == 1, WAIT_S, "the second request did not join the run")
        with Client(farm.effective_redis_url) as client:
            client.wait_for_goal(client.delete("doomed"), timeout=60)
        answer = waiter.result(timeout=WAIT_S)
        assert answer.status_code == 404
        assert "doomed" in answer.json()["message"]
        # The running request will never end either: once the replica is gone its caller is told so.
        gone = first.result(timeout=WAIT_S)
        assert gone.status_code == 404 and "'doomed' was deleted before request" in gone.json()["message"], gone.text
    finally:
        store.delete(hold)


def test_a_full_redis_refuses_new_runs_and_loses_nothing_kept(farm: Farm, store: redis.Redis, tag: str) -> None:
    assert post(farm.base_url, "/counted", {"tag": tag}, tag).status_code == 200
    assert post(farm.base_url, "/cached", {"tag": tag}, None).headers["x-cache"] == "miss"
    limit = store.config_get("maxmemory")["maxmemory"]
    store.config_set("maxmemory", 1)  # full (noeviction): every write is refused
    try:
        refused = [
            post(farm.base_url, "/counted", {"tag": f"{tag}-new"}, f"{tag}-new"),
            post(farm.base_url, "/cached", {"tag": f"{tag}-new"}, None),
        ]
        replayed = post(farm.base_url, "/counted", {"tag": tag}, tag)  # a read: Redis answers it
    finally:
        store.config_set("maxmemory", limit)
    assert [answer.status_code for answer in refused] == [503, 503]
    assert all("out of memory" in answer.json()["message"] for answer in refused)
    assert (replayed.status_code, replayed.headers["idempotent-replayed"]) == (200, "true")
    assert post(farm.base_url, "/cached", {"tag": tag}, None).headers["x-cache"] == "hit"
    assert post(farm.base_url, "/counted", {"tag": f"{tag}-new"}, f"{tag}-new").status_code == 200
    assert runs(store, tag) == 2  # once for the key, once for the cache
    assert runs(store, f"{tag}-new") == 1
