"""One farm (`streamserve up` with its own embedded Redis) shared by the end-to-end tests that need it, and what the
tests of any farm use beside it: its Redis, a Python client, a fresh tag per test, a pool of caller threads.

``store`` and ``client`` take the ``farm`` of the test asking for them: a module with a farm of its own (a config of
its own) defines ``farm`` again, and they follow it.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamserve import Client
from tests.harness.farm import Farm, running_farm

HERE = Path(__file__).parent


@pytest.fixture(scope="package")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm(HERE / "config.yaml", tmp_path_factory.mktemp("farm")) as farm:
        yield farm


@pytest.fixture
def store(farm: Farm) -> Iterator[redis.Redis]:
    """A connection to the farm's Redis."""
    connection = redis.Redis.from_url(farm.effective_redis_url)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def client(farm: Farm) -> Iterator[Client]:
    """A Python client of the farm, one per module."""
    with Client(farm.effective_redis_url) as client:
        yield client


@pytest.fixture
def tag() -> str:
    """A name no other test uses (for the Redis keys and bodies of one test)."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """Threads for callers that wait at once."""
    with concurrent.futures.ThreadPoolExecutor(32) as executor:
        yield executor
