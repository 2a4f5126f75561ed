"""`streamserve manifests`: Kubernetes YAML a cluster accepts, and that runs the farm the config describes.

Every object is checked offline against Kubernetes' own schemas (one pinned
version, unknown fields are errors) and the KEDA objects against our schema
of one KEDA release's CRDs (tests/unit/keda_schema.py).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fakeredis import FakeAsyncRedis, FakeServer

import streamserve.cli.stores
from streamserve.cli.main import main
from streamserve.control.desired_state import DesiredState
from streamserve.control.status import DeploymentStatus, StatusReader
from streamserve.wire.config import load_config
from streamserve.wire.keys import Keys
from streamserve.wire.priorities import Priority
from tests.unit.keda_schema import keda_validator

K8S_VERSION = "1.33"
# The redis-streams trigger's metadata that KEDA v2.20.2 reads in stream-length mode (pkg/scalers/
# redis_streams_scaler.go, redis_scaler.go); consumerGroup would switch it to pending-entries mode.
STREAM_LENGTH_FIELDS = {"address", "stream", "streamLength", "databaseIndex", "enableTLS", "username", "unsafeSsl"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

API_KEY = "apikey-7f3c9e1d5b"
REDIS_PASSWORD = "redispw-2a8b6c4e0f"
LOCAL_REDIS_PASSWORD = "localpw-9d1e3f5a7b"
NS = "ml-farm"

CONFIG = """\
deployments:
  - name: embed_gpu                 # '_' is no Kubernetes name
    import_path: examples.echo:Echo
    num_replicas: 3
    graceful_shutdown_timeout_s: 45.5
    max_ongoing_requests: 4
    resources: {cpus: 1.5, memory: 2Gi, gpus: 2}
  - name: lazy
    import_path: examples.sleepy:sleepy
    route_prefix: /lazy
    autoscaling_config:
      {min_replicas: 0, max_replicas: 4, target_ongoing_requests: 2, upscale_delay_s: 3, downscale_delay_s: 120}
endpoints:
  - name: classify
    traffic: {embed_gpu: 1}
"""

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "farm.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """`streamserve manifests ARGS` through the real entry point: (exit code, stdout, stderr).

    The environment holds secrets, as a user's shell might; none may reach the output.
    """
    monkeypatch.setenv("STREAMSERVE_API_KEY", API_KEY)
    monkeypatch.setenv("STREAMSERVE_REDIS_PASSWORD", REDIS_PASSWORD)
    monkeypatch.setenv("REDIS_URL", f"redis://:{LOCAL_REDIS_PASSWORD}@127.0.0.1:6379/0")

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main(["manifests", *args])
        except SystemExit as exit:  # argparse's usage errors
            code = int(exit.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def objects(out: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(out) if doc is not None]


def farm(run: Run, config_file: Path, *extra: str) -> list[dict[str, Any]]:
    code, out, err = run(str(config_file), "--image", "registry.example/farm:1.0", "--namespace", NS, *extra)
    assert code == 0, err
    return objects(out)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def worker_deployment(docs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["spec"]["template"]["spec"]["containers"][0]["command"] == ["streamserve", "worker", deployment]
    ]
    return found


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template's spec, by its object's kind and name."""
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "Job")
    }


