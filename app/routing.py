"""Matching a request path to a deployment by route prefix (longest prefix wins)."""

from __future__ import annotations

from collections.abc import Mapping

from streamserve.config import DeploymentConfig


class RouteTable:
    """Route prefix -> deployment name, built from the long-polled deployments."""

    def __init__(self, routes: Mapping[str, str]) -> None:
        self.routes = dict(routes)
        self._by_length = sorted(self.routes, key=len, reverse=True)

    @classmethod
    def from_deployments(cls, deployments: Mapping[str, DeploymentConfig]) -> RouteTable:
        return cls({d.route_prefix: name for name, d in deployments.items() if d.route_prefix is not None})

    def match(self, path: str) -> str | None:
        """``/echo`` and ``/echo/anything`` match prefix ``/echo``; ``/echoes`` does not."""
        for prefix in self._by_length:
            if path == prefix or prefix == "/" or path.startswith(prefix + "/"):
                return self.routes[prefix]
        return None
