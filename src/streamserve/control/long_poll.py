"""Long poll over pub/sub with snapshot ids.

A writer stores a config value and bumps that key's snapshot id in one MULTI
(``bump_snapshot_id``), then publishes the key's name with its new id
(``announce``: PUBLISH may not sit in a Redis Cluster transaction, and after
EXEC the value is there to be read). A subscriber keeps the
ids it has seen; on start, on every (re)subscribe and every
``resync_interval_s`` it re-reads the ids and reports the keys whose id moved.
Pub/sub is at-most-once; the ids make a missed message harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from streamserve.transport.background_tasks import background_task
from streamserve.transport.backoff import Backoff
from streamserve.transport.connections import RETRYABLE_ERRORS, refresh_cluster_map
from streamserve.wire.keys import Keys
from streamserve.wire.messages import text

logger = logging.getLogger(__name__)

OnChange = Callable[[set[str]], Awaitable[None]]

# Included in the changed set on the first sync: the listener should load everything it watches.
EVERYTHING = "*"


def bump_snapshot_id(pipe: Pipeline, keys: Keys, config_key: str) -> None:
    """Queue the snapshot id's bump on the MULTI pipeline that writes the value; ``announce`` it after EXEC."""
    pipe.hincrby(keys.snapshot_ids(), config_key, 1)


async def announce(redis: aioredis.Redis, keys: Keys, snapshot_ids: dict[str, int]) -> None:
    """Tell the subscribers that these config keys' snapshot ids moved to these values (one PUBLISH each).

    The message carries the new id (``"deployments 17"``): a subscriber that sees it differ from the one it holds
    reports the change without reading the ids back, which halves what a push costs each subscriber.
    """
    for config_key, snapshot_id in snapshot_ids.items():
        await redis.publish(keys.config_channel(), f"{config_key}{_ID_SEPARATOR}{snapshot_id}")


# Between the config key and its new snapshot id in a message (config keys hold no spaces).
_ID_SEPARATOR = " "


class LongPollSubscriber:
    """Calls ``on_change(changed_keys)`` whenever a watched config key's snapshot id moves."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        watched: Callable[[str], bool],
        on_change: OnChange,
        resync_interval_s: float = 5.0,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._watched = watched
        self._on_change = on_change
        self._resync_interval_s = resync_interval_s
        self._seen: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> None:
        """Read the current state once (so callers start with config), then follow changes."""
        await self.sync(force=True)
        self._task = background_task(self._run(), "streamserve-longpoll")

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` if the task started by ``start`` is cancelled without ``close()``: with its event loop
        (asyncio.run cancels every task left at its end). It ends by no error: it retries them all."""
        assert self._task is not None
        self._task.add_done_callback(lambda task: callback() if task.cancelled() and not self._closing else None)

    async def close(self) -> None:
        # PubSub.get_message can swallow a cancellation, so the loop also checks a flag.
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=self._resync_interval_s * 1.2)
            self._task = None

    async def sync(self, force: bool = False) -> None:
        """Compare snapshot ids with those seen; report what moved (everything watched if force)."""
        raw = await self._redis.hgetall(self._keys.snapshot_ids())
        current = {text(k): int(v) for k, v in raw.items() if self._watched(text(k))}
        names: Iterable[str] = set(current) | set(self._seen)
        changed = {k for k in names if current.get(k) != self._seen.get(k)}
        if force or changed:
            await self._on_change(changed | ({EVERYTHING} if force else set()))
        self._seen = current

    async def _heard(self, data: str) -> None:
        """A change message: report it when its id is news; one without a readable id means "compare ids"."""
        config_key, _, raw_id = data.rpartition(_ID_SEPARATOR)
        if not config_key or not (raw_id.isascii() and raw_id.isdigit()):
            if self._watched(data):
                await self.sync()
            return
        if not self._watched(config_key) or self._seen.get(config_key) == int(raw_id):
            return
        await self._on_change({config_key})
        self._seen[config_key] = int(raw_id)  # after: a change whose handling failed is reported again

    async def _run(self) -> None:
        backoff = Backoff()
        while not self._closing:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self._keys.config_channel())
                while not self._closing:
                    # Jitter keeps many subscribers from resyncing in lockstep.
                    timeout = self._resync_interval_s * random.uniform(0.9, 1.1)
                    message = await pubsub.get_message(timeout=timeout)
                    if (task := asyncio.current_task()) is not None and task.cancelling():
                        # redis-py can turn a cancellation that lands in this read into "no message": an AsyncClient
                        # left open when asyncio.run() ends would keep its loop from ever closing.
                        raise asyncio.CancelledError
                    if message is None or message["type"] != "message":
                        await self.sync()  # a quiet period or a (re)subscribe confirmation: compare the ids
                    else:
                        await self._heard(text(message["data"]))
                    backoff.reset()
            except RETRYABLE_ERRORS as exc:
                delay = backoff.next()
                logger.warning("config subscription lost (%s); reconnecting in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                await refresh_cluster_map(self._redis)
            except Exception as exc:  # a config it cannot read (written by hand, or by another version), say
                delay = backoff.next()
                logger.error("config subscription failed (%r); trying again in %.1fs", exc, delay)
                await asyncio.sleep(delay)
            finally:
                with contextlib.suppress(*RETRYABLE_ERRORS):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