def streamserve_containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every container that runs the image (init containers too; not Redis), by object and container name."""
    return {
        f"{where}/{c['name']}": c
        for where, pod in pod_specs(docs).items()
        for c in [*pod.get("initContainers", []), *pod["containers"]]
        if c["name"] != "redis"
    }


@pytest.mark.parametrize("redis", [[], ["--redis-url", "rediss://redis.shared.example:6380/2"]], ids=["own", "url"])
def test_every_object_is_valid_for_kubernetes_and_keda(run: Run, config_file: Path, redis: list[str]) -> None:
    docs = farm(run, config_file, *redis)
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].startswith("keda.sh/"):
            errors = [e.message for e in keda_validator(doc["kind"], K8S_VERSION).iter_errors(doc)]
            assert not errors, f"{name}: {errors}"
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        # Names and label values: what the schemas leave to the API server.
        assert DNS_LABEL.match(doc["metadata"]["name"]), name
        assert all(DNS_LABEL.match(v) for v in doc["metadata"]["labels"].values()), name
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NS, name
    assert (docs[0]["kind"], docs[0]["metadata"]["name"]) == ("Namespace", NS)  # first: the rest goes in it


@pytest.mark.parametrize(
    ("kind", "where", "typo"),
    [
        ("ScaledObject", ["spec"], "minReplicas"),
        ("ScaledObject", ["spec", "triggers", 0, "authenticationRef"], "kindd"),
        ("ScaledObject", ["spec", "advanced", "horizontalPodAutoscalerConfig", "behavior", "scaleUp"], "window"),
        ("ScaledObject", ["metadata"], "label"),
        ("TriggerAuthentication", ["spec", "secretTargetRef", 0], "secretKey"),
    ],
)
def test_the_keda_check_refuses_fields_the_crd_does_not_declare(
    run: Run, config_file: Path, kind: str, where: list[str | int], typo: str
) -> None:
    (printed,) = [d for d in farm(run, config_file) if d["kind"] == kind]
    misspelled = copy.deepcopy(printed)
    node: Any = misspelled
    for step in where:
        node = node[step]
    node[typo] = 1
    assert not list(keda_validator(kind, K8S_VERSION).iter_errors(printed))
    assert list(keda_validator(kind, K8S_VERSION).iter_errors(misspelled))


def test_the_whole_farm_is_there(run: Run, config_file: Path) -> None:
    docs = farm(run, config_file)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] != "Job")
    fixed = worker_deployment(docs, "embed_gpu")["metadata"]["name"]
    assert fixed.startswith("streamserve-worker-embed-gpu-")
    assert kinds == sorted(
        [
            ("Namespace", NS),
            ("Service", "streamserve-redis"),
            ("StatefulSet", "streamserve-redis"),
            ("ConfigMap", "streamserve-config"),
            ("Deployment", "streamserve-scheduler"),
            ("Deployment", "streamserve-gateway"),
            ("Service", "streamserve-gateway"),
            ("TriggerAuthentication", "streamserve-redis-auth"),
            ("Deployment", fixed),
            ("PodDisruptionBudget", fixed),
            ("Deployment", "streamserve-worker-lazy"),
            ("PodDisruptionBudget", "streamserve-worker-lazy"),
            ("ScaledObject", "streamserve-worker-lazy"),
        ]
    )
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert job["metadata"]["name"].startswith("streamserve-deploy-")


def test_redis_in_the_namespace_keeps_its_data_and_its_password_in_the_secret(run: Run, config_file: Path) -> None:
    docs = farm(run, config_file)
    redis = one(docs, "StatefulSet", "streamserve-redis")["spec"]
    server = redis["template"]["spec"]["containers"][0]
    args = " ".join(server["args"])
    assert "--appendonly yes" in args and "--maxmemory-policy noeviction" in args
    assert "--requirepass $(REDIS_PASSWORD)" in args
    assert env_of(server)["REDIS_PASSWORD"] == {"secretKeyRef": {"name": "streamserve", "key": "redis-password"}}
    (claim,) = redis["volumeClaimTemplates"]
    assert server["volumeMounts"] == [{"name": claim["metadata"]["name"], "mountPath": "/data"}]
    assert one(docs, "Service", "streamserve-redis")["spec"]["ports"][0]["port"] == 6379

    scheduler = one(docs, "Deployment", "streamserve-scheduler")["spec"]["template"]["spec"]["containers"][0]
    env = env_of(scheduler)
    assert env["STREAMSERVE_REDIS_URL"] == f"redis://streamserve-redis.{NS}.svc:6379/0"
    assert env["STREAMSERVE_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "streamserve", "key": "redis-password"}}


def test_redis_in_the_namespace_is_the_image_compose_pins_and_is_restarted_only_when_it_stops_answering(
    run: Run, config_file: Path
) -> None:
    docs = farm(run, config_file)
    (server,) = one(docs, "StatefulSet", "streamserve-redis")["spec"]["template"]["spec"]["containers"]
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker" / "compose.yaml").read_text())
    assert server["image"] == compose["services"]["redis"]["image"]
    assert re.fullmatch(r"redis:\d+\.\d+\.\d+(-\w+)?", server["image"])  # a patch release, not a moving tag
    ready, live = server["readinessProbe"], server["livenessProbe"]
    assert live["exec"] == ready["exec"]
    assert "redis-cli ping" in " ".join(live["exec"]["command"])
    assert "MISCONF" in " ".join(live["exec"]["command"])  # a full disk: Redis refuses PING, and runs
    # An AOF rewrite can stall Redis for seconds: a minute without an answer before a restart.
    assert live["periodSeconds"] * live["failureThreshold"] >= 60
    assert live["periodSeconds"] > ready["periodSeconds"] and live["timeoutSeconds"] >= ready["timeoutSeconds"]


@pytest.mark.parametrize(
    ("memory", "maxmemory", "storage"),
    [
        (None, 3 * 2**30 // 4, "3Gi"),
        ("512Mi", 3 * 2**29 // 4, "1536Mi"),
        ("6G", 4_500_000_000, "18G"),
        ("1.5Gi", 3 * 3 * 2**29 // 4, "4.5Gi"),
    ],
)
def test_redis_in_the_namespace_has_bounded_memory_and_a_volume_that_follows_it(
    run: Run, config_file: Path, memory: str | None, maxmemory: int, storage: str
) -> None:
    docs = farm(run, config_file, *(["--redis-memory", memory] if memory else []))
    redis = one(docs, "StatefulSet", "streamserve-redis")["spec"]
    server = redis["template"]["spec"]["containers"][0]
    limit = memory or "1Gi"
    assert server["resources"] == {"requests": {"memory": limit}, "limits": {"memory": limit}}
    args = server["args"]
    assert args[args.index("--maxmemory") + 1] == str(maxmemory)  # 3/4 of the limit: writes fail before the kernel
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    (claim,) = redis["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == storage


def test_an_existing_redis_gets_no_redis_objects_and_a_password_only_if_the_secret_has_one(
    run: Run, config_file: Path
) -> None:
    url = "rediss://redis.shared.example:6380/2"
    docs = farm(run, config_file, "--redis-url", url)
    assert "StatefulSet" not in {d["kind"] for d in docs}
    assert ("Service", "streamserve-redis") not in {(d["kind"], d["metadata"]["name"]) for d in docs}
    pod_specs = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]
    assert len(pod_specs) == 5  # scheduler, gateway, two workers, the deploy Job
    for pod in pod_specs:
        env = env_of(pod["containers"][0])
        assert env["STREAMSERVE_REDIS_URL"] == url
        ref = env["STREAMSERVE_REDIS_PASSWORD"]["secretKeyRef"]
        assert ref == {"name": "streamserve", "key": "redis-password", "optional": True}
    trigger = one(docs, "ScaledObject", "streamserve-worker-lazy")["spec"]["triggers"][0]["metadata"]
    assert trigger["address"] == "redis.shared.example:6380"
    assert trigger["enableTLS"] == "true"
    assert trigger["databaseIndex"] == "2"


def test_an_autoscaled_deployment_gets_a_scaled_object_on_its_stream_length(run: Run, config_file: Path) -> None:
    docs = farm(run, config_file)
    deployment = worker_deployment(docs, "lazy")
    assert "replicas" not in deployment["spec"]  # KEDA owns the count; kubectl apply must not reset it
    scaled = one(docs, "ScaledObject", deployment["metadata"]["name"])["spec"]
    assert scaled["scaleTargetRef"] == {"name": deployment["metadata"]["name"]}
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"], scaled["cooldownPeriod"]) == (0, 4, 120)
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 3
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 120

    # One trigger per stream the replicas read (a priority level each, and the count the scheduler keeps of the model
    # streams: wire/models.py), summed into the one metric the HPA scales on: the whole backlog against
    # target_ongoing_requests.
    triggers = scaled["triggers"]
    assert {t["name"]: t["metadata"]["stream"] for t in triggers} == {
        "high": Keys().requests("lazy", Priority.HIGH),
        "normal": Keys().requests("lazy"),
        "low": Keys().requests("lazy", Priority.LOW),
        "models": Keys().model_backlog("lazy"),
    }
    assert scaled["advanced"]["scalingModifiers"] == {
        "formula": "high + normal + low + models",
        "target": "2",
        "activationTarget": "0",
    }
    trigger = triggers[1]
    assert trigger["type"] == "redis-streams"
    meta = trigger["metadata"]
    assert meta["streamLength"] == "2"
    assert meta["address"] == f"streamserve-redis.{NS}.svc:6379"
    assert all(set(t["metadata"]) <= STREAM_LENGTH_FIELDS for t in triggers)  # no consumerGroup: stream-length mode
    auth = one(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "streamserve", "key": "redis-password"}
    ]

    scaled_targets = {d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "ScaledObject"}
    assert scaled_targets == {deployment["metadata"]["name"]}


def test_a_fixed_deployment_gets_its_count_resources_gpus_and_time_to_drain(run: Run, config_file: Path) -> None:
    docs = farm(run, config_file)
    deployment = worker_deployment(docs, "embed_gpu")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > 45.5
    resources = pod["spec"]["containers"][0]["resources"]
    wanted = {"cpu": "1500m", "memory": "2Gi", "nvidia.com/gpu": "2"}
    assert resources == {"requests": wanted, "limits": wanted}
    assert "resources" not in worker_deployment(docs, "lazy")["spec"]["template"]["spec"]["containers"][0]

    budget = one(docs, "PodDisruptionBudget", deployment["metadata"]["name"])["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"] == deployment["spec"]["selector"]
    assert budget["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_the_farms_own_processes_request_cpu_and_memory_but_are_not_limited(run: Run, config_file: Path) -> None:
    """Not BestEffort (evicted first), and never CPU-throttled or OOM-killed at a limit of ours."""
    containers = streamserve_containers(farm(run, config_file))
    own = {where: c for where, c in containers.items() if not where.endswith("/worker")}
    assert len(own) == 5  # the Job, scheduler, gateway, the workers' init containers
    for where, container in own.items():
        assert set(container["resources"]) == {"requests"}, where
        assert set(container["resources"]["requests"]) == {"cpu", "memory"}, where
    requests = {where.split("/")[-1]: c["resources"]["requests"] for where, c in own.items()}
    assert requests["scheduler"] == {"cpu": "100m", "memory": "128Mi"}
    assert requests["gateway"] == {"cpu": "250m", "memory": "256Mi"}
    assert requests["deploy"] == requests["wait-for-deployment"] == {"cpu": "50m", "memory": "64Mi"}


def test_gateway_and_scheduler_run_two_each(run: Run, config_file: Path) -> None:
    docs = farm(run, config_file)
    gateway = one(docs, "Deployment", "streamserve-gateway")["spec"]
    assert gateway["replicas"] == 2
    container = gateway["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["streamserve", "gateway"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/-/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert env_of(container)["STREAMSERVE_API_KEY"] == {"secretKeyRef": {"name": "streamserve", "key": "api-key"}}
    service = one(docs, "Service", "streamserve-gateway")["spec"]
    assert service["selector"].items() <= gateway["template"]["metadata"]["labels"].items()

    scheduler = one(docs, "Deployment", "streamserve-scheduler")["spec"]
    assert scheduler["replicas"] == 2
    assert scheduler["template"]["spec"]["containers"][0]["command"] == ["streamserve", "scheduler"]


@pytest.mark.parametrize("redis", [[], ["--redis-url", "redis://redis.shared.example:6379/0"]], ids=["own", "url"])
def test_no_pod_gets_a_token_or_privileges(run: Run, config_file: Path, redis: list[str]) -> None:
    code, out, err = run(str(config_file), "--image", "registry.example/farm:1.0", *redis)
    assert code == 0, err
    assert "&id" not in out  # each pod its own securityContext, not a YAML alias of one
    docs = objects(out)
    pods = pod_specs(docs)
    assert len(pods) == 5 + (not redis)  # scheduler, gateway, two workers, the deploy Job; Redis
    for where, pod in pods.items():
        assert pod["automountServiceAccountToken"] is False, where  # nothing in the farm calls the Kubernetes API
        assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}, where
    containers = streamserve_containers(docs)
    assert len(containers) == 7  # with the workers' init containers
    for where, container in containers.items():
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,  # docker/Dockerfile's USER is a number, which the kubelet can check
        }, where
    if not redis:
        # Redis's image starts as root and drops to its user (chown, setuid, setgid): its capabilities stay.
        (server,) = one(docs, "StatefulSet", "streamserve-redis")["spec"]["template"]["spec"]["containers"]
        assert "securityContext" not in server


def test_the_image_the_docs_build_runs_as_a_numbered_user_that_is_not_root() -> None:
    """runAsNonRoot: the kubelet refuses a user it cannot see is not root (a name, as `USER streamserve` was)."""
    dockerfile = (Path(__file__).resolve().parents[2] / "docker" / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\S+)$", dockerfile, re.MULTILINE)
    assert user.isdigit() and int(user) != 0
    assert f"--uid {user} " in dockerfile  # the user the image creates


def test_no_secret_value_is_printed(run: Run, config_file: Path) -> None:
    for extra in ([], ["--redis-url", "redis://redis.shared.example:6379/0"]):
        code, out, err = run(str(config_file), "--image", "registry.example/farm:1.0", *extra)
        assert code == 0, err
        for secret in (API_KEY, REDIS_PASSWORD, LOCAL_REDIS_PASSWORD):
            assert secret not in out + err
        assert "Secret" not in {d["kind"] for d in objects(out)}
        assert "kubectl -n streamserve create secret generic streamserve" in out  # the header says how


def test_the_config_map_holds_the_config_with_every_deployment_externally_scaled(
    run: Run, config_file: Path, tmp_path: Path
) -> None:
    docs = farm(run, config_file)
    config_map = one(docs, "ConfigMap", "streamserve-config")
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    (mount,) = pod["containers"][0]["volumeMounts"]
    (volume,) = pod["volumes"]
    assert volume == {"name": mount["name"], "configMap": {"name": "streamserve-config"}}
    (key,) = config_map["data"]
    assert pod["containers"][0]["command"] == ["streamserve", "deploy", f"{mount['mountPath']}/{key}"]

    written = tmp_path / "from-config-map.yaml"
    written.write_text(config_map["data"][key])
    config = load_config(written)
    assert all(d.external_scaler_enabled for d in config.deployments)
    assert all(d.num_replicas is None and d.autoscaling_config is None for d in config.deployments)
    original = {d.name: d for d in load_config(config_file).deployments}
    for d in config.deployments:  # everything else as the user wrote it
        assert d.model_dump(exclude={"num_replicas", "autoscaling_config", "external_scaler_enabled"}) == original[
            d.name
        ].model_dump(exclude={"num_replicas", "autoscaling_config", "external_scaler_enabled"})
    assert config.endpoints == load_config(config_file).endpoints


def test_a_changed_config_makes_a_new_deploy_job(run: Run, config_file: Path) -> None:
    def job_name() -> str:
        (job,) = [d for d in farm(run, config_file) if d["kind"] == "Job"]
        return str(job["metadata"]["name"])

    first = job_name()
    assert job_name() == first  # applied again: the same Job, nothing re-runs
    config_file.write_text(CONFIG.replace("max_ongoing_requests: 4", "max_ongoing_requests: 5"))
    assert job_name() != first  # a Job cannot change: a new config needs a new one


def test_what_kubernetes_cannot_hold_exactly_is_said_on_stderr(run: Run, config_file: Path) -> None:
    config_file.write_text(
        CONFIG.replace("target_ongoing_requests: 2", "target_ongoing_requests: 2.5").replace(
            "downscale_delay_s: 120", "downscale_delay_s: 7200"
        )
    )
    code, out, err = run(str(config_file), "--image", "registry.example/farm:1.0")
    assert code == 0
    scaled = one(objects(out), "ScaledObject", "streamserve-worker-lazy")["spec"]
    assert scaled["triggers"][0]["metadata"]["streamLength"] == "3"
    assert scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 3600
    }
    assert scaled["cooldownPeriod"] == 7200
    assert "target_ongoing_requests 2.5 becomes streamLength 3" in err
    assert "downscale_delay_s 7200 is above the HPA's limit" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--namespace", "ml"], "the following arguments are required: --image"),
        (["--image", "x:1", "--redis-url", "redis://:hunter2@redis.shared.example:6379/0"], "Secret's redis-password"),
        (["--image", "x:1", "--redis-url", "redis://redis.shared.example:6379/0?password=hunter2"], "redis-password"),
        (["--image", "x:1", "--namespace", "ML_Farm"], "not a Kubernetes namespace name"),
        (["--image", "x:1", "--redis-memory", "lots"], "--redis-memory 'lots' is not a memory size"),
        (["--image", "x:1", "--redis-memory", "0Gi"], "--redis-memory '0Gi' is not a memory size"),
        (
            ["--image", "x:1", "--redis-url", "redis://redis.shared.example:6379/0", "--redis-memory", "2Gi"],
            "with --redis-url there is none",
        ),
    ],
)
def test_bad_arguments_exit_2_and_say_why(run: Run, config_file: Path, args: list[str], message: str) -> None:
    code, out, err = run(str(config_file), *args)
    assert (code, out) == (2, "")
    assert message in err
    assert "hunter2" not in err


def test_the_config_limits_go_into_every_pod_the_config_was_checked_against(
    run: Run, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy Job checks the config again: it must do so against the limits `manifests` checked it against."""
    config_file.write_text(CONFIG.replace("max_ongoing_requests: 4", "max_ongoing_requests: 20000"))
    code, _, err = run(str(config_file), "--image", "x:1")
    assert code == 2 and "max_ongoing_requests" in err  # above the default maximum
    monkeypatch.setenv("STREAMSERVE_CONFIG_LIMITS", "max_ongoing_requests=50000")
    containers = streamserve_containers(farm(run, config_file))
    assert len(containers) == 7  # the Job, scheduler, gateway, two workers and their init containers
    for where, container in containers.items():
        assert env_of(container)["STREAMSERVE_CONFIG_LIMITS"] == "max_ongoing_requests=50000", where


