"""Kubernetes' own objects for the farm as a whole: Namespace, Redis, the config and its deploy Job, scheduler, gateway.

Also the parts every pod is made of (names, labels, env, containers).
"""

from __future__ import annotations

import hashlib
from decimal import Decimal
from typing import Any

import orjson

from streamserve.manifests.farm_spec import (
    API_KEY_KEY,
    CONFIG_MAP_NAME,
    K8S_NAME_RE,
    PART_OF,
    REDIS_NAME,
    REDIS_PASSWORD_KEY,
    REDIS_PORT,
    SECRET_NAME,
    FarmSpec,
    Manifest,
)
from streamserve.wire.config import MEMORY_RE, memory_bytes, parse_config
from streamserve.wire.limits import DEFAULT_LIMITS, ConfigLimits

CONFIG_DIR = "/etc/streamserve"
CONFIG_FILE = "config.yaml"
GATEWAY_PORT = 8000
# The image docker/compose.yaml runs, pinned to a patch release: a new Redis is an upgrade you choose, not what a
# rescheduled pod happens to pull.
REDIS_IMAGE = "redis:7.2.5-alpine"
# The same ping as readiness, but a restart only after a minute without an answer: an AOF rewrite's fork, or fsync
# on a slow volume, can stall Redis for seconds, and a restart then would throw the rewrite away and take the
# farm's Redis down while it reloads the AOF.
REDIS_LIVENESS = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6}
# Redis refuses writes past this share of its container's memory: its resident size runs above what it counts
# (allocator fragmentation, pages copied while a forked child rewrites the AOF), and the kernel must not kill it.
REDIS_MAXMEMORY_SHARE = (3, 4)
# The volume holds the AOF: a base file of at most the dataset, the log since then (rewritten once it is as big as
# the base, 64mb at least) and, during a rewrite, the new base beside the old files: 3x the memory leaves room.
REDIS_STORAGE_PER_MEMORY = 3
GATEWAY_NAME = "streamserve-gateway"
SCHEDULER_NAME = "streamserve-scheduler"
DEPLOY_JOB_TTL_S = 3600
DEPLOY_JOB_BACKOFF_LIMIT = 6
# What the farm's own processes ask for, so that they are not BestEffort (the first pods evicted when a node runs
# short). Requests only, no limits: a CPU limit throttles the process at its quota (a gateway or a scheduler's tick
# stalled for the rest of the period), and a memory limit turns a burst into an OOM kill. Workers get their
# deployment's `resources` instead (worker_objects.resource_requirements).
SCHEDULER_REQUESTS = {"cpu": "100m", "memory": "128Mi"}
GATEWAY_REQUESTS = {"cpu": "250m", "memory": "256Mi"}
# The deploy Job and the workers' init container: one short `streamserve` command at a time.
SHORT_COMMAND_REQUESTS = {"cpu": "50m", "memory": "64Mi"}
# Every pod: nothing in the farm talks to the Kubernetes API, and workers run user code, so no pod gets a
# service-account token; the runtime's default seccomp profile.
SECCOMP_PROFILE = "RuntimeDefault"


# -- names and labels -----------------------------------------------------------


def object_name(prefix: str, name: str) -> str:
    """``prefix-name`` as a Kubernetes name.

    A streamserve name may hold ``_`` or end in ``-``, which Kubernetes names
    and label values may not, and may be too long with the prefix: such a
    name is cut and made valid, and a digest of the original keeps two
    names from becoming one.
    """
    plain = f"{prefix}-{name}"
    if K8S_NAME_RE.match(plain):
        return plain
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{plain.replace('_', '-')[: 63 - 9].rstrip('-')}-{digest}"


def worker_name(deployment: str) -> str:
    return object_name("streamserve-worker", deployment)


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": PART_OF}


def labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
    }


