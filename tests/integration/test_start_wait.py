"""What `up` waits for before its banner, for deployments its config left unchanged: a verdict of this farm's
scheduler, never the one an earlier farm left in Redis."""

from __future__ import annotations

from streamserve.cli.start_wait import replicas_not_running
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import async_redis
from streamserve.wire.config import AppConfig, DeploymentConfig
from streamserve.wire.messages import DeploymentHealthRecord, now_ms
from streamserve.wire.states import DeploymentHealth

SINCE_MS = now_ms()


def config(**fields: object) -> AppConfig:
    return AppConfig(deployments=[DeploymentConfig.model_validate({"name": "m", "import_path": "x:y", **fields})])


async def wait(settings: Settings, cfg: AppConfig, health: DeploymentHealth | None, updated_ms: int) -> dict[str, str]:
    """The wait's answer with the verdict on ``m`` (None: no verdict) written first."""
    redis = async_redis(settings.effective_redis_url)
    try:
        if health is not None:
            record = DeploymentHealthRecord(health=health, message="boom", updated_ms=updated_ms)
            await redis.hset(settings.keys.deployment_status(), "m", record.encode())
    finally:
        await redis.aclose()
    url = settings.effective_redis_url
    return await replicas_not_running(url, settings.keys, cfg, {}, SINCE_MS, 0.3, lambda: False)


async def test_a_verdict_of_this_farm_ends_the_wait(settings: Settings) -> None:
    assert await wait(settings, config(), DeploymentHealth.HEALTHY, SINCE_MS) == {}
    assert await wait(settings, config(), DeploymentHealth.UNHEALTHY, SINCE_MS + 1) == {"m": "boom"}


async def test_an_earlier_farms_verdict_is_waited_past(settings: Settings) -> None:
    for health in (DeploymentHealth.HEALTHY, DeploymentHealth.UNHEALTHY, None):
        assert await wait(settings, config(), health, SINCE_MS - 1) == {"m": "still starting after 0.3s"}


async def test_externally_scaled_deployments_are_not_waited_for(settings: Settings) -> None:
    assert await wait(settings, config(external_scaler_enabled=True), None, 0) == {}
