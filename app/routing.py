"""Matching a request path to a deployment or endpoint by route prefix (longest prefix wins)."""

from __future__ import annotations

from collections.abc import Mapping

from streamserve.wire.config import DeploymentConfig, EndpointConfig


class RouteTable:
    """Route prefix -> deployment or endpoint name, built from the long-polled config."""

    def __init__(self, routes: Mapping[str, str]) -> None:
        self.routes = dict(routes)
        self._by_length = sorted(self.routes, key=len, reverse=True)

    @classmethod
    def build(cls, deployments: Mapping[str, DeploymentConfig], endpoints: Mapping[str, EndpointConfig]) -> RouteTable:
        """Writers refuse two owners of one prefix, so the two maps never collide."""
        routes = {d.route_prefix: name for name, d in deployments.items() if d.route_prefix is not None}
        routes.update({e.route_prefix: name for name, e in endpoints.items() if e.route_prefix is not None})
        return cls(routes)

    def match(self, path: str) -> str | None:
        """``/echo`` and ``/echo/anything`` match prefix ``/echo``; ``/echoes`` does not."""
        prefix = self.prefix(path)
        return None if prefix is None else self.routes[prefix]

    def prefix(self, path: str) -> str | None:
        """The route prefix that ``path`` matches, or None."""
        for prefix in self._by_length:
            if path == prefix or prefix == "/" or path.startswith(prefix + "/"):
                return prefix
        return None