def test_an_import_path_outside_the_allow_list_exits_2_as_deploy_would(
    run: Run, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMSERVE_IMPORT_ALLOW", "examples")
    for where, container in streamserve_containers(farm(run, config_file)).items():
        assert env_of(container)["STREAMSERVE_IMPORT_ALLOW"] == "examples", where
    config_file.write_text(CONFIG.replace("import_path: examples.sleepy:sleepy", "import_path: os:system"))
    code, out, err = run(str(config_file), "--image", "x:1")
    assert (code, out) == (2, "")
    assert "deployment 'lazy': import_path 'os:system' is outside STREAMSERVE_IMPORT_ALLOW (examples)" in err
    assert len(err.strip().splitlines()) == 1


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "image",
    [
        "farm:1",
        "registry.example.com:5000/team/farm:1.2",
        "localhost/farm",
        f"ghcr.io/a/b@{DIGEST}",
        f"farm:1@{DIGEST}",
        "team__a/farm-x--y.z_w:Tag_1.0-rc",
        "[fd00::1]:5000/farm",
    ],
)
def test_an_image_reference_is_used_as_given(run: Run, config_file: Path, image: str) -> None:
    code, out, err = run(str(config_file), "--image", image)
    assert code == 0, err
    for where, container in streamserve_containers(objects(out)).items():
        assert container["image"] == image, where


