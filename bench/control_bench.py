"""Control plane: deploy to first answer, user_config change to every replica reconfigured, load step to new replica.

.venv/bin/python -m bench.control_bench [--quick] [--out FILE]
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.children import Children, start_redis
from bench.farm import start_farm, status_of
from bench.loadgen import NOOP_BODY
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.standalone import standalone
from bench.stats import Spread, percentile
from bench.versions import installed
from tests.harness.farm import Farm

CONF_REPLICAS = 4
REPORT_KEY = "bench:reconfigured"
CHANGES = 50
QUICK_CHANGES = 10
RECONFIGURE_TIMEOUT_S = 10.0
AUTOSCALE_TIMEOUT_S = 60.0
LOAD_STEP = 8


def conf_deployment(report_url: str, gen: int) -> dict[str, Any]:
    return {
        "name": "conf",
        "import_path": "bench.deployments:Reconfigurable",
        "init_kwargs": {"report_url": report_url, "report_key": REPORT_KEY},
        "num_replicas": CONF_REPLICAS,
        "max_ongoing_requests": 8,
        "user_config": {"gen": gen},
        "route_prefix": None,
    }


def cli(farm: Farm, *args: str, timeout: float = 200) -> float:
    """Run `streamserve ARGS` on the farm's Redis; the seconds it took."""
    t0 = time.perf_counter()
    farm.cli(*args, timeout_s=timeout)
    return time.perf_counter() - t0


def deploy_to_first_answer(farm: Farm, opts: Options, tmp: Path) -> dict[str, Spread]:
    """`streamserve deploy new.yaml --wait`, then one call: the time to each, from the deploy's start."""
    from streamserve import Client

    waits, answers, cli_start = [], [], []
    with Client(farm.effective_redis_url) as client:
        for rep in range(opts.reps):
            cli_start.append(cli(farm, "status"))
            name = f"fresh{rep}"
            config = tmp / f"{name}.yaml"
            config.write_text(
                f"deployments:\n  - name: {name}\n    import_path: examples.functions:noop\n"
                f"    num_replicas: 1\n    route_prefix: null\n"
            )
            t0 = time.perf_counter()
            waits.append(cli(farm, "deploy", str(config), "--wait", "--timeout", "180"))
            answer = client.call(name, NOOP_BODY, timeout=60)
            answers.append(time.perf_counter() - t0)
            if answer != NOOP_BODY:
                raise RuntimeError(f"{name} answered {answer!r}")
            print(f"  control deploy rep {rep + 1}: --wait {waits[-1]:.2f} s, first answer {answers[-1]:.2f} s")
            cli(farm, "delete", name, "--wait", "--timeout", "120")
    return {"wait": Spread.of(waits), "answer": Spread.of(answers), "cli": Spread.of(cli_start)}


def config_changes(farm: Farm, report_url: str, opts: Options) -> tuple[Spread, Spread, int]:
    """Change conf's user_config ``CHANGES`` times per repetition; per change, the time until every replica ran it."""
    from streamserve import Client
    from streamserve.wire.config import parse_config

    reports = redis.Redis.from_url(report_url)
    changes = QUICK_CHANGES if opts.quick else CHANGES
    p50s, p99s, lost = [], [], 0
    gen = 0
    with Client(farm.effective_redis_url) as client:
        for rep in range(opts.reps):
            latencies = []
            for _ in range(changes):
                gen += 1
                reports.delete(REPORT_KEY)
                app = parse_config({"deployments": [conf_deployment(report_url, gen)]})
                t0 = time.time()
                client.deploy(app)
                seen: dict[int, float] = {}
                deadline = time.monotonic() + RECONFIGURE_TIMEOUT_S
                while len(seen) < CONF_REPLICAS and time.monotonic() < deadline:
                    got: Any = reports.blpop([REPORT_KEY], timeout=1)
                    if got is None:
                        continue
                    report = orjson.loads(got[1])
                    if report["gen"] == gen:
                        seen[report["pid"]] = report["t"]
                if len(seen) < CONF_REPLICAS:
                    lost += 1
                    continue
                latencies.append(max(seen.values()) - t0)
            lat = sorted(latencies)
            p50s.append(1000 * percentile(lat, 0.5))
            p99s.append(1000 * percentile(lat, 0.99))
            print(f"  control user_config rep {rep + 1}: p50 {p50s[-1]:.1f} ms p99 {p99s[-1]:.1f} ms", flush=True)
    reports.close()
    return Spread.of(p50s), Spread.of(p99s), lost


