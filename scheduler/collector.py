"""The scheduler process's garbage collection: automatic collection off, one full pass every COLLECT_EVERY_S.

At 100,000 replicas a tick makes some 100,000 objects that live for one tick (the parsed heartbeats) beside as
many that live for hours (a wrapper and a record per replica). CPython's generational collector then ran full
passes over all of them several times a tick: half of the tick (bench/scale_sim.py: p50 1.6 s -> 0.8 s). The
scheduler's own data holds no reference cycles; what cycles asyncio makes (exceptions and their tracebacks) are
freed by the periodic pass, some 0.1 s at that size.
"""

from __future__ import annotations

import asyncio
import gc

COLLECT_EVERY_S = 60.0


async def collect_periodically(every_s: float = COLLECT_EVERY_S) -> None:
    """Run for the life of the process (as a task): switch automatic collection off, then collect now and then."""
    gc.disable()
    try:
        while True:
            await asyncio.sleep(every_s)
            gc.collect()
    finally:
        gc.enable()
