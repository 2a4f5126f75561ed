"""Asynchronous jobs without Redis: status folding, the JSON shape, error parsing and the Prefer header."""

from __future__ import annotations

import fakeredis
import pytest
from rq.job import JobStatus as RQJobStatus

from streamserve.app.gateway import _prefers_async
from streamserve.client.jobs import _STATUS_OF, JobInfo, JobQueue, error_from_traceback
from streamserve.runtime.settings import Settings
from streamserve.wire.keys import Keys
from streamserve.wire.messages import now_ms
from streamserve.wire.states import JobStatus


def test_every_rq_status_has_a_caller_status() -> None:
    assert set(_STATUS_OF) == set(RQJobStatus)
    assert _STATUS_OF[RQJobStatus.STARTED] is JobStatus.STARTED
    assert _STATUS_OF[RQJobStatus.CANCELED] is JobStatus.CANCELED


def test_job_info_json_has_result_only_when_finished_and_error_only_when_failed() -> None:
    assert JobInfo("j", JobStatus.QUEUED).to_json() == {"job_id": "j", "status": "queued"}
    assert JobInfo("j", JobStatus.FINISHED, result=None).to_json() == {
        "job_id": "j",
        "status": "finished",
        "result": None,
    }
    failed = JobInfo("j", JobStatus.FAILED, error={"error": "KeyError", "message": "'b'"})
    assert failed.to_json() == {"job_id": "j", "status": "failed", "error": {"error": "KeyError", "message": "'b'"}}


def test_error_from_rq_traceback() -> None:
    timeout = (
        "Traceback (most recent call last):\n  ...\n"
        "rq.timeouts.JobTimeoutException: Task exceeded maximum timeout value (60 seconds)\n"
    )
    assert error_from_traceback(timeout, "x") == {
        "error": "JobTimeoutException",
        "message": "Task exceeded maximum timeout value (60 seconds)",
    }
    assert error_from_traceback("Traceback ...\nSystemExit\n", "x") == {"error": "SystemExit", "message": ""}
    assert error_from_traceback(None, "the job ended stopped") == {
        "error": "JobFailed",
        "message": "the job ended stopped",
    }


def test_queue_name_is_under_the_prefix_and_settings_reach_child_processes() -> None:
    assert Keys("tenant").jobs_queue() == "tenant:jobs"
    env = Settings(job_workers=3, job_result_ttl_s=60).to_env()
    assert env["STREAMSERVE_JOB_WORKERS"] == "3" and env["STREAMSERVE_JOB_RESULT_TTL_S"] == "60"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ((), False),
        (("respond-async",), True),
        (("wait=10, Respond-Async",), True),
        (("return=minimal", "respond-async; x=y"), True),
        (("respond-asynchronously",), False),
        (("return=representation",), False),
    ],
)
def test_prefer_respond_async(headers: tuple[str, ...], expected: bool) -> None:
    assert _prefers_async(list(headers)) is expected


@pytest.mark.parametrize(
    ("result_ttl_s", "claimed_s_ago", "gone"),
    [(3600, 30, False), (3600, 61, True), (5, 6, True), (5, 4, False)],
)
def test_a_keyed_job_missing_is_gone_once_it_could_have_been_queued_and_lapsed(
    result_ttl_s: int, claimed_s_ago: int, gone: bool
) -> None:
    """A job named by a key claimed just now may still be on its way to the queue; under a result TTL of 5 s, one
    claimed 6 s ago may have run and lapsed (it answered "queued" of a job that was gone, for the rest of a minute)."""
    queue = JobQueue(fakeredis.FakeRedis(), Keys(), result_ttl_s)
    assert queue._gone("no-such-job", now_ms() - claimed_s_ago * 1000) is gone
