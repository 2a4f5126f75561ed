"""The largest values a config may ask for, and the one setting that raises (or lowers) them.

A count or size in a config is a promise the farm then tries to keep: a scheduler asked for 2**64 replicas records
them one by one, and a replica asked for 2**64 requests at once makes a thread for each. So every one of them has a
maximum here, checked where a config is written (``streamserve deploy`` and ``up``, ``POST /-/deploy``,
``streamserve scale``, the client's ``deploy`` and ``scale``): a ConfigError (HTTP 400, exit 2) names the field, the
value, the maximum and the setting that raises it. Configs already stored are read back unchecked: a maximum
raised on one machine must not make another one's farm unreadable.

The setting is ``STREAMSERVE_CONFIG_LIMITS``: ``NAME=N`` pairs separated by commas, each replacing one default
below, e.g. ``STREAMSERVE_CONFIG_LIMITS=num_replicas=4096,max_ongoing_requests=50000``.

Durations are not here: every one of them is at most ``config.MAX_TIMEOUT_S`` (a week), a fixed bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationInfo

# Where a process reads its overrides (runtime/settings.py's ``config_limits`` field).
SETTING = "STREAMSERVE_CONFIG_LIMITS"


@dataclass(frozen=True)
class ConfigLimits:
    """The maxima, one per count or size a config holds; the defaults are generous for real farms."""

    num_replicas: int = 1024
    """The most replicas one deployment may ask for: ``num_replicas``, ``autoscaling_config``'s ``min_replicas``
    and ``max_replicas``, and ``streamserve scale``. Past what one host runs; the scheduler's bench keeps 100
    deployments of 1,000 each."""

    max_ongoing_requests: int = 10_000
    """The largest ``max_ongoing_requests`` (a replica may run that many sync handlers on as many threads), and
    the largest ``autoscaling_config.target_ongoing_requests``."""

    max_queued_requests: int = 1_000_000
    """The largest ``max_queued_requests``: requests waiting in Redis for a replica."""

    max_queued_jobs: int = 1_000_000
    """The largest ``max_queued_jobs``: asynchronous jobs queued or running."""

    max_delivery_attempts: int = 100
    """The largest ``max_delivery_attempts``: how often one request may be handed to a replica."""

    max_response_bytes: int = 512 * 1024 * 1024
    """The largest ``max_response_bytes``: 512 MiB, the longest string Redis takes (its proto-max-bulk-len)."""

    max_unread_chunks: int = 10_000
    """The largest ``max_unread_chunks``: how many chunks a streaming handler may get ahead of its caller (each
    stream may hold that many chunks in Redis and in its caller's memory)."""

    cache_entries: int = 10_000_000
    """The largest ``response_cache.max_entries``: replies one deployment keeps in Redis for identical requests."""

    cpus: int = 1024
    """The most CPU cores one replica may ask for (``resources.cpus``)."""

    gpus: int = 64
    """The most GPUs one replica may ask for (``resources.gpus``)."""

    memory: int = 2**50
    """The most memory one replica may ask for (``resources.memory``), in bytes: 1 PiB."""

    config_bytes: int = 1024 * 1024
    """The largest a deployment's config may be as JSON (its ``init_args``, ``init_kwargs``, ``user_config``,
    ``version``...): 1 MiB. Every replica of the deployment reads it, again on each change."""

    deployments: int = 1000
    """The most deployments a farm may hold (a config file, or a write that adds some); also the most deployments
    an endpoint's ``traffic`` or ``shadow`` may name."""

    endpoints: int = 1000
    """The most endpoints a farm may hold."""

    @classmethod
    def parse(cls, text: str | None) -> ConfigLimits:
        """The defaults with ``NAME=N,...`` (the setting's value) on top; ValueError names what is wrong."""
        if text is None or not text.strip():
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, int] = {}
        for item in text.split(","):
            name, sep, number = (part.strip() for part in item.partition("="))
            if not sep or name not in known:
                raise ValueError(
                    f"{item.strip()!r} is not NAME=N with NAME one of the limits: {', '.join(sorted(known))}"
                )
            try:
                value = int(number)  # 1_000_000 too
            except ValueError:
                raise ValueError(f"{name}={number!r}: the limit must be a whole number") from None
            if value < 1:
                raise ValueError(f"{name}={value}: the limit must be at least 1")
            if name in values:
                raise ValueError(f"{name} is given twice")
            values[name] = value
        return cls(**values)

    def problem(self, limit: str, value: float, shown: str | None = None) -> str | None:
        """Why ``value`` is above the maximum called ``limit``, None when it is not; ``shown``: the value as the
        message writes it, when not as it is."""
        maximum = getattr(self, limit)
        if value <= maximum:
            return None
        return f"{value if shown is None else shown} is above the maximum, {maximum} ({self.how_to_raise(limit)})"

    @staticmethod
    def how_to_raise(limit: str) -> str:
        """The hint every refusal ends with: the setting that raises the maximum called ``limit``."""
        return f"to allow more, set {SETTING}={limit}=N for the gateway or command that writes the config"


DEFAULT_LIMITS = ConfigLimits()

# A validation's context: {"limits": ConfigLimits} for a config being written (the default: DEFAULT_LIMITS), or
# {"limits": None} for one read back from Redis, which is checked only as it was when it was written (a maximum,
# or a rule, added or lowered since must not make a running farm's configs unreadable).
LIMITS = "limits"


def limits_context(limits: ConfigLimits | None) -> dict[str, ConfigLimits | None]:
    """The validation context that checks a config against ``limits`` (None: a stored config, read back)."""
    return {LIMITS: limits}


def write_limits(info: ValidationInfo) -> ConfigLimits | None:
    """The limits a validation checks against; None when it reads a stored config back."""
    context = info.context
    if isinstance(context, dict) and LIMITS in context:
        limits: ConfigLimits | None = context[LIMITS]
        return limits
    return DEFAULT_LIMITS


def at_most(limit: str) -> Any:
    """A field validator: a number (or None) at most the maximum called ``limit``."""

    def check(value: float | None, info: ValidationInfo) -> float | None:
        limits = write_limits(info)
        if value is not None and limits is not None and (problem := limits.problem(limit, value)):
            raise ValueError(problem)
        return value

    return check
