"""The issue's reproduction and every write path of a replica count past its maximum: 400 over HTTP, ConfigError in
the client, exit 2 from the CLI, each naming the field; and nothing is written (issue 27, defect 4)."""

from __future__ import annotations

import subprocess

import orjson
import pytest
import redis.asyncio as aioredis

from streamserve.client import AsyncClient
from streamserve.control.desired_state import DesiredState
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, DeploymentConfig, parse_config
from streamserve.wire.errors import ConfigError
from streamserve.wire.limits import SETTING, ConfigLimits
from tests.harness.paths import STREAMSERVE
from tests.integration.conftest import deploy, gateway_http

HUGE = 18446744073709551615  # 2**64 - 1: the issue's number
REPRODUCTION = {"deployments": [{"name": "n", "import_path": "examples.functions:add", "num_replicas": HUGE}]}
MESSAGE = f"num_replicas: {HUGE} is above the maximum, 1024 (to allow more, set {SETTING}=num_replicas=N"


async def snapshot(aredis: aioredis.Redis) -> dict[bytes, bytes | None]:
    return {key: await aredis.dump(key) for key in sorted(await aredis.keys("*"))}


async def test_the_issue_s_deploy_is_a_400_naming_num_replicas(settings: Settings, aredis: aioredis.Redis) -> None:
    before = await snapshot(aredis)
    async with gateway_http(settings) as http:
        answer = await http.post("/-/deploy", content=orjson.dumps(REPRODUCTION))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "ConfigError"
    assert f"deployment 'n' (deployments[0]): {MESSAGE}" in answer.json()["message"]
    assert await snapshot(aredis) == before


async def test_a_scale_past_the_maximum_is_refused_on_every_path(settings: Settings, aredis: aioredis.Redis) -> None:
    await deploy(settings, num_replicas=1)
    before = await snapshot(aredis)

    async with gateway_http(settings) as http:
        answer = await http.post("/-/deployments/rec/scale", content=orjson.dumps({"num_replicas": HUGE}))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "ConfigError"
    assert f"deployment 'rec': {MESSAGE}" in answer.json()["message"]

    async with AsyncClient(settings=settings) as client:
        with pytest.raises(ConfigError, match=r"deployment 'rec': num_replicas: 1025 is above the maximum, 1024"):
            await client.scale("rec", 1025)
    cli = subprocess.run(
        [STREAMSERVE, "scale", "rec", str(HUGE), "--redis-url", settings.effective_redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 2, cli.stderr
    assert f"error: deployment 'rec': {MESSAGE}" in cli.stderr
    assert await snapshot(aredis) == before
    async with AsyncClient(settings=settings) as client:
        assert await client.scale("rec", 1024) is not None  # the maximum itself is allowed


async def test_a_raised_maximum_lets_the_writer_scale_further(settings: Settings, aredis: aioredis.Redis) -> None:
    await deploy(settings, num_replicas=1)
    raised = DesiredState(aredis, settings.keys, limits=ConfigLimits(num_replicas=4096))
    assert await raised.scale("rec", 4096) is not None
    # Read back by everyone, whatever their own maxima.
    assert (await DesiredState(aredis, settings.keys).get("rec")).num_replicas == 4096


async def test_a_farm_holds_at_most_so_many_deployments(settings: Settings, aredis: aioredis.Redis) -> None:
    limits = ConfigLimits(deployments=2)
    desired = DesiredState(aredis, settings.keys, limits=limits)

    def config(*names: str) -> AppConfig:
        return parse_config({"deployments": [{"name": n, "import_path": "examples.functions:add"} for n in names]})

    await desired.apply(config("a", "b"))
    with pytest.raises(ConfigError, match=r"the farm would hold 3 deployments: 3 is above the maximum, 2"):
        await desired.apply(config("c"))
    assert sorted(await desired.deployments()) == ["a", "b"]
    await desired.apply(config("a"))  # a farm at its maximum still takes changes to what it holds
    wider = DeploymentConfig.model_validate({"name": "b", "import_path": "examples.functions:add", "num_replicas": 2})
    await desired.apply(AppConfig(deployments=[wider]))


@pytest.mark.parametrize(
    ("path", "body", "twice"),
    [
        (
            "/-/deploy",
            b'{"deployments": [{"name": "n", "import_path": "examples.functions:add", "num_replicas": 1, '
            b'"num_replicas": 0}]}',
            "num_replicas",
        ),
        ("/-/deploy", b'{"deployments": [{"name": "n", "import_path": "examples.functions:add"}], "deployments": []}',
         "deployments"),
        ("/-/deployments/rec/scale", b'{"num_replicas": 1, "num_replicas": 5}', "num_replicas"),
    ],
)  # fmt: skip
async def test_a_key_given_twice_in_an_admin_write_is_a_400_as_in_yaml(
    settings: Settings, aredis: aioredis.Redis, path: str, body: bytes, twice: str
) -> None:
    """A JSON parser keeps the last value without a word; the same mapping in a YAML file is refused."""
    before = await snapshot(aredis)
    async with gateway_http(settings) as http:
        answer = await http.post(path, content=body)
    assert answer.status_code == 400, answer.text
    assert f"{twice!r} is given twice in one object" in answer.json()["message"]
    assert await snapshot(aredis) == before
