"""Per deployment: the Deployment of ``streamserve worker NAME`` pods and its PodDisruptionBudget."""

from __future__ import annotations

import math
from typing import Any

import orjson

from streamserve.manifests.farm_spec import FarmSpec, Manifest
from streamserve.manifests.kubernetes_objects import (
    SHORT_COMMAND_REQUESTS,
    container,
    metadata,
    pod_template,
    requests,
    selector_labels,
    worker_name,
)
from streamserve.wire.config import DeploymentConfig, Resources

# A worker drains for up to graceful_shutdown_timeout_s after SIGTERM, then acknowledges and says goodbye:
# this much more before the kubelet's SIGKILL lets it finish instead of leaving its requests to be re-run.
EXIT_MARGIN_S = 10
# `streamserve worker NAME` exits 1 while its deployment is not in Redis, and Kubernetes restarts it with a growing
# back-off (up to 5 minutes). So the pod first waits, in an init container, for the deploy Job to write it: at most
# WAIT_TRIES looks WAIT_INTERVAL_S apart, then exit 1 and Kubernetes runs the wait again.
# $1: the deployment's name; $2: the line `streamserve status --json` prints for it (deployment_status_line).
WAIT_TRIES = 150
WAIT_INTERVAL_S = 2
WAIT_SCRIPT = f"""\
echo "waiting for deployment $1 in Redis (the deploy Job writes it)"
tries=1
until streamserve status --json | grep -qF "$2"; do
  if [ "$tries" -ge {WAIT_TRIES} ]; then
    echo "deployment $1 is not in Redis after {WAIT_TRIES} looks; exiting for Kubernetes to wait again" >&2
    exit 1
  fi
  tries=$((tries + 1))
  sleep {WAIT_INTERVAL_S}
done
"""


def deployment_status_line(name: str) -> str:
    """What ``streamserve status --json`` prints, on a line of its own, for each deployment it lists.

    An endpoint's entry has a ``"name"`` too, but deployments and endpoints
    share one name space, so a match is the deployment; the closing quote
    keeps ``echo`` from matching ``echo2``, and a quote inside a JSON string
    is escaped, so no other value can hold the line.
    """
    return f'"name": {orjson.dumps(name).decode()}'


def wait_for_deployment(spec: FarmSpec, d: DeploymentConfig) -> dict[str, Any]:
    """The init container that holds the worker back until the deployment is in Redis (the image needs sh, grep)."""
    script = ["sh", "-c", WAIT_SCRIPT, "wait-for-deployment", d.name, deployment_status_line(d.name)]
    return container(spec, "wait-for-deployment", script, resources=requests(SHORT_COMMAND_REQUESTS))


def cpu_quantity(cpus: float) -> str:
    """2.0 -> "2", 0.5 -> "500m" (at least 1m when any CPU is asked for)."""
    millis = max(1, round(cpus * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def resource_requirements(resources: Resources) -> dict[str, Any]:
    """Requests equal to limits for what the deployment's ``resources`` sets; GPUs as ``nvidia.com/gpu``."""
    amounts: dict[str, str] = {}
    if resources.cpus > 0:
        amounts["cpu"] = cpu_quantity(resources.cpus)
    if resources.memory is not None:
        amounts["memory"] = str(resources.memory)
    if resources.gpus > 0:
        amounts["nvidia.com/gpu"] = str(resources.gpus)
    return {"requests": amounts, "limits": dict(amounts)} if amounts else {}


def termination_grace_s(d: DeploymentConfig) -> int:
    """The drain (graceful_shutdown_timeout_s) and then the worker's exit must fit before the kubelet's SIGKILL."""
    return math.ceil(d.graceful_shutdown_timeout_s) + EXIT_MARGIN_S


def worker_deployment(spec: FarmSpec, d: DeploymentConfig) -> Manifest:
    """``streamserve worker NAME`` pods; each reads the deployment's config from Redis.

    Fixed deployments get ``replicas``. Autoscaled ones leave it out: KEDA
    (through an HPA) owns the count, and a ``replicas`` here would reset it on
    every ``kubectl apply``. A deployment the user already marked externally
    scaled leaves it out too, for ``kubectl scale`` to set.
    """
    name = worker_name(d.name)
    worker = container(spec, "worker", ["streamserve", "worker", d.name])
    requirements = resource_requirements(d.resources)
    if requirements:
        worker["resources"] = requirements
    pod = {
        "terminationGracePeriodSeconds": termination_grace_s(d),
        "initContainers": [wait_for_deployment(spec, d)],
        "containers": [worker],
    }
    fixed = d.autoscaling_config is None and not d.external_scaler_enabled
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, name, "worker"),
        "spec": {
            **({"replicas": d.wanted_replicas()} if fixed else {}),
            "selector": {"matchLabels": selector_labels(name)},
            "template": pod_template(name, "worker", pod),
        },
    }


def worker_disruption_budget(spec: FarmSpec, d: DeploymentConfig) -> Manifest:
    name = worker_name(d.name)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(spec, name, "worker"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(name)}},
    }