@pytest.mark.parametrize(
    "image",
    [
        "Bad Image!!",
        "UPPER/case:tag",  # UPPER is no registry (no '.' or ':', not localhost), so a path: lowercase only
        "Farm:1",
        "img:tag@sha256:zz",
        f"farm@{DIGEST.upper()}",
        "farm@md5:" + "0" * 32,
        "farm:1\nkind: Secret",
        "farm\u2028x",
        "farm:",
        "farm:-1",
        "farm:" + "t" * 129,
        "a//b",
        "farm/",
        "a_-b",
        "registry.example.com:port/farm",
        "r.io/" + "a" * 251,
    ],
)
def test_an_image_that_is_no_image_reference_exits_2_naming_it(run: Run, config_file: Path, image: str) -> None:
    code, out, err = run(str(config_file), "--image", image)
    assert (code, out) == (2, "")
    assert f"--image {image!r} is not a container image reference" in err
    assert len(err.strip().splitlines()) == 1


def test_a_bad_config_exits_2_naming_the_deployment_and_field(run: Run, config_file: Path) -> None:
    config_file.write_text(CONFIG.replace("num_replicas: 3", "num_replicas: -1"))
    code, out, err = run(str(config_file), "--image", "x:1")
    assert (code, out) == (2, "")
    assert "deployment 'embed_gpu' (deployments[0]): num_replicas" in err


