"""Where a caller's requests go: its long-polled copy of the deployments, endpoints and their health."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from streamserve.client.traffic import TrafficPolicy
from streamserve.control.desired_state import DesiredState
from streamserve.control.long_poll import EVERYTHING, LongPollSubscriber
from streamserve.control.status import StatusReader
from streamserve.transport.connections import RedisRefusals
from streamserve.wire.config import DeploymentConfig, EndpointConfig, named
from streamserve.wire.errors import NotFoundError, UnavailableError
from streamserve.wire.keys import ConfigKey, Keys
from streamserve.wire.messages import DeploymentHealthRecord
from streamserve.wire.states import DeploymentHealth

WATCHED = frozenset({ConfigKey.DEPLOYMENTS, ConfigKey.ENDPOINTS, ConfigKey.DEPLOYMENT_STATUS})


@dataclass(frozen=True)
class Route:
    """Where one request goes: the deployment that answers it, and the shadows that get a copy."""

    deployment: DeploymentConfig
    shadows: tuple[DeploymentConfig, ...] = ()


class RouteCache:
    """The caller's view of the desired state, kept current by long poll, and the routing decision made on it."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, refusals: RedisRefusals) -> None:
        """``refusals``: what a look-up's Redis failure means to the caller (a StreamServeError)."""
        self._refusals = refusals
        self._desired = DesiredState(redis, keys)
        self._status = StatusReader(redis, keys)
        self._deployments: dict[str, DeploymentConfig] = {}
        self._endpoints: dict[str, TrafficPolicy] = {}
        self._health: dict[str, DeploymentHealthRecord] = {}
        self._lookups: dict[str, asyncio.Future[TrafficPolicy | None]] = {}
        self._longpoll = LongPollSubscriber(redis, keys, WATCHED.__contains__, self._reload)
        self.generation = 0  # bumped on every reload of deployments or endpoints (cheap change detection)

    async def start(self) -> None:
        """Load everything and follow changes from now on."""
        await self._longpoll.start()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` if the long poll stops without ``close()`` (its event loop ended)."""
        self._longpoll.on_stop(callback)

    async def close(self) -> None:
        await self._longpoll.close()

    async def catch_up(self) -> None:
        """Reload what changed since the last look now, without waiting to hear of it (after a write of the
        caller's own)."""
        await self._longpoll.sync()

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a deployment or endpoint it has seen (``route`` answers it without a look-up)."""
        return name in self._deployments or name in self._endpoints

    def has_deployment(self, name: str) -> bool:
        return name in self._deployments

    def deployment(self, name: str) -> DeploymentConfig:
        """The deployment's config as last seen."""
        try:
            return self._deployments[name]
        except KeyError:
            raise NotFoundError(f"no deployment named {name!r}") from None

    def deployments(self) -> dict[str, DeploymentConfig]:
        return dict(self._deployments)

    def endpoints(self) -> dict[str, EndpointConfig]:
        return {name: policy.endpoint for name, policy in self._endpoints.items()}

    async def route(self, name: str, sticky: str = "") -> Route:
        """Where a request to ``name`` goes now: the deployment itself, or an endpoint's pick by weight (the same
        for the same ``sticky`` key: TrafficPolicy.pick).

        Raises NotFoundError for an unknown name and UnavailableError when the
        deployment has no replica and cannot get one.
        """
        policy = self._endpoints.get(name)
        if policy is None and name not in self._deployments:
            policy = await self._fetch(named(name))  # (only a name not known yet is looked at: no cost on the hot path)
        if policy is None:
            return Route(self._serviceable(name))
        shadows = tuple(self._deployments[s] for s in policy.shadows() if s in self._deployments)
        return Route(self._serviceable(policy.pick(sticky)), shadows)

    def _serviceable(self, name: str) -> DeploymentConfig:
        cfg = self.deployment(name)
        broken = self._unanswerable(cfg)
        if broken:
            raise UnavailableError(broken)
        return cfg

    def broken(self, name: str) -> str:
        """Why deployment ``name`` cannot answer now (scaled to 0, or its replicas fail to start and none runs), or
        "" (also for one not known)."""
        cfg = self._deployments.get(name)
        return "" if cfg is None else self._unanswerable(cfg)

    def _unanswerable(self, cfg: DeploymentConfig) -> str:
        name = cfg.name
        # An externally scaled deployment is never refused here: whoever scales it watches the queue, and starts
        # a worker when requests wait (max_queued_requests still bounds them).
        if cfg.external_scaler_enabled:
            return ""
        # An autoscaled deployment at 0 replicas is not refused: the request queues, and the scheduler starts a
        # replica as soon as it sees it (the group reads from id 0, so that replica finds it).
        if cfg.autoscaling_config is None and cfg.wanted_replicas() == 0:
            return f"deployment {name!r} is scaled to 0 replicas"
        health = self._health.get(name)
        if health is not None and health.health is DeploymentHealth.UNHEALTHY and health.running == 0:
            return f"deployment {name!r} has no running replica: {health.message}"
        return ""

    async def _fetch(self, name: str) -> TrafficPolicy | None:
        """A cache miss may just be news the long poll has not brought yet: ask Redis before saying no.

        Caches what it finds; returns the endpoint's policy, or None for a deployment.
        Concurrent misses on one name share a single look-up.
        """
        lookup = self._lookups.get(name)
        if lookup is None:
            lookup = self._lookups[name] = asyncio.ensure_future(self._look_up(name))
            lookup.add_done_callback(lambda _: self._lookups.pop(name, None))
        with self._refusals:  # (Redis away: RedisUnavailableError, as from the enqueue, not redis-py's own)
            return await asyncio.shield(lookup)

    async def _look_up(self, name: str) -> TrafficPolicy | None:
        deployment, endpoint = await self._desired.find(name)
        if deployment is not None:
            self._deployments = {**self._deployments, name: deployment}
            self.generation += 1
            return None
        if endpoint is None:
            raise NotFoundError(f"no deployment or endpoint named {name!r}")
        policy = TrafficPolicy(endpoint)
        missing = sorted(policy.endpoint.deployments - set(self._deployments))
        if missing:
            self._deployments = {**self._deployments, **await self._desired.get_many(missing)}
        self._endpoints = {**self._endpoints, name: policy}
        self.generation += 1
        return policy

    async def _reload(self, changed: set[str]) -> None:
        everything = EVERYTHING in changed
        if everything or ConfigKey.DEPLOYMENTS in changed:
            self._deployments = await self._desired.deployments()
            self.generation += 1
        if everything or ConfigKey.ENDPOINTS in changed:
            endpoints = await self._desired.endpoints()
            self._endpoints = {name: TrafficPolicy(e) for name, e in endpoints.items()}
            self.generation += 1
        if everything or ConfigKey.DEPLOYMENT_STATUS in changed:
            self._health = await self._status.health_of_all()
