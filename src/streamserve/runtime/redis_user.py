"""Whether the Redis user a process's settings name may do what the farm does, asked at its start."""

from __future__ import annotations

from streamserve.runtime.settings import Settings
from streamserve.transport.redis_permissions import check_permissions


def check_redis_user(settings: Settings) -> None:
    """ConfigError (exit 2) naming what the farm's Redis user may not do that the farm does (transport.
    redis_permissions), for the farm's Redis and, with job workers on, the one that keeps its jobs."""
    jobs_url = settings.effective_jobs_redis_url if settings.job_workers else None
    check_permissions(settings.effective_redis_url, settings.keys, jobs_url)
