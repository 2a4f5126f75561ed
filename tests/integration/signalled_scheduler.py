"""A scheduler process for test_scheduler_signals.py: ``python -m tests.integration.signalled_scheduler MODE``.

The real scheduler (``scheduler.main.serve``: its signal handling, its loop) with a launcher that starts nothing
(tests.harness.fake_launcher), so a farm of any legal size is only records in Redis. MODE:

- ``farm``: as it is; a large farm makes a long tick.
- ``stuck``: its tick never gives the event loop back (synchronous work, as over a huge state), so nothing the loop
  would run can answer a signal.
- ``slow-stop``: its graceful stop never ends (a drain that hangs), so only a second signal can end it.

It prints ``tick`` (flushed) when a tick begins.
"""

from __future__ import annotations

import asyncio
import sys
import time

from streamserve.runtime.logging_setup import start_process
from streamserve.scheduler.main import build_parser, serve
from streamserve.scheduler.scheduler import Scheduler
from streamserve.transport.connections import async_redis
from tests.harness.fake_launcher import FakeLauncher


class SignalledScheduler(Scheduler):
    mode = "farm"

    async def tick(self) -> None:
        print("tick", flush=True)
        if self.mode == "stuck":
            time.sleep(3600)  # the loop is not given back
        await super().tick()

    async def _shutdown(self) -> None:
        if self.mode == "slow-stop":
            await asyncio.sleep(3600)
        await super()._shutdown()


def main(mode: str) -> None:
    _args, settings = start_process(build_parser(), [])
    SignalledScheduler.mode = mode

    async def run() -> None:
        redis = async_redis(settings.effective_redis_url)
        await serve(SignalledScheduler(settings, redis, FakeLauncher()), redis)

    asyncio.run(run())


if __name__ == "__main__":
    main(sys.argv[1])
