"""One farm (`streamserve up` with its own embedded Redis) shared by the end-to-end tests that need it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.farm import Farm, wait_for

HERE = Path(__file__).parent


@pytest.fixture(scope="package")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    farm = Farm(HERE / "config.yaml", tmp_path_factory.mktemp("farm") / "up.log")
    farm.start()
    try:
        wait_for(lambda: all(d["running"] == d["target"] for d in farm.status().values()), 60, "replicas not up")
        yield farm
    finally:
        farm.stop()
