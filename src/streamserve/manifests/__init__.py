"""Kubernetes YAML for a whole farm: ``streamserve manifests CONFIG --image IMAGE``.

What it prints, in order: the Namespace; Redis (a StatefulSet with a
PersistentVolumeClaim and AOF on, a bounded memory, and its Service) unless
``--redis-url`` names one; a ConfigMap with the config and a Job that writes
it to Redis (``streamserve deploy``); the scheduler (leader and standby); the
gateway and its Service; and per streamserve deployment a Deployment of
``streamserve worker NAME`` pods (which wait for the deployment to be in
Redis before they start) with a PodDisruptionBudget, plus a KEDA
ScaledObject when it is autoscaled.

On Kubernetes, Kubernetes and KEDA run the worker processes, so every
deployment in the ConfigMap is ``external_scaler_enabled``: its
``num_replicas`` becomes the Deployment's ``replicas``, its
``autoscaling_config`` the ScaledObject. Secrets (the gateway's API key, the
Redis password) are read from a Secret the user creates; these manifests
only name it.

Modules: ``farm_spec`` (the inputs), ``kubernetes_objects`` (farm-wide
objects and the parts of every pod), ``worker_objects`` (per deployment),
``keda_objects`` (autoscaling), ``farm_yaml`` (all of it, in order, as YAML).
"""

from streamserve.manifests.farm_spec import FarmSpec
from streamserve.manifests.farm_yaml import render
from streamserve.manifests.keda_objects import notes

__all__ = ["FarmSpec", "notes", "render"]
