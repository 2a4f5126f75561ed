"""A Redis out of memory: what counts as its refusal, and the processes that carry on through it say so once."""

from __future__ import annotations

import concurrent.futures
import copy
import logging
from collections.abc import Callable
from typing import Any

import pytest
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ExecAbortError, OutOfMemoryError, ResponseError
from redis.retry import Retry

from streamserve.transport.connections import WriteRefusals, refuses_writes
from streamserve.wire.config import DeploymentConfig
from streamserve.wire.errors import OverloadedError, RateLimitedError
from streamserve.workers import job_function, job_worker
from streamserve.workers.job_worker import WaitWhileFull

OOM = "command not allowed when used memory > 'maxmemory'."


def discarded_transaction() -> ExecAbortError:
    """What a transaction with a refused command ends in: EXECABORT, raised from the refusal."""
    try:
        try:
            raise OutOfMemoryError(OOM)
        except OutOfMemoryError as refusal:
            raise ExecAbortError("Transaction discarded because of previous errors.") from refusal
    except ExecAbortError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "refused"),
    [
        (OutOfMemoryError(OOM), True),
        (ResponseError("Error running script (call to f_1): @user_script:3: -OOM command not allowed when ..."), True),
        (discarded_transaction(), True),
        (ExecAbortError("Transaction discarded because of previous errors."), False),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
        (RedisConnectionError("gone"), False),
    ],
)
def test_what_counts_as_refused_for_memory(exc: Exception, refused: bool) -> None:
    assert refuses_writes(exc) is refused


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_episode_is_told_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    refusals = WriteRefusals(logging.getLogger("test"), "scheduler x", clock)
    caplog.set_level(logging.INFO, "test")
    assert not refusals.refused(RedisConnectionError("gone"))  # not a refusal: not counted, not told
    for _tick in range(50):
        assert refusals.refused(OutOfMemoryError(OOM))
    refusals.accepted()
    refusals.accepted()
    assert [r.getMessage() for r in caplog.records] == [
        f"scheduler x: Redis refuses writes, it is out of memory (maxmemory): {OOM}; carrying on, and trying again",
        "scheduler x: Redis takes writes again",
    ]


def test_a_redis_that_hovers_at_its_limit_is_told_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    refusals = WriteRefusals(logging.getLogger("test"), "w", clock)
    caplog.set_level(logging.INFO, "test")
    for _ in range(30):  # refused and taken by turns, every second
        refusals.refused(OutOfMemoryError(OOM))
        refusals.accepted()
        clock.now += 1
    assert len(caplog.records) == 2
    clock.now += WriteRefusals.QUIET_S
    refusals.refused(OutOfMemoryError(OOM))
    assert len(caplog.records) == 3


def test_a_job_workers_command_waits_while_redis_refuses_it_for_memory(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_worker.time, "sleep", lambda _s: None)
    caplog.set_level(logging.INFO, job_worker.logger.name)
    retry = WaitWhileFull(Retry(NoBackoff(), 2), WriteRefusals(job_worker.logger, "job worker 7"))
    command = commands(*[OutOfMemoryError(OOM)] * 5, "OK")
    assert retry.call_with_retry(command, lambda _e: None) == "OK"
    assert len(caplog.records) == 2  # refused, then taken again: nothing in between
    with pytest.raises(ResponseError, match="WRONGTYPE"):  # any other error is the caller's, at once
        retry.call_with_retry(commands(ResponseError("WRONGTYPE no"), "OK"), lambda _e: None)


class Flaky(Exception):
    pass


def commands(*answers: Any) -> Callable[[], Any]:
    """A command that raises or returns each of ``answers`` in turn."""
    queue = list(answers)

    def command() -> Any:
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return command


def test_every_connections_copy_of_the_policy_shares_one_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_worker.time, "sleep", lambda _s: None)
    refusals = WriteRefusals(job_worker.logger, "job worker 7")
    retry = WaitWhileFull(Retry(NoBackoff(), 2), refusals)
    copied = copy.deepcopy(retry)  # what redis-py does for each connection, then adds its retry_on_error
    copied.update_supported_errors([Flaky])
    assert copied.call_with_retry(commands(Flaky(), "OK"), lambda _e: None) == "OK"
    with pytest.raises(Flaky):  # the original policy is left as it was
        retry.call_with_retry(commands(Flaky(), "OK"), lambda _e: None)
    with pytest.raises(IndexError):  # refused on one connection, then nothing left to answer
        copied.call_with_retry(commands(OutOfMemoryError(OOM)), lambda _e: None)
    assert refusals.full  # the episode is the process's, whichever connection met it
    assert retry.call_with_retry(commands(OutOfMemoryError(OOM), "OK"), lambda _e: None) == "OK"
    assert not refusals.full


