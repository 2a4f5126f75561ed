"""One farm (`streamserve up` with its own embedded Redis) shared by the end-to-end tests that need it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.farm import Farm, running_farm

HERE = Path(__file__).parent


@pytest.fixture(scope="package")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    with running_farm(HERE / "config.yaml", tmp_path_factory.mktemp("farm")) as farm:
        yield farm