# -- workers wait for their deployment ------------------------------------------------------------------------------


@pytest.fixture
def on_fakeredis(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str]]:
    """`streamserve ARGS` through the real entry point, against one fakeredis: (exit code, stdout).

    fakeredis runs no Lua, which the queue figures of ``status`` need: those
    read as 0 here. Which deployments ``status --json`` lists, and how it
    prints them, is the real code's.
    """
    server = FakeServer()

    def fake_redis(*_args: Any, **_kwargs: Any) -> FakeAsyncRedis:
        return FakeAsyncRedis(server=server)

    async def listed(_reader: StatusReader) -> list[DeploymentStatus]:
        deployments = await DesiredState(fake_redis(), Keys()).deployments()
        return [
            DeploymentStatus(
                name=name,
                route_prefix=d.route_prefix,
                version=d.code_version(),
                health="HEALTHY",
                message="",
                target=0,
                running=0,
                starting=0,
                stopping=0,
                queued=0,
                in_flight=0,
                dead_letters=0,
            )
            for name, d in sorted(deployments.items())
        ]

    monkeypatch.setattr(streamserve.cli.stores, "async_redis", fake_redis)
    monkeypatch.setattr(StatusReader, "status", listed)

    def streamserve_command(*args: str) -> tuple[int, str]:
        code = main(list(args))
        out, _ = capsys.readouterr()
        return code, out

    return streamserve_command


