"""``GET /metrics``: the whole farm in Prometheus's text format, read from Redis at each scrape.

Counters and histograms are the totals every gateway and replica added to
the metrics hashes (flusher); gauges are read from the request streams and
the scheduler's records at the time of the scrape, as ``status`` reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import redis.asyncio as aioredis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from streamserve.control.desired_state import DesiredState
from streamserve.control.status import DeploymentStatus, StatusReader
from streamserve.metrics.definitions import COUNTERS, GAUGES, HISTOGRAMS, PREFIX, TENANT_REQUESTS, Counter, Histogram
from streamserve.wire.keys import Keys
from streamserve.wire.messages import text
from streamserve.wire.states import DeploymentHealth, ReplicaState

# The text format every Prometheus reads (0.0.4; prometheus_client's "latest" is 1.0.0, which old servers predate).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Totals = Mapping[str, Mapping[str, str]]  # deployment -> metrics hash (field -> number as text)


async def farm_metrics(redis: aioredis.Redis, keys: Keys) -> bytes:
    """The text a scrape gets."""
    statuses = await StatusReader(redis, keys).status()
    names = [s.name for s in statuses]
    # An endpoint's requests are counted under its name until a deployment is picked (e.g. a malformed body).
    names += sorted(set(await DesiredState(redis, keys).endpoints()) - set(names))
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hgetall(keys.metrics(name))
        pipe.exists(keys.scheduler_lock())
        *hashes, leading = await pipe.execute()
    totals = {name: {text(k): text(v) for k, v in raw.items()} for name, raw in zip(names, hashes, strict=True)}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families(statuses, totals, bool(leading)))))
    return generate_latest(registry)


def families(statuses: list[DeploymentStatus], totals: Totals, leading: bool) -> Iterator[Metric]:
    """Every metric family, from the deployments' status and their metrics hashes."""
    for counter in COUNTERS:
        yield _counter(counter, totals)
    yield _tenant_counter(totals)
    for histogram in HISTOGRAMS:
        yield _histogram(histogram, totals)
    yield from _gauges(statuses, leading)


def _counter(counter: Counter, totals: Totals) -> Metric:
    labels = ["deployment", counter.label] if counter.label else ["deployment"]
    family = CounterMetricFamily(PREFIX + counter.name, counter.help, labels=labels)
    for deployment in sorted(totals):
        for name, value in sorted(totals[deployment].items()):
            label = counter.label_of(name)
            if label is not None:
                family.add_metric([deployment, label] if counter.label else [deployment], float(value))
    return family


def _tenant_counter(totals: Totals) -> Metric:
    family = CounterMetricFamily(
        PREFIX + TENANT_REQUESTS.name, TENANT_REQUESTS.help, labels=["deployment", "tenant", "code"]
    )
    for deployment in sorted(totals):
        for name, value in sorted(totals[deployment].items()):
            labels = TENANT_REQUESTS.labels_of(name)
            if labels is not None:
                family.add_metric([deployment, *labels], float(value))
    return family


def _histogram(histogram: Histogram, totals: Totals) -> Metric:
    family = HistogramMetricFamily(PREFIX + histogram.name, histogram.help, labels=["deployment"])
    for deployment in sorted(totals):
        fields = totals[deployment]
        counts = [int(fields.get(f, 0)) for f in histogram.bucket_fields]
        if not any(counts):
            continue
        cumulative, buckets = 0, []
        for le, count in zip(histogram.bucket_labels(), counts, strict=True):
            cumulative += count
            buckets.append((le, float(cumulative)))
        family.add_metric([deployment], buckets, float(fields.get(histogram.sum_field, 0)))
    return family


def _gauges(statuses: list[DeploymentStatus], leading: bool) -> Iterator[Metric]:
    def gauge(name: str, labels: Iterable[str] = ("deployment",)) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, GAUGES[name], labels=list(labels))

    queued, in_flight, target = gauge("queued_requests"), gauge("in_flight_requests"), gauge("target_replicas")
    dead, healthy = gauge("dead_letters"), gauge("deployment_healthy")
    replicas = gauge("replicas", ("deployment", "state"))
    for status in statuses:
        queued.add_metric([status.name], status.queued)
        in_flight.add_metric([status.name], status.in_flight)
        target.add_metric([status.name], status.target)
        dead.add_metric([status.name], status.dead_letters)
        healthy.add_metric([status.name], 1.0 if status.health == DeploymentHealth.HEALTHY.value else 0.0)
        for state in ReplicaState:
            replicas.add_metric([status.name, state.value], sum(1 for r in status.replicas if r.state == state.value))
    leader = GaugeMetricFamily(PREFIX + "scheduler_leading", GAUGES["scheduler_leading"])
    leader.add_metric([], 1.0 if leading else 0.0)
    yield from (queued, in_flight, replicas, target, dead, healthy, leader)


class _Families(Collector):
    """Hands prometheus_client the families already read (its collectors are synchronous; Redis here is not)."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics
