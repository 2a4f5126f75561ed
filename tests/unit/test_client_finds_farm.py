"""Which Redis a client made without a URL uses: ``REDIS_URL``, else the farm `up` runs from ``.streamserve`` here (as
the CLI finds it), else the default. The README's `Client()` beside `streamserve up` must reach that farm, whose Redis
took another port when 6379 was taken."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from streamserve.cli.farm_lookup import beside_running_farm
from streamserve.cli.parser import build_parser
from streamserve.client.core import ClientCore
from streamserve.runtime.farm_files import DEFAULT_DATA_DIR, FarmRecord, write_farm
from streamserve.runtime.processes import process_ref
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import NotFoundError

FARM_URL = "redis://127.0.0.1:48889/0"


@pytest.fixture
def beside_a_farm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test runs in a directory `up` runs from (its farm file names this process as its `up`), without a
    REDIS_URL."""
    for name in ("REDIS_URL", "STREAMSERVE_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    me = process_ref(os.getpid())
    assert me is not None
    monkeypatch.delenv("STREAMSERVE_IMPORT_ALLOW", raising=False)
    write_farm(tmp_path / DEFAULT_DATA_DIR, FarmRecord(me, FARM_URL, "http://127.0.0.1:8000", "examples,myapp"))


def test_a_client_without_a_url_uses_the_farm_that_runs_from_here(beside_a_farm: None) -> None:
    assert ClientCore()._settings.effective_redis_url == FARM_URL


def test_the_farm_s_import_allow_list_applies_unless_the_caller_has_its_own(
    beside_a_farm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deploy from beside the farm is refused as the farm's processes would refuse it, not only by its replicas."""
    assert ClientCore()._settings.import_allow == "examples,myapp"
    assert beside_running_farm(parse(["deploy", "x.yaml"]), Settings()).import_allow == "examples,myapp"
    monkeypatch.setenv("STREAMSERVE_IMPORT_ALLOW", "mine")
    assert ClientCore()._settings.import_allow == "mine"


def test_a_url_given_or_in_the_environment_wins(beside_a_farm: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ClientCore("redis://127.0.0.1:7000/0")._settings.effective_redis_url == "redis://127.0.0.1:7000/0"
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:7001/0")
    assert ClientCore()._settings.effective_redis_url == "redis://127.0.0.1:7001/0"


def test_without_a_farm_here_the_default_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_URL", "STREAMSERVE_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert ClientCore()._settings.effective_redis_url.startswith("redis://127.0.0.1:6379")


def test_an_empty_redis_url_is_no_url(beside_a_farm: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``REDIS_URL=`` (a script's way of clearing it) meant 127.0.0.1:6379, whichever farm that was."""
    monkeypatch.setenv("REDIS_URL", "")
    assert ClientCore()._settings.effective_redis_url == FARM_URL
    assert beside_running_farm(parse(["status"]), Settings()).effective_redis_url == FARM_URL


def test_a_data_dir_no_farm_runs_from_is_an_error_not_the_default_redis(beside_a_farm: None, tmp_path: Path) -> None:
    """Else `delete NAME --data-dir WRONG` deleted NAME from whatever farm's Redis was on 6379."""
    with pytest.raises(NotFoundError, match=f"no `streamserve up` runs from {tmp_path}/nowhere/"):
        beside_running_farm(parse(["delete", "echo", "--data-dir", str(tmp_path / "nowhere")]), Settings())
    found = beside_running_farm(parse(["status", "--data-dir", str(tmp_path / DEFAULT_DATA_DIR)]), Settings())
    assert found.effective_redis_url == FARM_URL


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)