def metadata(spec: FarmSpec, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": labels(name, component)}


# -- what every streamserve process gets ----------------------------------------


def secret_env(name: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": SECRET_NAME, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def process_env(spec: FarmSpec) -> list[dict[str, Any]]:
    """Redis URL, password and key prefix (Settings reads these); the password only by reference.

    With ``--redis-url`` the password is optional, so a Redis without one
    works with a Secret that has no ``redis-password``. The import allow-list
    and the config limits the config was checked against go along as given:
    the deploy Job checks it again, and must accept what ``manifests`` did.
    """
    env = [
        {"name": "STREAMSERVE_REDIS_URL", "value": spec.redis.url},
        secret_env("STREAMSERVE_REDIS_PASSWORD", REDIS_PASSWORD_KEY, optional=not spec.redis.in_cluster),
        {"name": "STREAMSERVE_KEY_PREFIX", "value": spec.keys.prefix},
    ]
    if spec.import_allow is not None:
        env.append({"name": "STREAMSERVE_IMPORT_ALLOW", "value": spec.import_allow})
    if spec.config_limits is not None:
        env.append({"name": "STREAMSERVE_CONFIG_LIMITS", "value": spec.config_limits})
    return env


def requests(amounts: dict[str, str]) -> dict[str, Any]:
    """``resources`` with these requests and no limits (a copy each: YAML would print a shared dict as an alias)."""
    return {"requests": dict(amounts)}


def container_security() -> dict[str, Any]:
    """A streamserve process needs no privilege: no capabilities, no setuid gain, and not root.

    The image runs as a non-root user (docker/Dockerfile: ``USER 10001``, numeric so that the kubelet can
    verify ``runAsNonRoot``); an image running as root, or as a user named but not numbered, is refused
    by the kubelet instead of run. (Redis's container gets none of this: its image starts as root and drops to
    its own user itself, which needs the capabilities.)
    """
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


def container(spec: FarmSpec, name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    """A container running ``command`` from the image, with the farm's env and no privilege."""
    return {
        "name": name,
        "image": spec.image,
        "command": command,
        "env": process_env(spec),
        **extra,
        "securityContext": container_security(),
    }


def pod_template(name: str, component: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A pod of ``pod_spec``, without a service-account token and under the runtime's seccomp profile."""
    spec = {
        **pod_spec,
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": SECCOMP_PROFILE}},
    }
    return {"metadata": {"labels": labels(name, component)}, "spec": spec}


def scaled_quantity(quantity: str, factor: int) -> str:
    """A memory quantity times ``factor``, in the quantity's own unit: ("512Mi", 3) -> "1536Mi"."""
    match = MEMORY_RE.match(quantity)
    if match is None:
        raise ValueError(f"{quantity!r} is not a memory size")
    return f"{Decimal(match['number']) * factor}{match['unit'] or ''}"


# -- objects --------------------------------------------------------------------


def namespace(spec: FarmSpec) -> Manifest:
    meta = {"name": spec.namespace, "labels": {"app.kubernetes.io/part-of": PART_OF}}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def service(spec: FarmSpec, name: str, component: str, port_name: str, port: int) -> Manifest:
    """A Service in front of the pods labelled ``name``, on their port called ``port_name``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, name, component),
        "spec": {
            "selector": selector_labels(name),
            "ports": [{"name": port_name, "port": port, "targetPort": port_name}],
        },
    }


def redis_service(spec: FarmSpec) -> Manifest:
    return service(spec, REDIS_NAME, "redis", "redis", REDIS_PORT)


def redis_ping() -> dict[str, Any]:
    """The probes' command: Redis answers PONG, or MISCONF (it refuses PING while it cannot write its files, a full
    disk: it runs, and a restart would not give it room) (a copy each: YAML would print a shared dict as an alias)."""
    return {"command": ["sh", "-c", "redis-cli ping | grep -qE 'PONG|MISCONF'"]}


def redis_statefulset(spec: FarmSpec) -> Manifest:
    """One Redis with its data on a PersistentVolumeClaim: AOF on, nothing evicted, a password from the Secret.

    Its container gets ``--redis-memory`` (request and limit), Redis a
    ``maxmemory`` below it, and the volume a size that follows it. Kubernetes
    expands ``$(REDIS_PASSWORD)`` in args from the container's env, so the
    password appears in neither the manifest nor the image.
    """
    memory = memory_bytes(spec.redis_memory)
    share, whole = REDIS_MAXMEMORY_SHARE
    # fmt: off
    args = [
        "redis-server",
        "--appendonly", "yes",
        "--dir", "/data",
        "--maxmemory", str(memory * share // whole),
        "--maxmemory-policy", "noeviction",
        "--requirepass", "$(REDIS_PASSWORD)",
    ]
    # fmt: on
    server = {
        "name": "redis",
        "image": REDIS_IMAGE,
        "args": args,
        # redis-cli reads its password from REDISCLI_AUTH (the probes).
        "env": [secret_env("REDIS_PASSWORD", REDIS_PASSWORD_KEY), secret_env("REDISCLI_AUTH", REDIS_PASSWORD_KEY)],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
        "resources": {"requests": {"memory": spec.redis_memory}, "limits": {"memory": spec.redis_memory}},
        "readinessProbe": {"exec": redis_ping(), "periodSeconds": 5, "timeoutSeconds": 3},
        "livenessProbe": {"exec": redis_ping(), **REDIS_LIVENESS},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    storage = scaled_quantity(spec.redis_memory, REDIS_STORAGE_PER_MEMORY)
    claim = {
        "metadata": {"name": "data", "labels": labels(REDIS_NAME, "redis")},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(spec, REDIS_NAME, "redis"),
        "spec": {
            "serviceName": REDIS_NAME,
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(REDIS_NAME)},
            "template": pod_template(REDIS_NAME, "redis", {"containers": [server]}),
            "volumeClaimTemplates": [claim],
        },
    }


def k8s_config(raw: dict[str, Any], limits: ConfigLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The config as the user wrote it, but every deployment externally scaled.

    ``num_replicas`` and ``autoscaling_config`` leave it: they became the
    Deployment's ``replicas`` and the ScaledObject.
    """
    deployments = []
    for d in raw.get("deployments") or []:
        rest = {k: v for k, v in d.items() if k not in ("num_replicas", "autoscaling_config")}
        deployments.append({**rest, "external_scaler_enabled": True})
    rewritten = {**raw, "deployments": deployments}
    parse_config(rewritten, "the rewritten config", limits)  # still valid (it is, unless this function is wrong)
    return rewritten


def config_map(spec: FarmSpec, text: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(spec, CONFIG_MAP_NAME, "config"),
        "data": {CONFIG_FILE: text},
    }


def deploy_job(spec: FarmSpec, config_text: str) -> Manifest:
    """``streamserve deploy`` of the ConfigMap's config, retried until Redis answers.

    A Job's pod template cannot change, so the name carries a digest of the
    config and of the template: a new config (or image) is a new Job, and
    the same one applied again changes nothing.
    """
    pod = {
        "restartPolicy": "Never",
        "containers": [
            container(
                spec,
                "deploy",
                ["streamserve", "deploy", f"{CONFIG_DIR}/{CONFIG_FILE}"],
                volumeMounts=[{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
                resources=requests(SHORT_COMMAND_REQUESTS),
            )
        ],
        "volumes": [{"name": "config", "configMap": {"name": CONFIG_MAP_NAME}}],
    }
    job_spec = {
        "backoffLimit": DEPLOY_JOB_BACKOFF_LIMIT,
        "ttlSecondsAfterFinished": DEPLOY_JOB_TTL_S,
        "template": pod_template("streamserve-deploy", "deploy", pod),
    }
    digest = hashlib.sha256(config_text.encode() + orjson.dumps(job_spec, option=orjson.OPT_SORT_KEYS)).hexdigest()
    name = f"streamserve-deploy-{digest[:10]}"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(spec, name, "deploy"), "spec": job_spec}


def scheduler_deployment(spec: FarmSpec) -> Manifest:
    """Two schedulers: one leads (a lock in Redis), the other stands by and takes over within seconds."""
    scheduler = container(spec, "scheduler", ["streamserve", "scheduler"], resources=requests(SCHEDULER_REQUESTS))
    pod = {"containers": [scheduler]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, SCHEDULER_NAME, "scheduler"),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": selector_labels(SCHEDULER_NAME)},
            "template": pod_template(SCHEDULER_NAME, "scheduler", pod),
        },
    }


def gateway_deployment(spec: FarmSpec) -> Manifest:
    """Two gateways on 0.0.0.0 (so the API key is required); ready only while Redis answers and routes are loaded."""
    gateway = container(spec, "gateway", ["streamserve", "gateway", "--host", "0.0.0.0", "--port", str(GATEWAY_PORT)])
    gateway["env"] = [*gateway["env"], secret_env("STREAMSERVE_API_KEY", API_KEY_KEY)]
    gateway["ports"] = [{"name": "http", "containerPort": GATEWAY_PORT}]
    gateway["resources"] = requests(GATEWAY_REQUESTS)
    gateway["readinessProbe"] = {"httpGet": {"path": "/-/ready", "port": "http"}, "periodSeconds": 5}
    # /-/healthz answers 503 while Redis is down: allow a minute of that before a restart.
    gateway["livenessProbe"] = {
        "httpGet": {"path": "/-/healthz", "port": "http"},
        "periodSeconds": 10,
        "timeoutSeconds": 3,
        "failureThreshold": 6,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, GATEWAY_NAME, "gateway"),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": selector_labels(GATEWAY_NAME)},
            "template": pod_template(GATEWAY_NAME, "gateway", {"containers": [gateway]}),
        },
    }


def gateway_service(spec: FarmSpec) -> Manifest:
    return service(spec, GATEWAY_NAME, "gateway", "http", GATEWAY_PORT)
