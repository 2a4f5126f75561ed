"""Control-plane writes from a client: deploy, scale, delete, set traffic, and wait for the goals they return.
Redis failures come as StreamServeErrors (RedisUnavailableError, OverloadedError), as a call's do.

Every desired-state write goes through ``DesiredState`` (the owner of those
hashes) and, for deployments, returns a goal id that ``wait_for_goal`` blocks on.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from streamserve.client.core import ClientCore
from streamserve.control.desired_state import DesiredState
from streamserve.control.goal_records import GoalStore
from streamserve.transport.connections import RETRYABLE_ERRORS
from streamserve.wire.config import MAX_TIMEOUT_S, AppConfig, EndpointConfig, load_config, named
from streamserve.wire.errors import BadRequestError, shown
from streamserve.wire.messages import GoalRecord


class ControlWrites(ClientCore):
    """Desired-state writes, which the scheduler reconciles toward, and the wait for them to be done."""

    async def deploy(self, config: AppConfig | str | Path) -> dict[str, str]:
        """Apply a config (object or YAML path); return {deployment: goal id} for what changed.

        Endpoints in the config are written too; they need no goal (callers see them at once).
        """
        if not isinstance(config, AppConfig | str | Path):
            raise BadRequestError(
                f"deploy takes an AppConfig or a YAML file's path, got {shown(config)} (a dict makes one with "
                "AppConfig.model_validate)"
            )
        app = config if isinstance(config, AppConfig) else load_config(config, self._settings.config_limit_values)
        await self.start()
        with self._refusals:
            return (await self.desired_state().apply(app)).goals

    async def set_traffic(
        self, endpoint: str, traffic: dict[str, float], shadow: dict[str, float] | None = None
    ) -> EndpointConfig:
        """Create or change an endpoint's traffic weights (and shadows, unless None); every caller follows."""
        if not isinstance(endpoint, str):
            raise BadRequestError(f"an endpoint's name is a string, got {shown(endpoint)}")
        await self.start()
        with self._refusals:
            return await self.desired_state().set_traffic(endpoint, traffic, shadow)

    async def scale(self, name: str, num_replicas: int) -> str | None:
        """Set a deployment's replica count; the goal id, or None if it already had that."""
        named(name, "deployment")
        if not isinstance(num_replicas, int) or isinstance(num_replicas, bool):
            raise BadRequestError(f"num_replicas is a whole number, got {shown(num_replicas)}")
        await self.start()
        with self._refusals:
            return await self.desired_state().scale(name, num_replicas)

    async def delete(self, name: str) -> str | None:
        """Delete a deployment (the goal id) or an endpoint (None: it is gone at once)."""
        named(name)
        await self.start()
        with self._refusals:
            return await self.desired_state().delete_named(name)

    async def wait_for_goal(self, goal_id: str | None, timeout: float | None = None) -> GoalRecord | None:
        """Block until the goal is done; GoalFailedError says why it failed, RequestTimeoutError if it took too long.
        None (what ``scale`` returns when it changed nothing) is done already: None at once."""
        if goal_id is None:
            return None
        if not isinstance(goal_id, str):
            raise BadRequestError(f"a goal id is a string (as deploy, scale and delete return), got {shown(goal_id)}")
        number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        if timeout is not None and not (number and 0 <= timeout <= MAX_TIMEOUT_S):  # (false for NaN too)
            raise BadRequestError(f"timeout is a number of seconds, 0 or more, or None, got {shown(timeout)}")
        await self.start()
        with self._refusals:
            return await GoalStore(self.redis, self._keys).wait(goal_id, timeout)

    def desired_state(self) -> DesiredState:
        """What every desired-state write of this client goes through (the gateway's admin API's too, on its client):
        after each, this client's own calls go by what it wrote."""
        settings = self._settings
        return DesiredState(
            self.redis,
            self._keys,
            settings.import_allow_list,
            settings.config_limit_values,
            written=self._see_own_write,
        )

    async def _see_own_write(self) -> None:
        """The next call after a deploy that changed a user_config used the old config (and its cache entries) until
        the long poll heard of the change, a few ms later. The write is done: a Redis that fails this look leaves it
        to the long poll."""
        if self._routes is not None:
            with contextlib.suppress(*RETRYABLE_ERRORS):
                await self._routes.catch_up()