def test_a_worker_pod_waits_until_the_deploy_job_has_written_its_deployment(
    run: Run, config_file: Path, tmp_path: Path, on_fakeredis: Callable[..., tuple[int, str]]
) -> None:
    """The init container loops on `streamserve status --json | grep -qF "$2"`; this test does that grep itself.

    The shell loop around it (its bound, its sleep, its exit codes) is not
    run here: that needs a shell process, which unit tests may not start.
    """
    docs = farm(run, config_file)
    config_map = one(docs, "ConfigMap", "streamserve-config")
    waits = {}
    for name in ("embed_gpu", "lazy"):
        pod = worker_deployment(docs, name)["spec"]["template"]["spec"]
        (wait,) = pod["initContainers"]
        (worker,) = pod["containers"]
        assert (wait["image"], wait["env"]) == (worker["image"], worker["env"])  # same Redis, same key prefix
        shell, flag, script, _zero, deployment, line = wait["command"]
        assert (shell, flag, deployment) == ("sh", "-c", name)
        assert 'until streamserve status --json | grep -qF "$2"; do' in script
        assert re.search(r'if \[ "\$tries" -ge [0-9]+ \]; then\n.*\n +exit 1\n', script)  # bounded, then exit 1
        waits[name] = line

    def listed(status: str, line: str) -> bool:  # grep -qF LINE: some line of the output holds it
        return any(line in printed for printed in status.splitlines())

    others = tmp_path / "others.yaml"  # names that hold the awaited ones, and an endpoint
    others.write_text(
        "deployments:\n"
        "  - {name: lazy_old, import_path: examples.sleepy:sleepy}\n"
        "  - {name: xlazy, import_path: examples.sleepy:sleepy}\n"
        "  - {name: embed_gpu2, import_path: examples.echo:Echo}\n"
        "endpoints:\n"
        "  - {name: lazy-endpoint, traffic: {xlazy: 1}}\n"
    )
    assert on_fakeredis("deploy", str(others))[0] == 0
    code, status = on_fakeredis("status", "--json")
    assert code == 0 and '"name": "xlazy"' in status
    assert not any(listed(status, line) for line in waits.values())

    deployed = tmp_path / "config.yaml"  # what the deploy Job writes
    (text,) = config_map["data"].values()
    deployed.write_text(text)
    assert on_fakeredis("deploy", str(deployed))[0] == 0
    code, status = on_fakeredis("status", "--json")
    assert code == 0
    assert all(listed(status, line) for line in waits.values())
