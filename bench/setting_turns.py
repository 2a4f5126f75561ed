"""The HTTP bench's streamserve target under several settings, taking turns within each repetition so that drift on
the machine hits each alike (the observability and tracing benches)."""

from __future__ import annotations

from collections.abc import Mapping

import uvloop

from bench.children import Children
from bench.farm import start_farm
from bench.http_bench import BODY, CONCURRENCIES, PATH
from bench.loadgen import http_measure
from bench.options import Options
from bench.section import md_table
from bench.servers import NOOP_CONFIG
from bench.stats import Summary

# The setup line of a section measured in turns.
IN_TURNS = (
    "The HTTP bench's streamserve target (`streamserve up`, embedded Redis, `noop`, 1 replica, 1 gateway), once per "
    "setting below; the settings take turns within each repetition."
)


def table_of(found: Mapping[str, Mapping[int, Summary]]) -> str:
    """The settings' figures: req/s and p50 at c=32, p50 and p99 at c=1."""
    rows = [
        [name, by_c[32].rps.fmt(0), by_c[32].p50_ms.fmt(3), by_c[1].p50_ms.fmt(3), by_c[1].p99_ms.fmt(3)]
        for name, by_c in found.items()
    ]
    return md_table(["setting", "req/s at c=32", "p50 ms c=32", "p50 ms c=1", "p99 ms c=1"], rows)


def measure_in_turns(opts: Options, settings: Mapping[str, Mapping[str, str]]) -> dict[str, dict[int, Summary]]:
    """Setting name -> concurrency -> summary: one `streamserve up` (embedded Redis, ``noop``, 1 replica) per setting
    and repetition, with the setting's environment, the HTTP bench's phases on it."""
    width = max(len(name) for name in settings)
    samples: dict[str, dict[int, list[dict[str, float]]]] = {name: {c: [] for c in CONCURRENCIES} for name in settings}
    for rep in range(opts.reps):
        for name, env in settings.items():
            with Children() as children:
                port = start_farm(children, NOOP_CONFIG, settings=env).port
                for concurrency in CONCURRENCIES:
                    sample = uvloop.run(
                        http_measure(port, PATH, BODY, concurrency, opts.warmup_s, opts.duration_s, opts.max_requests)
                    )
                    print(
                        f"  {name:<{width}} rep {rep + 1} c={concurrency:<3} {sample.rps:>8.0f} req/s "
                        f"p50 {sample.p(0.5):.3f} ms errors {sample.errors}",
                        flush=True,
                    )
                    samples[name][concurrency].append(sample.to_json())
    return {name: {c: Summary.of(s) for c, s in by_c.items()} for name, by_c in samples.items()}
