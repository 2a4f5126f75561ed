"""Every Redis key, stream, consumer group and channel name streamserve uses.

This is the only module that knows the key layout. Each deployment's keys
share the ``{name}`` hash tag so that they land in one Redis Cluster slot and
one Lua script may name several of them. The farm-wide keys share the
``{prefix}`` tag, so that one transaction may write several of them (a deploy
writes the deployments, the goals and the snapshot ids together); on a
cluster, the farm's deployments spread over the masters by name, and the
reply streams (untagged) by caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamserve.wire.models import replica_of_lane
from streamserve.wire.priorities import PRIORITIES, Priority, lane_priority
from streamserve.wire.tenants import DEFAULT_TENANT

_NORMAL = Priority.NORMAL

DEFAULT_PREFIX = "streamserve"

# The one consumer group on every request stream; its consumers are replica ids.
CONSUMER_GROUP = "replicas"
# How long the scheduler's leader lock (Keys.scheduler_lock) outlives its holder's last renewal; the leader renews it
# every tick.
LEADER_LOCK_TTL_S = 5.0


def _of_tenant(tenant: str) -> str:
    """What sets one tenant's idempotency keys apart from another's in a key name, before the ``:`` that precedes the
    key: nothing for the default tenant, else ``.TENANT``. A tenant name holds no ``:``, so no two (tenant, key)
    pairs share a name."""
    return "" if tenant == DEFAULT_TENANT else f".{tenant}"


class ConfigKey:
    """Names of the long-polled config values in the snapshot-id hash."""

    # The desired deployments (any change to any deployment bumps it).
    DEPLOYMENTS = "deployments"

    # The endpoints and their traffic weights.
    ENDPOINTS = "endpoints"

    # The scheduler's verdicts (health, running replicas) on the deployments.
    DEPLOYMENT_STATUS = "deployment_status"

    @staticmethod
    def replicas(deployment: str) -> str:
        """The replica set of one deployment."""
        return f"replicas:{deployment}"


@dataclass(frozen=True)
class Keys:
    """Builds key names under one prefix (``streamserve`` unless configured)."""

    prefix: str = DEFAULT_PREFIX

    # -- farm-wide keys (all share the {prefix} hash tag) ----------------------

    def _farm(self, suffix: str) -> str:
        return f"{{{self.prefix}}}:{suffix}"

    def legacy_farm_keys(self) -> dict[str, str]:
        """Old name -> current name of the farm-wide keys that outlive a restart, as releases before the hash tag
        named them (``streamserve:deployments``); see key_migration."""
        kept = ("deployments", "endpoints", "snapshot_ids", "deployment_status", "autoscaling", "goals")
        return {f"{self.prefix}:{suffix}": self._farm(suffix) for suffix in kept}

    def deployments(self) -> str:
        """Hash: deployment name -> desired DeploymentConfig as JSON."""
        return self._farm("deployments")

    def endpoints(self) -> str:
        """Hash: endpoint name -> EndpointConfig as JSON."""
        return self._farm("endpoints")

    def snapshot_ids(self) -> str:
        """Hash: config key (see ConfigKey) -> snapshot id, bumped on every change."""
        return self._farm("snapshot_ids")

    def config_channel(self) -> str:
        """Pub/sub channel: each message is the ConfigKey that just changed."""
        return self._farm("config")

    def scheduler_lock(self) -> str:
        """String with expiry: the id of the scheduler that currently leads."""
        return self._farm("scheduler:leader")

    def deployment_status(self) -> str:
        """Hash: deployment name -> DeploymentHealthRecord JSON, written only by the scheduler."""
        return self._farm("deployment_status")

    def autoscaling(self) -> str:
        """Hash: deployment name -> AutoscaleRecord JSON (the replica count autoscaling decided), scheduler only."""
        return self._farm("autoscaling")

    def goals(self) -> str:
        """Hash: goal id -> GoalRecord JSON; the scheduler completes and prunes them."""
        return self._farm("goals")

    def replicas_pattern(self) -> str:
        """SCAN pattern matching every deployment's replicas hash."""
        return f"{self.prefix}:{{*}}:replicas"

    def deployment_of_replicas_key(self, key: str) -> str:
        """The deployment name inside a replicas hash's key."""
        return key[len(self.prefix) + 2 : -len("}:replicas")]

    def reply_stream(self, caller_id: str) -> str:
        """Stream: replies for one caller process (a gateway or a client)."""
        return f"{self.prefix}:replies:{caller_id}"

    def jobs_queue(self) -> str:
        """The name of the RQ queue of asynchronous jobs.

        RQ builds its own keys from it (``rq:queue:<this>``, ``rq:job:<id>``, ...):
        those belong to RQ, under its fixed ``rq:`` prefix, not to this module.
        """
        return f"{self.prefix}:jobs"

    def job_cancel(self, job_id: str) -> str:
        """String with expiry (the job result TTL plus the job's time limit): how a job's cancel and the end of its
        call were settled, set once (SET NX) by whichever came first: ``canceled`` by ``DELETE /-/jobs/<id>``, else
        the job function's ``finished`` or ``failed``. Lives with RQ's keys, in the jobs' Redis."""
        return f"{self.prefix}:jobs:cancel:{job_id}"

    def job_idempotency(self, name: str, key: str, tenant: str = DEFAULT_TENANT) -> str:
        """String with expiry (idempotency_ttl_s): the job that idempotency key ``key`` of ``tenant`` for deployment
        or endpoint ``name`` queued, as JSON ``[job id, digest of method and body, when it was claimed (epoch ms)]``,
        set once (SET NX), taken anew once its job is gone. Lives with RQ's keys, in the jobs' Redis."""
        return f"{self.prefix}:jobs:idem:{name}{_of_tenant(tenant)}:{key}"

    def job_idempotency_pattern(self, name: str) -> str:
        """SCAN pattern matching every job idempotency key of one deployment or endpoint, every tenant's (to
        delete). (A deployment name holds no ``.`` or ``:``.)"""
        return f"{self.prefix}:jobs:idem:{name}[.:]*"

    # -- per-deployment keys (all share the {name} hash tag) -----------------

    def _tagged(self, deployment: str, suffix: str) -> str:
        return f"{self.prefix}:{{{deployment}}}:{suffix}"

    def requests(self, deployment: str, priority: Priority = Priority.NORMAL) -> str:
        """Stream: the deployment's request queue of one priority level, read by the CONSUMER_GROUP
        (``...:requests`` for ``normal``, ``...:requests:high`` and ``...:requests:low``; wire/priorities.py)."""
        if priority is _NORMAL:
            return f"{self.prefix}:{{{deployment}}}:requests"  # (written out: the hot path asks for it per call)
        return self._tagged(deployment, f"requests:{priority.value}")

    def request_streams(self, deployment: str) -> dict[Priority, str]:
        """The deployment's request streams by priority, highest first."""
        return {priority: self.requests(deployment, priority) for priority in PRIORITIES}

    def routed_requests(self, deployment: str, replica_id: str) -> str:
        """Stream: the requests routed to one replica of a multiplexing deployment because it holds their model
        (wire/models.py), read by the CONSUMER_GROUP; made when the replica starts, deleted once it is gone and
        nothing in it is pending."""
        return f"{self.models_prefix(deployment)}to:{replica_id}"

    def models_prefix(self, deployment: str) -> str:
        """What the keys of a deployment's multiplexing start with; the scripts make a replica's routed stream and
        models set from it (``to:`` and ``of:`` and the replica id), keys no caller could name beforehand."""
        return self._tagged(deployment, "models:")

    def model_holders(self, deployment: str, model_id: str) -> str:
        """Sorted set: the replicas that hold one model -> until when (epoch ms, Redis's clock), renewed with their
        heartbeats; requests are routed only to holders whose time has not passed. Named from models_prefix, as the
        enqueue script makes it for each model a replica holds (scripts._ROUTE)."""
        return f"{self.models_prefix(deployment)}holders:{model_id}"

    def models_of(self, deployment: str, replica_id: str) -> str:
        """Sorted set: the models one replica holds or was given to load -> until when (epoch ms, Redis's clock): how
        much room it has left for another model (Keys.model_room)."""
        return f"{self.models_prefix(deployment)}of:{replica_id}"

    def model_room(self, deployment: str) -> str:
        """Hash: replica id -> its max_models_per_replica, while it is live."""
        return self._tagged(deployment, "models:room")

    def routed_replicas(self, deployment: str) -> str:
        """Sorted set: the replicas that have a stream of routed requests -> until when they are live (as their
        holds; 0 once they left), for the scheduler to give a gone replica's queue back (scripts.ROUTED_STREAMS)."""
        return self._tagged(deployment, "models:replicas")

    def model_backlog(self, deployment: str) -> str:
        """Stream of placeholders that the scheduler keeps as long as the routed streams together
        (scripts.ROUTED_STREAMS): KEDA reads stream lengths by name, and routed streams come and go."""
        return self._tagged(deployment, "models:backlog")

    def model_pattern(self, deployment: str) -> str:
        """SCAN pattern matching every key of one deployment's multiplexing (streams, holders, replicas)."""
        return self._tagged(deployment, "models:*")

    def lane_stream(self, deployment: str, lane: bytes) -> str:
        """The stream of a lane (wire/priorities.py, lane_ref): a priority level's, or a replica's routed one."""
        replica_id = replica_of_lane(lane)
        if replica_id is not None:
            return self.routed_requests(deployment, replica_id)
        return self.requests(deployment, lane_priority(lane))

    def replicas(self, deployment: str) -> str:
        """Hash: replica id -> ReplicaRecord JSON, written only by the scheduler."""
        return self._tagged(deployment, "replicas")

    def heartbeats(self, deployment: str) -> str:
        """Hash: replica id -> Heartbeat JSON, each field written only by its replica (see heartbeats.py)."""
        return self._tagged(deployment, "heartbeats")

    def heartbeat_times(self, deployment: str) -> str:
        """Sorted set: replica id -> when it last beat (epoch ms), written with each heartbeat."""
        return self._tagged(deployment, "heartbeat_times")

    def heartbeat_news(self, deployment: str) -> str:
        """String: a counter bumped each time a heartbeat says something new (or is removed)."""
        return self._tagged(deployment, "heartbeat_news")

    def dead_letters(self, deployment: str) -> str:
        """Stream: requests that were delivered too many times."""
        return self._tagged(deployment, "dead")

    def untold_dead_letters(self, deployment: str) -> str:
        """List: whom to tell about the requests the REQUEUE script sent to the dead-letter stream (nine fields each:
        scripts.REQUEUE), until the scheduler has (scheduler/reclaim.py): a scheduler killed between the two, or the
        script's answer lost with its connection, leaves them here instead of leaving their callers waiting."""
        return self._tagged(deployment, "dead_untold")

    def metrics(self, deployment: str) -> str:
        """Hash: figure name (with labels) -> running total, incremented by every gateway and replica (metrics)."""
        return self._tagged(deployment, "metrics")

    def metrics_history(self, deployment: str) -> str:
        """Stream, capped: the scheduler's samples of the metrics hash over recent minutes (the dashboard's charts)."""
        return self._tagged(deployment, "metrics_history")

    def autoscale_decisions(self, deployment: str) -> str:
        """Stream, capped: the autoscaler's recent decisions, each with its reason."""
        return self._tagged(deployment, "autoscale_decisions")

    def accepted_jobs(self, deployment: str) -> str:
        """Sorted set: the deployment's asynchronous jobs accepted and not finished (job id -> when accepted, epoch ms),
        at most its ``max_queued_jobs``. It lives with RQ's keys, in the jobs' Redis."""
        return self._tagged(deployment, "jobs")

    def accepted_jobs_pattern(self) -> str:
        """SCAN pattern matching every deployment's accepted-jobs set."""
        return f"{self.prefix}:{{*}}:jobs"

    def replica_control(self, deployment: str, replica_id: str) -> str:
        """Stream, capped, one per replica while it runs: what its callers tell it about requests it is serving
        (how far a stream's caller has read; later, cancellations). Made by the replica, deleted when it exits;
        callers add with NOMKSTREAM, so a gone replica's stream is never made again."""
        return self._tagged(deployment, f"control:{replica_id}")

    def cancelled(self, deployment: str) -> str:
        """Sorted set: entry ids of requests cancelled while a replica held them (entry id -> until when the mark is
        kept, epoch ms: the request's deadline and a margin), so that the reclaimer drops them instead of running them
        again if that replica dies. Trimmed as marks lapse, and lapses with the last one (scripts.CANCEL)."""
        return self._tagged(deployment, "cancelled")

    def idempotency(self, deployment: str, key: str, tenant: str = DEFAULT_TENANT) -> str:
        """Hash, with expiry: the run of one idempotency key of one tenant of the deployment (wire/idempotency.py
        says its fields): which request runs for it, and once it has run, its stored reply. Kept idempotency_ttl_s.
        Each tenant's keys are its own: another's same key names another record."""
        return self._tagged(deployment, f"idem{_of_tenant(tenant)}:{key}")

    def idempotency_waiters(self, deployment: str, key: str, tenant: str = DEFAULT_TENANT) -> str:
        """List, with the record's expiry: the callers waiting for the running request of one idempotency key (of
        one tenant), each a JSON ``[reply_to, tag, request id]``; whoever settles the run answers them."""
        return self._tagged(deployment, f"idem_waiters{_of_tenant(tenant)}:{key}")

    def idempotency_pattern(self, deployment: str) -> str:
        """SCAN pattern matching every idempotency record and waiters list of one deployment (for deletion)."""
        return self._tagged(deployment, "idem*")

    def cache_entry(self, deployment: str, digest: str) -> str:
        """Hash, with expiry: the run of identical requests of a deployment with a response cache, by their digest
        (wire/response_cache.py), and once it went well its reply (fields as an idempotency record's)."""
        return self._tagged(deployment, f"cache:{digest}")

    def cache_waiters(self, deployment: str, digest: str) -> str:
        """List: the callers waiting for the run of identical requests (as Keys.idempotency_waiters)."""
        return self._tagged(deployment, f"cache_waiters:{digest}")

    def shared_run(self, deployment: str, idem: str, cache: str, tenant: str = DEFAULT_TENANT) -> tuple[str, str]:
        """The record and waiters list of a request's shared run: of its idempotency key ``idem`` when it has one,
        else of its cache digest ``cache``."""
        if idem:
            return self.idempotency(deployment, idem, tenant), self.idempotency_waiters(deployment, idem, tenant)
        return self.cache_entry(deployment, cache), self.cache_waiters(deployment, cache)

    def cache_index(self, deployment: str) -> str:
        """Sorted set: digest -> when its reply was kept (epoch ms), to evict the oldest past ``max_entries``."""
        return self._tagged(deployment, "cache_index")

    def cache_pattern(self, deployment: str) -> str:
        """SCAN pattern matching every cache entry and waiters list of one deployment (for deletion)."""
        return self._tagged(deployment, "cache*")

    def tenant_bucket(self, deployment: str, tenant: str) -> str:
        """Hash, with expiry: a tenant's token bucket on the deployment (``tokens``, ``at``: epoch ms), written by the
        enqueue scripts; gone once it would be full again, which is what a missing bucket means."""
        return self._tagged(deployment, f"tenant_bucket:{tenant}")

    def tenant_held(self, deployment: str, tenant: str) -> str:
        """Sorted set: the tokens of a tenant's requests the deployment holds (queued or running), each scored by its
        request's deadline (epoch ms), when the tenant's ``max_queued`` bounds them (wire/tenants.py)."""
        return self._tagged(deployment, f"tenant_held:{tenant}")

    def tenant_pattern(self, deployment: str) -> str:
        """SCAN pattern matching every tenant bucket and held set of one deployment (for deletion)."""
        return self._tagged(deployment, "tenant_*")

    def tenant_labels(self, deployment: str) -> str:
        """Set: the tenants that have a label of their own in the deployment's metrics (at most TENANT_LABEL_CAP)."""
        return self._tagged(deployment, "tenant_labels")

    def limited_tenants(self, deployment: str) -> str:
        """Sorted set: tenant -> when its limits last refused one of its requests (epoch ms), trimmed by age."""
        return self._tagged(deployment, "limited_tenants")

    def logs(self, deployment: str) -> str:
        """Stream, capped: the output of the deployment's replicas, one entry per line (`streamserve logs`)."""
        return self._tagged(deployment, "logs")

    def deployment_keys(self, deployment: str) -> list[str]:
        """Every key that belongs to one deployment (for deletion)."""
        return [
            *self.request_streams(deployment).values(),
            self.replicas(deployment),
            self.heartbeats(deployment),
            self.heartbeat_times(deployment),
            self.heartbeat_news(deployment),
            self.dead_letters(deployment),
            self.untold_dead_letters(deployment),
            self.cancelled(deployment),
            self.cache_index(deployment),
            self.tenant_labels(deployment),
            self.limited_tenants(deployment),
            self.routed_replicas(deployment),
            self.model_room(deployment),
            self.model_backlog(deployment),
            self.metrics(deployment),
            self.metrics_history(deployment),
            self.autoscale_decisions(deployment),
            self.logs(deployment),
        ]
