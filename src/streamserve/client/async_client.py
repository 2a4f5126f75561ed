"""The producer side on asyncio: ``AsyncClient`` enqueues requests on a deployment's stream and awaits replies.

Each client process has one reply stream and one reader task that resolves
every in-flight request: no per-request connection, no polling. The class is
assembled from one mixin per job over one shared core (``core.ClientCore``):
``calls`` (call, submit, send, request), ``job_calls`` (submit_job, job),
``control_writes`` (deploy, scale, delete, set_traffic, wait_for_goal) and
``state_reads`` (status, ping, deployment(s), endpoints).
"""

from __future__ import annotations

from streamserve.client.calls import Calls
from streamserve.client.control_writes import ControlWrites
from streamserve.client.job_calls import JobCalls
from streamserve.client.state_reads import StateReads


class AsyncClient(Calls, JobCalls, ControlWrites, StateReads):
    """Calls deployments through Redis from an asyncio program.

    >>> async with AsyncClient("redis://localhost:6379") as client:
    ...     await client.call("echo", {"x": 1})
    """
