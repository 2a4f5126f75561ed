"""The metrics streamserve exports: the one place for their names, help texts, labels and buckets.

Gateways and replicas count into per-deployment hashes in Redis
(``Keys.metrics``); the field names of those hashes are built here too:
``<metric>|<label>=<value>`` for a counter, ``<metric>|le=<bound>`` (one
bucket, not cumulative), ``<metric>|sum`` for a histogram.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from functools import cached_property

PREFIX = "streamserve_"

# Seconds: the gateway answers in well under a millisecond when a replica is idle; handlers may take minutes.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Counter:
    """A counter with one label (besides ``deployment``), or none when ``label`` is ""."""

    name: str
    help: str
    label: str
    _fields: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def field(self, value: str) -> str:
        """The hash field that counts ``label=value`` (built once per value: this runs per request)."""
        try:
            return self._fields[value]
        except KeyError:
            return self._fields.setdefault(value, f"{self.name}|{self.label}={value}" if self.label else self.name)

    def label_of(self, hash_field: str) -> str | None:
        """The label value a hash field counts ("" for a counter without one), or None when the field is not this
        counter's."""
        if not self.label:
            return "" if hash_field == self.name else None
        head = f"{self.name}|{self.label}="
        return hash_field[len(head) :] if hash_field.startswith(head) else None


@dataclass(frozen=True)
class Histogram:
    """A histogram (its only label is ``deployment``); ``bounds`` are the buckets' upper bounds, +Inf implied."""

    name: str
    help: str
    bounds: tuple[float, ...]

    @cached_property
    def bucket_fields(self) -> tuple[str, ...]:
        """One hash field per bucket, +Inf last."""
        return (*(f"{self.name}|le={_number(b)}" for b in self.bounds), f"{self.name}|le=+Inf")

    @cached_property
    def sum_field(self) -> str:
        return f"{self.name}|sum"

    def bucket_of(self, value: float) -> int:
        """The index of the bucket that counts ``value`` (the first bound >= value)."""
        return bisect_left(self.bounds, value)

    def bucket_labels(self) -> tuple[str, ...]:
        """Prometheus's ``le`` label of each bucket, +Inf last."""
        return (*(_number(b) for b in self.bounds), "+Inf")


def _number(bound: float) -> str:
    return repr(float(bound))


# -- counted by gateways ------------------------------------------------------------

REQUESTS = Counter("requests_total", "HTTP requests to deployment routes, by the status code answered.", "code")
REQUEST_DURATION = Histogram(
    "request_duration_seconds", "Seconds from a request's arrival at a gateway to its answer.", LATENCY_BUCKETS
)

# -- counted by replicas (so they count the Python client's calls too) -----------------

HANDLED = Counter(
    "handled_requests_total", "Requests replicas answered (HTTP and Python client), by outcome.", "outcome"
)
HANDLER_DURATION = Histogram(
    "handler_duration_seconds", "Seconds a replica spent on a request, from taking it to its result.", LATENCY_BUCKETS
)
BATCH_SIZE = Histogram("batch_size", "Requests per batch a batched handler was called with.", BATCH_SIZE_BUCKETS)
STREAM_CHUNKS = Counter("stream_chunks_total", "Chunks streaming handlers yielded that replicas sent.", "")
TIME_TO_FIRST_CHUNK = Histogram(
    "stream_time_to_first_chunk_seconds",
    "Seconds from a replica taking a streaming request to its first chunk handed to Redis.",
    LATENCY_BUCKETS,
)

CANCELLED = Counter(
    "cancelled_requests_total",
    "Requests cancelled before they ended (caller gone, job cancelled, deadline passed while running), by stage: "
    "queued (never started) or running (the handler was stopped or told to stop).",
    "stage",
)

# CANCELLED's stages.
QUEUED_STAGE = "queued"
RUNNING_STAGE = "running"

CACHE_REQUESTS = Counter(
    "cache_requests_total",
    "Requests to deployments with a response cache, by result: hit (answered from a kept reply), miss (run), "
    "coalesced (waited for an identical request's run).",
    "result",
)


MODEL_LOADS = Counter("model_loads_total", "Models that replicas of a multiplexing deployment loaded.", "")
MODEL_LOAD_DURATION = Histogram(
    "model_load_duration_seconds", "Seconds a multiplexing deployment's loader took to load a model.", LATENCY_BUCKETS
)
MODEL_REQUESTS = Counter(
    "model_requests_total",
    "Models a multiplexing deployment's requests asked their replica for, by result: hit (it had the model loaded) "
    "or load (it loaded it, or waited for its load).",
    "result",
)

# MODEL_REQUESTS' results.
MODEL_HIT = "hit"
MODEL_LOAD = "load"


@dataclass(frozen=True)
class TenantCounter:
    """A counter by tenant and status code (besides ``deployment``): ``<metric>|tenant=<t>|code=<c>``. Tenant names
    hold no ``|`` (wire/tenants.py); past TENANT_LABEL_CAP tenants per deployment the flusher counts the rest under
    OTHER_TENANTS."""

    name: str
    help: str
    _fields: dict[tuple[str, int], str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def prefix(self) -> str:
        return f"{self.name}|tenant="

    def field(self, tenant: str, code: int) -> str:
        try:
            return self._fields[(tenant, code)]
        except KeyError:
            return self._fields.setdefault((tenant, code), f"{self.prefix}{tenant}|code={code}")

    def labels_of(self, hash_field: str) -> tuple[str, str] | None:
        """(tenant, code) of a hash field of this counter, else None."""
        if not hash_field.startswith(self.prefix):
            return None
        tenant, _, code = hash_field[len(self.prefix) :].partition("|code=")
        return tenant, code


TENANT_REQUESTS = TenantCounter(
    "tenant_requests_total",
    "HTTP requests to deployment routes by tenant and the status code answered (429: over the tenant's limits); "
    'past 100 tenants per deployment the rest count as tenant="_other".',
)

COUNTERS = (REQUESTS, HANDLED, STREAM_CHUNKS, CANCELLED, CACHE_REQUESTS, MODEL_LOADS, MODEL_REQUESTS)
HISTOGRAMS = (REQUEST_DURATION, HANDLER_DURATION, BATCH_SIZE, TIME_TO_FIRST_CHUNK, MODEL_LOAD_DURATION)

# -- read from Redis at each scrape --------------------------------------------------

GAUGES = {
    "queued_requests": "Requests waiting in the deployment's stream, not yet taken by a replica.",
    "in_flight_requests": "Requests replicas have taken and not yet answered.",
    "replicas": "Replicas by lifecycle state, from the scheduler's records.",
    "target_replicas": "How many replicas the scheduler aims for (the autoscaled count when autoscaling is on).",
    "dead_letters": "Requests in the deployment's dead-letter stream.",
    "deployment_healthy": "1 when the scheduler's last verdict on the deployment is HEALTHY, else 0.",
    "scheduler_leading": "1 when a scheduler holds the leader lock, else 0.",
}
