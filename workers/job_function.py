"""What an RQ worker runs for each asynchronous job: one ordinary call through the deployment's request stream.

The job takes JSON-able arguments only and returns the deployment's JSON
result, so RQ's JSON serializer can carry both. A failed call fails the job:
before re-raising, the function records the error's type and message in the
job's meta (``streamserve.client.jobs.ERROR_META``), which ``GET /-/jobs/<id>``
shows, instead of making readers parse a traceback.

Each worker process shares one Client (one reply stream, one reader) across
its jobs. ``streamserve job-worker`` hands it its settings with
``configure``; a plain ``rq worker`` gets them from the environment on the
first job, like any streamserve process.
"""

from __future__ import annotations

import threading
from typing import Any

from rq import get_current_job

from streamserve.client import Client
from streamserve.client.jobs import ERROR_META
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import StreamServeError, error_fields

_lock = threading.Lock()
_settings: Settings | None = None
_client: Client | None = None


def configure(settings: Settings) -> None:
    """Use these settings for the calls of this process's jobs (closes a client made with other ones)."""
    global _settings
    close()
    with _lock:
        _settings = settings


def close() -> None:
    """Close this process's client, if a job made one (a worker does so on exit)."""
    global _client
    with _lock:
        client, _client = _client, None
    if client is not None:
        client.close()


def _shared_client() -> Client:
    global _client, _settings
    with _lock:
        if _client is None:
            if _settings is None:
                _settings = Settings()  # a plain `rq worker`: read the environment, once
            _client = Client(settings=_settings)
        return _client


def run(name: str, body: Any, method: str = "", timeout: float | None = None) -> Any:
    """Call deployment or endpoint ``name`` with ``body``; the result, or the job fails with the call's error."""
    try:
        return _shared_client().call(name, body, timeout=timeout, method=method)
    except StreamServeError as exc:
        job = get_current_job()
        if job is not None:
            job.meta[ERROR_META] = error_fields(exc)
            job.save_meta()  # type: ignore[no-untyped-call]  # (rq leaves it unannotated)
        raise
