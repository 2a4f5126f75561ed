"""docker/compose.yaml keeps its security promises (there is no Docker engine here to run it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "compose.yaml"


def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    found: dict[str, Any] = loaded["services"]
    return found


def test_redis_is_not_published() -> None:
    assert "ports" not in services()["redis"]


def test_the_gateway_requires_the_api_key_and_every_streamserve_service_limits_imports() -> None:
    for name in ("deploy", "scheduler", "gateway"):
        env = services()[name]["environment"]
        assert env["REDIS_URL"] == "redis://redis:6379/0", name
        assert env["STREAMSERVE_IMPORT_ALLOW"] == "${STREAMSERVE_IMPORT_ALLOW:-examples}", name
    # ${VAR:?message}: compose refuses to start while the key is unset or empty.
    assert services()["gateway"]["environment"]["STREAMSERVE_API_KEY"].startswith("${STREAMSERVE_API_KEY:?")
    # The scheduler runs user code (the replicas): it never has the key to pass on.
    assert "STREAMSERVE_API_KEY" not in services()["scheduler"]["environment"]
    assert "STREAMSERVE_API_KEY" not in services()["deploy"]["environment"]


def test_only_the_gateway_publishes_a_port() -> None:
    published = {name for name, service in services().items() if "ports" in service}
    assert published == {"gateway"}


def test_redis_keeps_its_data_on_a_volume_with_an_append_only_file() -> None:
    redis = services()["redis"]
    command = redis["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    # Without a maxmemory Redis is never full (refusing new work, as docker/README.md says): it grows until killed.
    assert command[command.index("--maxmemory") + 1] == "${STREAMSERVE_REDIS_MAXMEMORY:-1gb}"
    volume, _, path = redis["volumes"][0].partition(":")
    assert path == "/data" and volume in yaml.safe_load(COMPOSE.read_text())["volumes"]  # named, not a bind mount
    assert redis["restart"] == "unless-stopped"


def test_the_redis_image_is_pinned_to_a_patch_release() -> None:
    image = services()["redis"]["image"]
    assert re.fullmatch(r"redis:\d+\.\d+\.\d+(-alpine)?", image), image


def test_every_long_running_service_has_a_healthcheck_and_a_restart_policy() -> None:
    long_running = {name: s for name, s in services().items() if s.get("restart") != "no"}
    assert set(long_running) == {"redis", "scheduler", "gateway"}
    for name, service in long_running.items():
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["test"][0] == "CMD", name
    assert services()["redis"]["healthcheck"]["test"][1:] == ["redis-cli", "ping"]
    assert services()["scheduler"]["healthcheck"]["test"][1:] == ["streamserve", "health"]
    assert "/-/healthz" in " ".join(services()["gateway"]["healthcheck"]["test"])
