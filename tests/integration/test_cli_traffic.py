"""`streamserve traffic`: without --shadow the endpoint keeps its shadows; --shadow with no values clears them.

The real command line (in-process) against the real redis-server, read back as a user would:
``streamserve status --json`` and the endpoint's hash field in Redis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from streamserve.cli.main import main as cli_main
from streamserve.runtime.settings import Settings

CONFIG = """\
deployments:
  - {name: classify_v1, import_path: 'examples.echo:Echo', route_prefix: null}
  - {name: classify_v2, import_path: 'examples.echo:Echo', route_prefix: null}
  - {name: classify_v3, import_path: 'examples.echo:Echo', route_prefix: null}
endpoints:
  - name: classify
    route_prefix: /classify
    traffic: {classify_v1: 0.9, classify_v2: 0.1}
    shadow: {classify_v3: 0.05}
"""


def streamserve(capsys: pytest.CaptureFixture[str], redis_url: str, command: str, *args: str) -> str:
    """Run ``streamserve COMMAND --redis-url URL ARGS`` in-process; return what it printed (it must exit 0)."""
    code = cli_main([command, "--redis-url", redis_url, *args])
    out, err = capsys.readouterr()
    assert code == 0, f"streamserve {command} {' '.join(args)} exited {code}:\n{out}\n{err}"
    return out


def endpoint_in_status(capsys: pytest.CaptureFixture[str], redis_url: str) -> dict[str, Any]:
    [endpoint] = orjson.loads(streamserve(capsys, redis_url, "status", "--json"))["endpoints"]
    assert endpoint["name"] == "classify"
    return dict(endpoint)


def endpoint_in_redis(redis_url: str, settings: Settings) -> dict[str, Any]:
    """``HGET {streamserve}:endpoints classify``, as redis-cli would show it."""
    with redis.Redis.from_url(redis_url) as r:
        raw = r.hget(settings.keys.endpoints(), "classify")
    assert raw is not None
    return dict(orjson.loads(raw))


def test_traffic_without_shadow_keeps_the_shadows_and_empty_shadow_clears_them(
    redis_url: str, settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "classify.yaml"
    config.write_text(CONFIG)
    streamserve(capsys, redis_url, "deploy", str(config))
    assert endpoint_in_status(capsys, redis_url)["shadow"] == {"classify_v3": 0.05}

    # New weights, no --shadow: the file's shadow stays.
    printed = streamserve(capsys, redis_url, "traffic", "classify", "classify_v2=1")
    assert "classify_v3=0.05" in printed
    endpoint = endpoint_in_status(capsys, redis_url)
    assert endpoint["traffic"] == {"classify_v2": 1.0}
    assert endpoint["shadow"] == {"classify_v3": 0.05}

    # --shadow with values replaces them; the next change without --shadow keeps the new ones.
    streamserve(
        capsys, redis_url, "traffic", "classify", "classify_v1=0.5", "classify_v2=0.5", "--shadow", "classify_v3=0.2"
    )
    assert endpoint_in_status(capsys, redis_url)["shadow"] == {"classify_v3": 0.2}
    streamserve(capsys, redis_url, "traffic", "classify", "classify_v1=1")
    endpoint = endpoint_in_status(capsys, redis_url)
    assert endpoint["traffic"] == {"classify_v1": 1.0}
    assert endpoint["shadow"] == {"classify_v3": 0.2}
    assert endpoint_in_redis(redis_url, settings)["shadow"] == {"classify_v3": 0.2}
    assert endpoint["route_prefix"] == "/classify"  # and the route the file gave it stays too

    # --shadow with no values: no shadows at all.
    printed = streamserve(capsys, redis_url, "traffic", "classify", "classify_v2=1", "--shadow")
    assert "classify_v3" not in printed
    endpoint = endpoint_in_status(capsys, redis_url)
    assert endpoint["traffic"] == {"classify_v2": 1.0}
    assert endpoint["shadow"] == {}
    assert endpoint_in_redis(redis_url, settings)["shadow"] == {}

    # And it stays cleared through a later change without --shadow.
    streamserve(capsys, redis_url, "traffic", "classify", "classify_v1=1")
    assert endpoint_in_status(capsys, redis_url)["shadow"] == {}


def test_an_endpoint_to_no_deployment_is_a_config_error_naming_the_file(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "stray.yaml"
    config.write_text("endpoints:\n  - name: stray\n    traffic: {nosuch: 1}\n")
    assert cli_main(["deploy", "--redis-url", redis_url, str(config)]) == 2
    assert (
        capsys.readouterr().err == f"error: {config}: endpoint 'stray' sends to 'nosuch', which is not a deployment\n"
    )
