"""Memory: RSS of the gateway, a noop replica and the scheduler at rest and through 100,000 requests;
Redis memory per queued request.

    .venv/bin/python -m bench.memory_bench [--quick] [--out FILE]
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import redis
import uvloop

from bench.children import Children
from bench.farm import start_farm
from bench.loadgen import NOOP_BODY, http_measure
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.standalone import standalone
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for_async

REQUESTS = 100_000
QUICK_REQUESTS = 5_000
CHECKPOINTS = 10
QUEUED = 10_000
QUICK_QUEUED = 1_000
CONCURRENCY = 32
GROWTH_BOUND_MIB = 4.0  # what "flat" allows: RSS growth from the first checkpoint (warm) to the last
PARK_BODY = {"seconds": 120, **NOOP_BODY}
CONFIG = f"""\
deployments:
  - name: noop
    import_path: examples.functions:noop
    num_replicas: 1
    max_ongoing_requests: 32
    route_prefix: /noop
  - name: parked
    import_path: examples.sleepy:Sleepy
    num_replicas: 1
    max_ongoing_requests: 1
    max_queued_requests: {QUEUED + 10}
    graceful_shutdown_timeout_s: 0
    request_timeout_s: 600
    route_prefix: null
"""
MIB = 1024 * 1024


def role_pids(farm: Farm) -> dict[str, int]:
    """gateway, scheduler, noop replica, redis-server -> pid."""
    processes, roles = farm.processes(), farm.role_pids()
    found = {"gateway": roles["gateway"][0], "scheduler": roles["scheduler"][0]}
    for pid in roles.get("worker", []):
        if processes.get(pid, [])[4:5] == ["noop"]:  # python -m streamserve worker noop --replica-id ...
            found["noop replica"] = pid
    found["redis-server"] = roles["redis-server"][0]
    return found


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def used_memory(client: redis.Redis) -> int:
    info: Any = client.info("memory")
    return int(info["used_memory"])


def data_memory(client: redis.Redis) -> int:
    """used_memory less the clients' buffers (which follow how many connections are open, not what is stored)."""
    info: Any = client.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


def rss_through_requests(farm: Farm, total: int, client: redis.Redis) -> tuple[list[int], dict[str, list[int]]]:
    """RSS of each role at rest, then after every tenth of ``total`` HTTP noop requests at c=32."""
    pids = role_pids(farm)
    body = orjson.dumps(NOOP_BODY)
    marks = [0]
    rss = {role: [rss_bytes(pid)] for role, pid in pids.items()}
    rss["redis used_memory"] = [used_memory(client)]
    done = 0
    for i in range(CHECKPOINTS):
        chunk = total // CHECKPOINTS
        sample = uvloop.run(http_measure(farm.port, "/noop", body, CONCURRENCY, 0.0, 600.0, chunk))
        if sample.errors:
            raise farm.fail(f"{sample.errors} errors during the memory run: {sample.first_error}")
        done += sample.ok
        time.sleep(0.5)  # let in-flight upkeep settle
        marks.append(done)
        for role, pid in pids.items():
            rss[role].append(rss_bytes(pid))
        rss["redis used_memory"].append(used_memory(client))
        print(f"  memory after {done} requests: " + ", ".join(f"{r} {v[-1] / MIB:.1f} MiB" for r, v in rss.items()))
        del i
    return marks, rss


def per_queued_request(farm: Farm, queued: int, client: redis.Redis) -> tuple[float, float, int]:
    """Redis bytes per request waiting in a deployment's stream (queued with AsyncClient.call).

    Two figures: the request stream's own size (MEMORY USAGE) per entry, and Redis' whole data memory
    (used_memory less client buffers) per request, which also counts anything else a call stores.
    """
    from streamserve import AsyncClient
    from streamserve.runtime.settings import Settings

    stream = Settings(redis_url=farm.effective_redis_url).keys.requests("parked")

    def stream_bytes() -> int:
        usage: Any = client.memory_usage(stream, samples=0)
        return int(usage or 0)

    async def fill() -> tuple[float, float]:
        async with AsyncClient(farm.effective_redis_url) as caller:
            first = caller.submit("parked", PARK_BODY, timeout=600)  # takes the replica's only slot
            await asyncio.sleep(1.0)
            before, stream_before = data_memory(client), stream_bytes()
            tasks = [caller.submit("parked", PARK_BODY, timeout=600) for _ in range(queued)]

            async def all_queued() -> bool:
                parked = [d for d in await caller.status() if d.name == "parked"]
                return bool(parked) and parked[0].queued >= queued

            await wait_for_async(all_queued, 120, f"{queued:,} calls were not all queued", interval_s=0.2)
            await asyncio.sleep(0.5)
            after, stream_after = data_memory(client), stream_bytes()
            for task in [first, *tasks]:
                task.cancel()
            await asyncio.gather(first, *tasks, return_exceptions=True)
            return (stream_after - stream_before) / queued, (after - before) / queued

    in_stream, overall = asyncio.run(fill())
    return in_stream, overall, len(orjson.dumps(PARK_BODY))


def run(opts: Options) -> Section:
    section = Section("memory", "Memory")
    total = QUICK_REQUESTS if opts.quick else REQUESTS
    queued = QUICK_QUEUED if opts.quick else QUEUED
    with Children() as children:
        farm = start_farm(children, CONFIG)
        client = redis.Redis.from_url(farm.effective_redis_url)
        time.sleep(2.0)  # at rest: started, nothing served yet
        marks, rss = rss_through_requests(farm, total, client)
        in_stream, per_request, body_bytes = per_queued_request(farm, queued, client)
        client.close()
    section.setup = [
        "One `streamserve up`: deployment `noop` (1 replica) and `parked` (`examples.sleepy:Sleepy`, 1 replica, "
        "max_ongoing_requests 1). RSS from /proc/PID/status (VmRSS); Redis from `INFO memory` used_memory.",
        f"Requests: `POST /noop` over HTTP at c={CONCURRENCY}, {total:,} in {CHECKPOINTS} chunks; "
        "memory read 0.5 s after each chunk.",
        f"Queued: {queued:,} `AsyncClient.call`s to `parked` whose one replica is busy; body {body_bytes} bytes.",
    ]
    idx = [0, 1, CHECKPOINTS // 2, CHECKPOINTS]
    header = ["process", *[("at rest" if i == 0 else f"after {marks[i]:,}") for i in idx], "growth since 1st chunk"]
    rows, flat = [], True
    for role, values in rss.items():
        growth = (values[-1] - values[1]) / MIB
        if role in ("gateway", "scheduler", "noop replica"):
            flat = flat and growth <= GROWTH_BOUND_MIB
        rows.append([role, *[f"{values[i] / MIB:.1f} MiB" for i in idx], f"{growth:+.1f} MiB"])
    section.body = md_table(header, rows)
    section.body += [
        "",
        f"Redis memory per queued request (JSON body of {body_bytes} bytes): **{in_stream:.0f} bytes** in the request "
        f"stream (MEMORY USAGE); **{per_request:.0f} bytes** of Redis data memory in all (used_memory less client "
        "buffers).",
    ]
    section.verdicts.append(
        f"Gateway, replica and scheduler RSS after {total:,} requests within {GROWTH_BOUND_MIB:g} MiB of the first "
        f"chunk: {verdict(flat)}."
    )
    section.data = {"marks": marks, "rss": rss, "per_queued_request": per_request, "in_stream": in_stream}
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, "memory: RSS through 100,000 requests, Redis bytes per queued request", argv)


if __name__ == "__main__":
    raise SystemExit(main())