def test_max_queued_jobs_has_a_default_and_takes_no_nonsense() -> None:
    cfg = DeploymentConfig.model_validate({"name": "a", "import_path": "m:f"})
    assert cfg.max_queued_jobs == 1000
    with pytest.raises(ValueError, match="max_queued_jobs"):
        DeploymentConfig.model_validate({"name": "a", "import_path": "m:f", "max_queued_jobs": 0})
    # A bound to change at any time: it is read when a job is submitted, and rolls no replica.
    assert cfg.code_version() == cfg.model_copy(update={"max_queued_jobs": 5}).code_version()


class FakeClient:
    """Answers ``submit`` with each of ``answers`` in turn, as a done future (an exception is raised by it)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def submit(
        self,
        name: str,
        body: Any,
        *,
        timeout: float | None,
        method: str,
        priority: str = "normal",
        tenant: str = "default",
        model_id: str | None = None,
    ) -> concurrent.futures.Future[Any]:
        self.calls += 1
        answer = self.answers.pop(0)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if isinstance(answer, Exception):
            future.set_exception(answer)
        else:
            future.set_result(answer)
        return future


def refused_for_memory() -> OverloadedError:
    """What a call that Redis refused for memory raises: OverloadedError, from Redis's refusal."""
    error = OverloadedError("Redis at redis://h:1/0 is out of memory (maxmemory): nothing was written")
    error.__cause__ = OutOfMemoryError(OOM)
    return error


@pytest.fixture(autouse=True)
def fresh_job_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job function's settings as a fresh job worker has them (read from the environment on first use), not
    those a test before this one configured (an import allow-list, say)."""
    monkeypatch.setattr(job_function, "_settings", None)


def test_a_jobs_call_refused_for_memory_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_function.time, "sleep", lambda _s: None)
    client = FakeClient(refused_for_memory(), refused_for_memory(), {"ok": 1})
    monkeypatch.setattr(job_function, "_shared_client", lambda: client)
    assert job_function.run("echo", {"x": 1}) == {"ok": 1}
    assert client.calls == 3


def test_a_jobs_call_refused_for_a_full_queue_or_too_long_fails_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_function.time, "sleep", lambda _s: None)
    full_queue = FakeClient(OverloadedError("deployment 'echo' has 5 requests queued (max_queued_requests)"), 1)
    monkeypatch.setattr(job_function, "_shared_client", lambda: full_queue)
    with pytest.raises(OverloadedError, match="max_queued_requests"):  # it may run later: not the job's to retry
        job_function.run("echo", 1)
    clock = iter(range(0, 1000, 10))  # ten seconds pass at each look at the clock
    monkeypatch.setattr(job_function.time, "monotonic", lambda: next(clock))
    full_redis = FakeClient(*[refused_for_memory() for _ in range(10)])
    monkeypatch.setattr(job_function, "_shared_client", lambda: full_redis)
    with pytest.raises(OverloadedError, match="out of memory"):
        job_function.run("echo", 1)
    assert full_redis.calls == 2  # sent at 0 and 10 s; refused again at 20 s, past FULL_REDIS_WAIT_S: given up


def test_a_jobs_call_refused_by_its_tenants_rate_waits_its_turn_unless_it_comes_too_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn within FULL_REDIS_WAIT_S is waited for; one past it fails the job at once, not once the wait is spent
    (a rate of one request a day said Retry-After: 86400, and the job sat 15 s before failing)."""
    slept: list[float] = []
    monkeypatch.setattr(job_function.time, "sleep", slept.append)
    soon = FakeClient(RateLimitedError("tenant 'acme' is over its rate", retry_after_s=2.0), {"ok": 1})
    monkeypatch.setattr(job_function, "_shared_client", lambda: soon)
    assert job_function.run("echo", 1) == {"ok": 1}
    assert slept == [2.0]
    late = FakeClient(RateLimitedError("tenant 'acme' is over its rate", retry_after_s=86_400.0))
    monkeypatch.setattr(job_function, "_shared_client", lambda: late)
    with pytest.raises(RateLimitedError, match="over its rate"):
        job_function.run("echo", 1)
    assert slept == [2.0]  # no second wait
