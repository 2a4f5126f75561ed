"""docker/compose.yaml keeps its security promises (there is no Docker engine here to run it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "compose.yaml"


def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded["services"]


def test_redis_is_not_published() -> None:
    assert "ports" not in services()["redis"]


def test_every_streamserve_service_requires_the_api_key_and_limits_imports() -> None:
    for name in ("deploy", "scheduler", "gateway"):
        env = services()[name]["environment"]
        # ${VAR:?message}: compose refuses to start while the key is unset or empty.
        assert env["STREAMSERVE_API_KEY"].startswith("${STREAMSERVE_API_KEY:?"), name
        assert env["STREAMSERVE_IMPORT_ALLOW"] == "${STREAMSERVE_IMPORT_ALLOW:-examples}", name


def test_only_the_gateway_publishes_a_port() -> None:
    published = {name for name, service in services().items() if "ports" in service}
    assert published == {"gateway"}
