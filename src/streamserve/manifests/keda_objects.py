"""KEDA's objects for autoscaled deployments: a ScaledObject each, on its request stream's length.

Also what KEDA and the HPA cannot hold exactly of an ``autoscaling_config`` (``notes``).
"""

from __future__ import annotations

import math
from typing import Any

from streamserve.manifests.farm_spec import REDIS_PASSWORD_KEY, SECRET_NAME, TRIGGER_AUTH_NAME, FarmSpec, Manifest
from streamserve.manifests.kubernetes_objects import metadata, worker_name
from streamserve.wire.config import AutoscalingConfig, DeploymentConfig
from streamserve.wire.priorities import PRIORITIES

# KEDA's own polls (the 0 <-> 1 decision and the metric's cache); the HPA polls on its own period (15 s default).
POLLING_INTERVAL_S = 5
# The HPA refuses a stabilization window above an hour.
HPA_MAX_WINDOW_S = 3600


def trigger_authentication(spec: FarmSpec) -> Manifest:
    """KEDA's scalers read the Redis password from the Secret (empty when the key is absent)."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": metadata(spec, TRIGGER_AUTH_NAME, "autoscaling"),
        "spec": {"secretTargetRef": [{"parameter": "password", "name": SECRET_NAME, "key": REDIS_PASSWORD_KEY}]},
    }


def stream_length_target(auto: AutoscalingConfig) -> int:
    """KEDA parses its thresholds as integers: target_ongoing_requests rounded up, at least 1."""
    return max(1, math.ceil(auto.target_ongoing_requests))


# The trigger on Keys.model_backlog: the entries of the model streams of a multiplexing deployment (wire/models.py),
# which come and go with the models its replicas hold, kept by the scheduler as one stream's length.
MODELS_TRIGGER = "models"


def redis_streams_triggers(spec: FarmSpec, d: DeploymentConfig, auto: AutoscalingConfig) -> list[dict[str, Any]]:
    """One redis_streams_trigger per request stream (priority level), named by its level for scaling_modifiers, and
    one on the model streams' count."""
    triggers = [
        {"name": priority.value, **redis_streams_trigger(spec, stream, auto)}
        for priority, stream in spec.keys.request_streams(d.name).items()
    ]
    triggers.append({"name": MODELS_TRIGGER, **redis_streams_trigger(spec, spec.keys.model_backlog(d.name), auto)})
    return triggers


def scaling_modifiers(auto: AutoscalingConfig) -> dict[str, str]:
    """KEDA's composite metric: the sum of every level's stream length (and the model streams') against the one
    target, so that KEDA (and the HPA it feeds one metric) scales on the whole backlog, as our own autoscaler does;
    active above 0."""
    formula = " + ".join([*(priority.value for priority in PRIORITIES), MODELS_TRIGGER])
    return {"formula": formula, "target": str(stream_length_target(auto)), "activationTarget": "0"}


def redis_streams_trigger(spec: FarmSpec, stream: str, auto: AutoscalingConfig) -> dict[str, Any]:
    """KEDA's ``redis-streams`` scaler in stream-length mode (XLEN of a request stream).

    No ``consumerGroup``: that alone selects stream-length mode (with one, it
    counts pending entries or, with ``lagCount``, lag). Replicas delete each
    entry as they acknowledge it, so the length is queued plus in flight,
    the figure our own autoscaler divides by target_ongoing_requests; pending
    entries would top out at what the replicas hold, and lag needs Redis 7
    and miscounts after deletes. The trigger is active while the length is
    above ``activationLagCount`` (default 0, in every mode), so a queued
    request wakes a deployment at 0 replicas.
    """
    meta = {
        "address": spec.redis.address,
        "stream": stream,
        "streamLength": str(stream_length_target(auto)),
        "databaseIndex": str(spec.redis.db),
    }
    if spec.redis.tls:
        meta["enableTLS"] = "true"
    if spec.redis.username:
        meta["username"] = spec.redis.username
    return {"type": "redis-streams", "metadata": meta, "authenticationRef": {"name": TRIGGER_AUTH_NAME}}


def scaled_object(spec: FarmSpec, d: DeploymentConfig, auto: AutoscalingConfig) -> Manifest:
    """The deployment's autoscaling_config, as KEDA and the HPA it makes understand it.

    ``cooldownPeriod`` is how long the queue stays empty before 1 -> 0
    (KEDA's own step); between 1 and N the HPA decides, and its stabilization
    windows play upscale_delay_s and downscale_delay_s (capped at an hour).
    """
    name = worker_name(d.name)

    def window(delay_s: float) -> dict[str, int]:
        return {"stabilizationWindowSeconds": min(math.ceil(delay_s), HPA_MAX_WINDOW_S)}

    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(spec, name, "autoscaling"),
        "spec": {
            "scaleTargetRef": {"name": name},
            "pollingInterval": POLLING_INTERVAL_S,
            "cooldownPeriod": math.ceil(auto.downscale_delay_s),
            "minReplicaCount": auto.min_replicas,
            "maxReplicaCount": auto.max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleUp": window(auto.upscale_delay_s), "scaleDown": window(auto.downscale_delay_s)}
                },
                "scalingModifiers": scaling_modifiers(auto),
            },
            "triggers": redis_streams_triggers(spec, d, auto),
        },
    }


def notes(spec: FarmSpec) -> list[str]:
    """Where KEDA or the HPA cannot do exactly what the config says (the CLI prints these to stderr)."""
    found = []
    for d in spec.config.deployments:
        auto = d.autoscaling_config
        if auto is None:
            continue
        if stream_length_target(auto) != auto.target_ongoing_requests:
            found.append(
                f"deployment {d.name!r}: KEDA takes a whole number, so target_ongoing_requests "
                f"{auto.target_ongoing_requests:g} becomes streamLength {stream_length_target(auto)}"
            )
        for field, delay in (("upscale_delay_s", auto.upscale_delay_s), ("downscale_delay_s", auto.downscale_delay_s)):
            if delay > HPA_MAX_WINDOW_S:
                found.append(
                    f"deployment {d.name!r}: {field} {delay:g} is above the HPA's limit; its stabilization "
                    f"window is {HPA_MAX_WINDOW_S} s"
                )
    return found
