"""What a client can tell about the farm: the routes it follows (long-polled, read locally) and the status in Redis."""

from __future__ import annotations

from streamserve.client.core import ClientCore
from streamserve.control.status import DeploymentStatus, StatusReader
from streamserve.transport.connections import ping
from streamserve.wire.config import DeploymentConfig, EndpointConfig
from streamserve.wire.errors import NotFoundError


class StateReads(ClientCore):
    """Reads only: the client's own copy of deployments and endpoints, and the farm's status and health."""

    async def status(self) -> list[DeploymentStatus]:
        """Every deployment with its replicas and queue figures."""
        await self._connect()
        with self._refusals:
            return await StatusReader(self.redis, self._keys).status()

    async def ping(self) -> None:
        """Raise unless Redis answers."""
        await self._connect()
        with self._refusals:
            await ping(self.redis)

    @property
    def generation(self) -> int:
        """Bumped each time the deployments are reloaded (cheap change detection for caches)."""
        return 0 if self._routes is None else self._routes.generation

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a deployment or endpoint this client's routes know of (True before they are loaded)."""
        routes = self._routes
        return routes is None or routes.knows(name)

    @property
    def routes_loaded(self) -> bool:
        """Whether the deployments and endpoints have been loaded (the client has started)."""
        return self._routes is not None

    def deployment(self, name: str) -> DeploymentConfig:
        """The deployment's config as this client last saw it (long-polled)."""
        if self._routes is None:
            raise NotFoundError(f"no deployment named {name!r}")
        return self._routes.deployment(name)

    def deployments(self) -> dict[str, DeploymentConfig]:
        """Every deployment this client knows of, by name."""
        return {} if self._routes is None else self._routes.deployments()

    def endpoints(self) -> dict[str, EndpointConfig]:
        """Every endpoint this client knows of, by name."""
        return {} if self._routes is None else self._routes.endpoints()
