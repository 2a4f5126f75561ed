"""A job worker runs streamserve's job function, as streamserve queues it, and nothing else (issue 27, defect 3).

RQ stores a job as a dotted function name with arguments, callbacks and webhooks; anyone who can write to Redis can
store one. GuardedJob, the job class of our workers and queue, refuses every job but ours, before importing anything.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from rq import Callback, Queue, Retry
from rq.webhook import Webhook

from streamserve.client.job_guard import JOB_FUNCTION, GuardedJob, JobRefusedError
from streamserve.client.jobs import JOB_SERIALIZER
from streamserve.workers import job_function
from streamserve.workers.job_worker import JobWorker

MARK = "tests.job_callbacks.leave_mark"


@pytest.fixture
def queue() -> Iterator[Queue]:
    connection = fakeredis.FakeRedis()
    yield Queue("jobs", connection=connection, serializer=JOB_SERIALIZER)
    connection.close()


def stored(queue: Queue, func: str, args: Any = ("rec", {"x": 1}, "", None), **options: Any) -> GuardedJob:
    """The job as a job worker reads it back, after someone enqueued it with stock RQ."""
    job = queue.enqueue_call(func, args=args, **options)
    return GuardedJob.fetch(job.id, connection=queue.connection, serializer=JOB_SERIALIZER)


def test_a_job_as_streamserve_queues_it_runs_our_function(queue: Queue) -> None:
    ok = (("rec", {"x": 1}, "", None), ("rec", [1], "predict", 2.5), ("rec", None), ("rec", 1, "m"))
    for args in (*ok, ("rec", 1, "", None, "low"), ("rec", 1, "", 2.5, "high"), ("rec", 1, "", None, "low", "gold")):
        job = stored(queue, JOB_FUNCTION, args)
        assert job.refusal() is None
        assert job.func is job_function.run


@pytest.mark.parametrize(
    ("func", "args", "options", "reason"),
    [
        ("os.system", ("touch x",), {}, "it names 'os.system', not 'streamserve.workers.job_function.run'"),
        ("builtins.eval", ("1",), {}, "it names 'builtins.eval'"),
        (JOB_FUNCTION, ("rec",), {}, "its arguments are not (name, body, method, timeout, priority, tenant, model)"),
        (JOB_FUNCTION, ("rec", 1, "", None, 5), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1, "", None, "urgent"), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1, "", None, "low", 1), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1, "", None, "low", "no spaces"), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1, "", None, "low", "gold", 1), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1, "", None, "low", "gold", "no spaces"), {}, "its arguments are not"),
        (JOB_FUNCTION, (["rec"], 1), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1, 7), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1, "", "10"), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1, "", True), {}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1), {"kwargs": {"method": "m"}}, "its arguments are not"),
        (JOB_FUNCTION, ("rec", 1), {"on_failure": Callback("os.system")}, "it carries callbacks ('os.system')"),
        (JOB_FUNCTION, ("rec", 1), {"on_success": Callback(MARK)}, f"it carries callbacks ('{MARK}')"),
        (JOB_FUNCTION, ("rec", 1), {"on_stopped": Callback(MARK)}, "it carries callbacks"),
        (JOB_FUNCTION, ("rec", 1), {"webhooks": [Webhook("http://10.0.0.1/", "failed")]}, "it carries webhooks"),
    ],
)
def test_any_other_job_is_refused_before_anything_it_names_is_imported(
    queue: Queue, func: str, args: Any, options: dict[str, Any], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    job = stored(queue, func, args, **options)
    refusal = job.refusal()
    assert refusal is not None and refusal.startswith(reason)
    with caplog.at_level(logging.ERROR), pytest.raises(JobRefusedError) as refused:
        job.perform()
    assert str(refused.value) == f"job {job.id} refused: {refusal}"
    assert f"job {job.id} refused, it fails without running: {refusal}" in caplog.text


def test_a_payload_that_is_not_json_is_refused(queue: Queue) -> None:
    job = stored(queue, JOB_FUNCTION)
    queue.connection.hset(job.key, "data", b"\x80\x04not json")
    assert GuardedJob.fetch(job.id, connection=queue.connection, serializer=JOB_SERIALIZER).refusal() == (
        "its payload is not a job RQ's JSON serializer can read"
    )


def test_a_long_or_strange_name_is_shown_escaped_and_cut(queue: Queue) -> None:
    refusal = stored(queue, "os.system\x1b[2J" + "x" * 1000, ("a",)).refusal()
    assert refusal is not None and "\x1b" not in refusal and "\\x1b[2J" in refusal
    assert len(refusal) < 300 and "...(cut)" in refusal


def test_callbacks_and_webhooks_are_never_imported_nor_sent(queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    monkeypatch.setattr(Webhook, "send", lambda hook, *_a, **_k: sent.append(hook.url))
    job = stored(
        queue,
        "os.system",
        ("true",),
        on_success=Callback(MARK),
        on_failure=Callback(MARK),
        on_stopped=Callback(MARK),
        webhooks=[Webhook("http://10.0.0.1/", "failed")],
        retry=Retry(max=3),
    )
    assert (job.success_callback, job.failure_callback, job.stopped_callback) == (None, None, None)
    job.send_webhooks("failed")
    assert sent == []
    assert job.retries_left == 3 and not job.should_retry  # refused again anyway: not retried


def test_our_job_worker_reads_every_job_as_a_guarded_one(queue: Queue) -> None:
    assert JobWorker.job_class is GuardedJob
    assert JobWorker([queue], connection=queue.connection, serializer=JOB_SERIALIZER).job_class is GuardedJob
