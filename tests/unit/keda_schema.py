"""Our JSON Schema of the two KEDA kinds `streamserve manifests` prints: ScaledObject and TriggerAuthentication.

Written by hand from the field list of KEDA v2.20.2's two CRDs (kedacore/keda,
config/crd/bases/keda.sh_scaledobjects.yaml and keda.sh_triggerauthentications.yaml,
version v1alpha1): names, types, required fields, enums and bounds, no text of
theirs. To move to another KEDA release, read its CRDs again and bring this in
line by hand. One departure: a trigger's ``metricType``, a plain string in the
CRD, is held to the three values KEDA accepts; ``status`` is left out (KEDA
writes it, a manifest must not).
Every object is closed (``additionalProperties: false``), as the API server
would prune (silently drop) a field the CRD does not declare; the exceptions
are the trigger's ``metadata`` (a map of strings) and the provider sections
of a TriggerAuthentication that streamserve never writes (declared by name
only). ``metadata`` and the HPA ``behavior`` are Kubernetes' own types: their
definitions come from the schemas kubernetes-validate ships for one
Kubernetes version, in their strict variant (closed objects as well).
"""

from __future__ import annotations

import functools
import json
from importlib.resources import files
from typing import Any

import jsonschema
from referencing import Registry, Resource

Schema = dict[str, Any]

# The $id of kubernetes-validate's _definitions.json (one per Kubernetes version, under kubernetes-json-schema/).
K8S_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"

STRING: Schema = {"type": "string"}
BOOLEAN: Schema = {"type": "boolean"}
STRING_MAP: Schema = {"type": "object", "additionalProperties": STRING}
UNCHECKED_OBJECT: Schema = {"type": "object"}


def closed(required: str = "", **properties: Schema) -> Schema:
    """An object with these properties and no other; ``required``: the names that must be there, space-separated."""
    return {"type": "object", "properties": properties, "required": required.split(), "additionalProperties": False}


def array(items: Schema, *, min_items: int = 0) -> Schema:
    return {"type": "array", "items": items, "minItems": min_items}


def int32(minimum: int) -> Schema:
    return {"type": "integer", "minimum": minimum, "maximum": 2**31 - 1}


def one_of(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


def kubernetes(definition: str) -> Schema:
    """A type of Kubernetes' own API, e.g. ``io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior``."""
    return {"$ref": f"{K8S_DEFINITIONS}#/$defs/{definition}"}


def custom_resource(kind: str, spec: Schema) -> Schema:
    """A keda.sh/v1alpha1 object; ``status`` is KEDA's to write, so a manifest with one is refused."""
    return closed(
        "apiVersion kind metadata spec",
        apiVersion={"const": "keda.sh/v1alpha1"},
        kind={"const": kind},
        metadata=kubernetes("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
        spec=spec,
    )


SCALED_OBJECT = custom_resource(
    "ScaledObject",
    closed(
        "scaleTargetRef triggers",
        scaleTargetRef=closed("name", name=STRING, kind=STRING, apiVersion=STRING, envSourceContainerName=STRING),
        pollingInterval=int32(1),
        cooldownPeriod=int32(0),
        initialCooldownPeriod=int32(0),
        idleReplicaCount=int32(0),
        minReplicaCount=int32(0),
        maxReplicaCount=int32(1),
        fallback=closed(
            "failureThreshold replicas",
            failureThreshold=int32(0),
            replicas=int32(0),
            behavior=one_of(
                "static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower", "scalingModifiers"
            ),
        ),
        advanced=closed(
            restoreToOriginalReplicaCount=BOOLEAN,
            horizontalPodAutoscalerConfig=closed(
                name=STRING, behavior=kubernetes("io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior")
            ),
            scalingModifiers=closed(
                formula=STRING, target=STRING, activationTarget=STRING, metricType=one_of("AverageValue", "Value")
            ),
        ),
        triggers=array(
            closed(
                "type metadata",
                type=STRING,
                name=STRING,
                metadata=STRING_MAP,
                authenticationRef=closed(
                    "name", name=STRING, kind=one_of("TriggerAuthentication", "ClusterTriggerAuthentication")
                ),
                metricType=one_of("AverageValue", "Value", "Utilization"),  # a plain string in the CRD, these in Go
                useCachedMetrics=BOOLEAN,
            ),
            min_items=1,
        ),
    ),
)

_KEY_REF = closed("parameter name key", parameter=STRING, name=STRING, key=STRING)
TRIGGER_AUTHENTICATION = custom_resource(
    "TriggerAuthentication",
    closed(
        secretTargetRef=array(_KEY_REF),
        configMapTargetRef=array(_KEY_REF),
        env=array(closed("parameter name", parameter=STRING, name=STRING, containerName=STRING)),
        boundServiceAccountToken=array(
            closed("parameter serviceAccountName", parameter=STRING, serviceAccountName=STRING)
        ),
        filePath=STRING,
        podIdentity=UNCHECKED_OBJECT,
        awsSecretManager=UNCHECKED_OBJECT,
        azureKeyVault=UNCHECKED_OBJECT,
        gcpSecretManager=UNCHECKED_OBJECT,
        hashiCorpVault=UNCHECKED_OBJECT,
        oauth2=UNCHECKED_OBJECT,
    ),
)

SCHEMAS = {"ScaledObject": SCALED_OBJECT, "TriggerAuthentication": TRIGGER_AUTHENTICATION}


@functools.cache
def keda_validator(kind: str, k8s_version: str) -> jsonschema.Draft202012Validator:
    """A validator for ``kind`` whose Kubernetes types are those of ``k8s_version`` (e.g. "1.33"), strict."""
    path = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{k8s_version}.0-local-strict"
    definitions = json.loads((path / "_definitions.json").read_text())
    registry: Registry[Any] = Registry().with_resource(K8S_DEFINITIONS, Resource.from_contents(definitions))
    return jsonschema.Draft202012Validator(SCHEMAS[kind], registry=registry)
