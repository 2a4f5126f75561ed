"""HTTP path: the streamserve gateway (-> Redis -> one noop replica) beside a bare FastAPI app and FastAPI + Celery.

Each target is started alone, probed (one request must answer 200 with exactly its input), then
measured at concurrency 32 (throughput) and 1 (latency), every phase after a warm-up on the same
keep-alive connections, repeated ``reps`` times; then stopped before the next target starts.

    .venv/bin/python -m bench.http_bench [--quick] [--out FILE]
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
import uvloop

from bench.children import Child, Children
from bench.farm import start_farm
from bench.loadgen import NOOP_BODY, http_measure, http_probe
from bench.options import Options
from bench.section import Section, md_table, verdict
from bench.servers import NOOP_CONCURRENCY, NOOP_CONFIG, celery_worker, py
from bench.standalone import standalone
from bench.stats import Summary, ratio
from bench.versions import installed
from streamserve.runtime.processes import free_port

PATH = "/noop"
BODY = orjson.dumps(NOOP_BODY)
CONCURRENCIES = (32, 1)
LABELS = {
    "streamserve": "streamserve gateway -> noop replica",
    "streamserve-2": "streamserve, 2 gateway workers",
    "bare": "bare FastAPI (ceiling)",
    "bare-2": "bare FastAPI, 2 workers",
    "celery": "FastAPI + Celery delay().get()",
}


def start_streamserve(children: Children, workers: int = 1) -> int:
    return start_farm(children, NOOP_CONFIG, up_args=["--gateway-workers", str(workers)]).port


def start_bare(children: Children, workers: int = 1) -> int:
    port = free_port()
    child = Child("bare-app", py("bench.bare_app", "--port", str(port), "--workers", str(workers)))
    children.start(child).wait_listening(port)
    return port


def start_celery(children: Children) -> int:
    url = celery_worker(children)
    port = free_port()
    app = children.start(
        Child("celery-http", py("bench.compare.celery_app", "http", "--redis-url", url, "--port", str(port)))
    )
    app.wait_listening(port)
    return port


STARTERS: dict[str, Callable[[Children], int]] = {
    "streamserve": start_streamserve,
    "streamserve-2": lambda children: start_streamserve(children, workers=2),
    "bare": start_bare,
    "bare-2": lambda children: start_bare(children, workers=2),
    "celery": start_celery,
}


async def measure_port(target: str, port: int, opts: Options) -> dict[int, Summary]:
    status, answer = await http_probe(port, PATH, BODY)
    if status != 200 or orjson.loads(answer) != NOOP_BODY:
        raise RuntimeError(f"{target}: 127.0.0.1:{port}{PATH} answered {status} {answer[:200]!r}")
    found = {}
    for concurrency in CONCURRENCIES:
        samples = []
        for rep in range(opts.reps):
            sample = await http_measure(
                port, PATH, BODY, concurrency, opts.warmup_s, opts.duration_s, opts.max_requests
            )
            print(
                f"  http {target:<11} c={concurrency:<3} rep {rep + 1}: {sample.rps:>8.0f} req/s "
                f"p50 {sample.p(0.5):.2f} ms errors {sample.errors} {sample.first_error}",
                flush=True,
            )
            samples.append(sample.to_json())
        found[concurrency] = Summary.of(samples)
    return found


def run(opts: Options) -> Section:
    section = Section("http", "HTTP path: noop deployment vs bare FastAPI vs FastAPI + Celery")
    results: dict[str, dict[int, Summary]] = {}
    skipped = []
    for target, start in STARTERS.items():
        if target == "celery" and not installed("celery"):
            skipped.append("celery (not installed: `.venv/bin/pip install -e '.[bench]'`)")
            continue
        with Children() as children:
            port = start(children)
            results[target] = uvloop.run(measure_port(target, port, opts))
    section.setup = [
        f"`POST {PATH}` with `{BODY.decode()}`; every target answers it unchanged. HTTP/1.1 keep-alive, one "
        "connection per concurrent client, closed loop; the client is one asyncio + uvloop process on this machine.",
        f"streamserve: `streamserve up`, embedded Redis, deployment `noop` = `examples.functions:noop`, 1 replica, "
        f"max_ongoing_requests {NOOP_CONCURRENCY}, 1 gateway process (2 with `--gateway-workers 2`).",
        "bare: `bench/bare_app.py`, the same work in the endpoint, on the gateway's uvicorn settings "
        "(uvloop, httptools, 1 process or 2 workers, no access log).",
        "The machine's cores are shared by the load generator, the gateway or app processes, the replica and "
        "Redis: on 2 cores a second worker has little idle CPU to use, so its gain here is a floor.",
        f"FastAPI + Celery: `bench/compare/celery_app.py http`, same uvicorn settings; the endpoint awaits "
        f"`noop.delay(body).get()` in Starlette's thread pool; 1 Celery worker, thread pool of {NOOP_CONCURRENCY}; "
        "Redis broker and result backend.",
        "Only the target measured is running.",
    ]
    rows = []
    for target, by_c in results.items():
        hi, one = by_c[32], by_c[1]
        rows.append(
            [
                LABELS[target],
                hi.rps.fmt(0),
                hi.p50_ms.fmt(2),
                hi.p99_ms.fmt(2),
                one.p50_ms.fmt(2),
                one.p99_ms.fmt(2),
                str(hi.errors + one.errors),
            ]
        )
    section.body = md_table(
        ["target", "req/s at c=32", "p50 ms c=32", "p99 ms c=32", "p50 ms c=1", "p99 ms c=1", "errors"], rows
    )
    if skipped:
        section.body += ["", "Skipped: " + "; ".join(skipped) + "."]
    ss, bare, celery = results.get("streamserve"), results.get("bare"), results.get("celery")
    if ss and bare:
        r = ratio(ss[32].rps.median, bare[32].rps.median)
        diff = ss[1].p50_ms.median - bare[1].p50_ms.median
        section.verdicts += [
            f"Throughput at c=32, streamserve / bare FastAPI: **{r:.2f}x** (target >= 0.7x: {verdict(r >= 0.7)}).",
            f"p50 at c=1, streamserve - bare FastAPI: **{diff:+.2f} ms** (target <= +0.5 ms: {verdict(diff <= 0.5)}).",
        ]
    for one, two in (("streamserve", "streamserve-2"), ("bare", "bare-2")):
        if one in results and two in results:
            r = ratio(results[two][32].rps.median, results[one][32].rps.median)
            section.verdicts.append(f"Throughput at c=32, {LABELS[two]} / 1: **{r:.2f}x** (on this machine's cores).")
    if ss and celery:
        r = ratio(ss[32].rps.median, celery[32].rps.median)
        section.verdicts.append(
            f"Throughput at c=32, streamserve / FastAPI + Celery: **{r:.1f}x** (target >= 10x: {verdict(r >= 10)})."
        )
    return section


def main(argv: list[str] | None = None) -> int:
    return standalone(run, "HTTP noop: streamserve vs bare FastAPI vs FastAPI + Celery", argv)


if __name__ == "__main__":
    raise SystemExit(main())