def autoscale_step(farm: Farm, opts: Options, tmp: Path) -> Spread | str:
    """From 0 to LOAD_STEP calls outstanding on an autoscaled deployment: the time until a 2nd replica is RUNNING."""
    if not installed("streamserve.scheduler.autoscaler"):
        return (
            "skipped: the scheduler in this tree does not autoscale yet (no `scheduler.autoscaler`); "
            "this row fills in once autoscaling is merged"
        )
    from streamserve import AsyncClient

    times = []
    for rep in range(opts.reps):
        name = f"auto{rep}"
        config = tmp / f"{name}.yaml"
        config.write_text(
            f"deployments:\n  - name: {name}\n    import_path: examples.sleepy:Sleepy\n"
            f"    init_kwargs: {{seconds: 0.05}}\n    max_ongoing_requests: 1\n    route_prefix: null\n"
            "    autoscaling_config: {min_replicas: 1, max_replicas: 4, target_ongoing_requests: 1,"
            " upscale_delay_s: 0, downscale_delay_s: 600}\n"
        )
        cli(farm, "deploy", str(config), "--wait", "--timeout", "180")
        stop = threading.Event()

        async def load(deployment: str = name, stop: threading.Event = stop) -> None:
            async with AsyncClient(farm.effective_redis_url) as client:

                async def worker() -> None:
                    while not stop.is_set():
                        await client.call(deployment, {"seconds": 0.05}, timeout=60)

                tasks = [asyncio.create_task(worker()) for _ in range(LOAD_STEP)]
                while not stop.is_set():
                    await asyncio.sleep(0.05)
                await asyncio.gather(*tasks, return_exceptions=True)

        thread = threading.Thread(target=asyncio.run, args=(load(),), daemon=True)
        t0 = time.perf_counter()
        thread.start()
        elapsed = None
        try:
            while time.perf_counter() - t0 < AUTOSCALE_TIMEOUT_S:
                running = {d["name"]: d["running"] for d in status_of(farm.effective_redis_url)}
                if running.get(name, 0) >= 2:
                    elapsed = time.perf_counter() - t0
                    break
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join(70)
        cli(farm, "delete", name, "--wait", "--timeout", "120")
        if elapsed is None:
            return f"no second replica within {AUTOSCALE_TIMEOUT_S:.0f} s of the load step"
        print(f"  control autoscale rep {rep + 1}: 2nd replica RUNNING after {elapsed:.2f} s", flush=True)
        times.append(elapsed)
    return Spread.of(times)


def run(opts: Options) -> Section:
    section = Section("control", "Control plane")
    with Children() as children:
        tmp = children.temporary_directory()
        report_url = start_redis(children, "report-redis")
        base = orjson.dumps({"deployments": [conf_deployment(report_url, 0)]}).decode()
        farm = start_farm(children, base)
        deploy = deploy_to_first_answer(farm, opts, tmp)
        p50, p99, lost = config_changes(farm, report_url, opts)
        auto = autoscale_step(farm, opts, tmp)
    changes = QUICK_CHANGES if opts.quick else CHANGES
    section.setup = [
        "One `streamserve up` (embedded Redis, 1 gateway, 1 scheduler); times from this process's clock.",
        "Deploy: a new 1-replica noop deployment with `streamserve deploy FILE --wait` (a CLI process, so it "
        "includes that process's start-up, shown alone as `streamserve status`), then one `Client.call`.",
        f"user_config: deployment `conf` (`bench.deployments:Reconfigurable`, {CONF_REPLICAS} replicas); "
        f"{changes} changes per repetition written with `Client.deploy`; a change counts as done when all "
        f"{CONF_REPLICAS} replicas have run `reconfigure` with it (each reports its clock to a separate Redis).",
        f"Autoscaling: `examples.sleepy:Sleepy` (50 ms), max_ongoing_requests 1, autoscaling_config min 1 max 4, "
        f"target_ongoing_requests 1, upscale_delay_s 0; load steps from 0 to {LOAD_STEP} calls outstanding; "
        "time until `status` shows a second replica RUNNING (polled every 50 ms).",
    ]
    rows = [
        ["`streamserve status` (CLI start-up + one read)", f"{deploy['cli'].fmt(2)} s"],
        ["`deploy --wait` returns", f"{deploy['wait'].fmt(2)} s"],
        ["first request answered (from the deploy's start)", f"{deploy['answer'].fmt(2)} s"],
        [f"user_config change -> all {CONF_REPLICAS} replicas reconfigured, p50", f"{p50.fmt(1)} ms"],
        [f"user_config change -> all {CONF_REPLICAS} replicas reconfigured, p99", f"{p99.fmt(1)} ms"],
        [
            "load step -> autoscaler's new replica RUNNING",
            f"{auto.fmt(2)} s" if isinstance(auto, Spread) else auto,
        ],
    ]
    section.body = md_table(["what", "time"], rows)
    if lost:
        section.body += ["", f"{lost} change(s) not seen by every replica within {RECONFIGURE_TIMEOUT_S:g} s."]
    section.verdicts.append(
        f"user_config change to all replicas reconfigured, p99: **{p99.median:.1f} ms** "
        f"(target < 50 ms: {verdict(p99.median < 50 and not lost)})."
    )
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, "control plane: deploy, user_config, autoscaling", argv)


if __name__ == "__main__":
    raise SystemExit(main())
