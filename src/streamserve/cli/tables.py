"""The text tables ``status`` and ``traffic`` print.

Every cell and every line is escaped (wire.printable): names, routes and messages come from configs, replicas and
Redis, and must not reach the terminal as control sequences.
"""

from __future__ import annotations

from streamserve.control.status import DeploymentStatus
from streamserve.wire.config import EndpointConfig
from streamserve.wire.printable import printable


def _table(rows: list[list[str]]) -> list[str]:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _weights(weights: dict[str, float]) -> str:
    return " ".join(f"{name}={weight:g}" for name, weight in sorted(weights.items())) or "-"


def format_endpoints(endpoints: list[EndpointConfig]) -> str:
    rows = [["ENDPOINT", "ROUTE", "TRAFFIC", "SHADOW"]]
    rows += [[e.name, e.route_prefix or "-", _weights(e.traffic), _weights(e.shadow)] for e in endpoints]
    return "\n".join(_table(rows))


def _queued_cell(s: DeploymentStatus) -> str:
    """The queued count, and how it splits by priority when any is not ``normal``: ``12 (high 2, low 10)``."""
    others = [f"{level} {n}" for level, n in s.queued_by_priority.items() if n and level != "normal"]
    return f"{s.queued} ({', '.join(others)})" if others else str(s.queued)


def format_status(statuses: list[DeploymentStatus]) -> str:
    if not statuses:
        return "no deployments"
    header = ["DEPLOYMENT", "HEALTH", "TARGET", "RUNNING", "STARTING", "STOPPING", "QUEUED", "IN FLIGHT", "ROUTE"]
    rows = [header] + [
        [
            s.name,
            s.health,
            _target_cell(s),
            str(s.running),
            str(s.starting),
            str(s.stopping),
            _queued_cell(s),
            str(s.in_flight),
            s.route_prefix or "-",
        ]
        for s in statuses
    ]
    lines = _table(rows)
    replicas = [[r.replica_id, r.state, r.version, r.host or "-", str(r.pid or "-"), str(r.ongoing), r.message]
                for s in statuses for r in s.replicas]  # fmt: skip
    if replicas:
        replica_header = ["REPLICA", "STATE", "VERSION", "HOST", "PID", "ONGOING", "MESSAGE"]
        if not any(row[-1] for row in replicas):  # the column only when some replica says something
            replica_header, replicas = replica_header[:-1], [row[:-1] for row in replicas]
        lines += ["", *_table([replica_header, *replicas]), ""]
    held = [(r.replica_id, r.models) for s in statuses for r in s.replicas if r.models]
    lines += [printable(f"{replica}: models {', '.join(models)}") for replica, models in held]
    lines += [printable(f"{s.name}: {s.message}") for s in statuses if s.message]
    lines += [
        f"{s.name}: tenants over their limits in the last minute: {_some(s.limited_tenants)}"
        for s in statuses
        if s.limited_tenants
    ]
    lines += [
        printable(f"{s.name}: autoscaled to {s.target} ({s.autoscaling.reason})")
        for s in statuses
        if s.autoscaling and s.autoscaling.reason
    ]
    return "\n".join(lines)


def _target_cell(s: DeploymentStatus) -> str:
    """The target count; for an autoscaled deployment also its bounds, e.g. "3 (auto 0-4)"."""
    if s.external_scaler_enabled:
        return f"{s.target} (external)"
    if s.autoscaling is None:
        return str(s.target)
    return f"{s.target} (auto {s.autoscaling.min_replicas}-{s.autoscaling.max_replicas})"


# The most names of one kind the status table lists on a line (--json has them all).
NAMES_SHOWN = 10


def _some(names: list[str]) -> str:
    """``names`` as a list, the first NAMES_SHOWN of them and how many more."""
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown if len(names) <= NAMES_SHOWN else f"{shown} and {len(names) - NAMES_SHOWN} more (status --json)"
