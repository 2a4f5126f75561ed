"""Writes to the desired state that are made from what is stored (scale, delete, traffic) are made from what their
own transaction read: one made from an earlier reading wrote back a config that a concurrent deploy had replaced
(the deploy undone), or made a concurrently deleted deployment anew. Each test lands the other write just before the
transaction watches, the moment that the earlier reading missed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from streamserve.control.desired_state import DesiredState
from streamserve.runtime.settings import Settings
from streamserve.wire.config import AppConfig, DeploymentConfig, EndpointConfig
from streamserve.wire.errors import NotFoundError

NAME = "raced"


def config(version: str, **fields: Any) -> AppConfig:
    cfg = DeploymentConfig.model_validate(
        {"name": NAME, "import_path": "tests.deployments:Recorder", "version": version, **fields}
    )
    return AppConfig(deployments=[cfg])


def land_first(monkeypatch: pytest.MonkeyPatch, other_write: Callable[[], Awaitable[Any]]) -> None:
    """Run ``other_write`` once, just before the next transaction's WATCH."""
    watch = Pipeline.watch
    landed: list[bool] = []

    async def watch_after_the_other_write(self: Pipeline, *names: Any) -> Any:
        if not landed:
            landed.append(True)
            await other_write()
        return await watch(self, *names)

    monkeypatch.setattr(Pipeline, "watch", watch_after_the_other_write)


async def test_a_scale_keeps_a_deploy_that_lands_as_it_writes(
    aredis: aioredis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = DesiredState(aredis, settings.keys)
    await state.apply(config("v1"))
    land_first(monkeypatch, lambda: state.apply(config("v2", user_config={"new": True})))
    await state.scale(NAME, 3)
    stored = await state.get(NAME)
    assert (stored.version, stored.user_config, stored.num_replicas) == ("v2", {"new": True}, 3)


async def test_a_scale_does_not_make_a_deployment_deleted_as_it_writes_anew(
    aredis: aioredis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = DesiredState(aredis, settings.keys)
    await state.apply(config("v1"))
    land_first(monkeypatch, lambda: state.delete(NAME))
    with pytest.raises(NotFoundError, match="no deployment named 'raced'"):
        await state.scale(NAME, 2)
    assert NAME not in await state.deployments()


async def test_traffic_keeps_the_shadows_a_deploy_sets_as_it_writes(
    aredis: aioredis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = DesiredState(aredis, settings.keys)
    await state.apply(config("v1"))

    def endpoint(shadow: float) -> AppConfig:
        return AppConfig(
            endpoints=[EndpointConfig(name="ep", traffic={NAME: 1.0}, shadow={NAME: shadow}, route_prefix=None)]
        )

    await state.apply(endpoint(0.2))
    land_first(monkeypatch, lambda: state.apply(endpoint(0.25)))
    stored = await state.set_traffic("ep", {NAME: 1.0})
    assert stored.shadow == {NAME: 0.25}
    assert (await state.endpoints())["ep"].shadow == {NAME: 0.25}


async def test_a_scale_to_the_count_a_deployment_runs_changes_nothing(
    aredis: aioredis.Redis, settings: Settings
) -> None:
    """A config with no num_replicas runs 1: `scale NAME 1` made a goal, wrote num_replicas 1, and the next deploy of
    the same file said "updated" (found by an outside tester)."""
    state = DesiredState(aredis, settings.keys)
    await state.apply(config("v1"))
    assert await state.scale(NAME, 1) is None
    assert not await state.apply(config("v1"))  # the file again: no change
    assert await state.scale(NAME, 2) is not None
