"""What replicas ask of the host they run on: GPUs of their own, and CPUs and memory that should fit.

GPUs are handed out per replica through CUDA_VISIBLE_DEVICES, so two
replicas never share a device. CPUs and memory are not enforced locally
(on Kubernetes they become the pod's requests and limits); the scheduler
warns when the replicas it runs ask for more than the host has.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Iterable

from streamserve.wire.config import DeploymentConfig

logger = logging.getLogger(__name__)

# The variable CUDA (and PyTorch, TensorFlow, JAX) read to know which devices a process may use.
GPU_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
# What STREAMSERVE_GPUS may hold: device indexes or UUIDs, comma-separated ("" declares none).
GPU_LIST_RE = re.compile(r"^$|^[A-Za-z0-9:_-]+(,[A-Za-z0-9:_-]+)*$")
_NVIDIA_SMI_LINE = re.compile(r"^GPU (\d+):", re.MULTILINE)
NVIDIA_SMI_TIMEOUT_S = 10.0


def host_gpus(declared: str | None) -> tuple[str, ...]:
    """The host's GPU devices: ``declared`` (STREAMSERVE_GPUS) when set, else what ``nvidia-smi -L`` lists."""
    if declared is not None:
        return tuple(d for d in declared.split(",") if d)
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True
        ).stdout
    except FileNotFoundError:
        return ()
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning(
            "nvidia-smi -L failed (%s): no GPUs will be handed out; set STREAMSERVE_GPUS to declare them", exc
        )
        return ()
    return tuple(_NVIDIA_SMI_LINE.findall(listed))


class GpuAllocator:
    """The host's GPUs and which replica holds each; a replica gets whole devices or none."""

    def __init__(self, devices: Iterable[str] = ()) -> None:
        self.devices = tuple(devices)
        self._held: dict[str, tuple[str, ...]] = {}

    def free(self) -> list[str]:
        taken = {d for held in self._held.values() for d in held}
        return [d for d in self.devices if d not in taken]

    def take(self, replica_id: str, count: int) -> tuple[str, ...] | None:
        """``count`` free devices for the replica (what it holds already, if it holds some), or None."""
        if replica_id in self._held:
            return self._held[replica_id]
        free = self.free()
        if len(free) < count:
            return None
        self._held[replica_id] = tuple(free[:count])
        return self._held[replica_id]

    def hold(self, replica_id: str, devices: Iterable[str]) -> None:
        """Note devices a running replica already has (one a previous scheduler started)."""
        held = tuple(devices)
        if held:
            self._held[replica_id] = held

    def release(self, replica_id: str) -> None:
        self._held.pop(replica_id, None)

    def holds(self, replica_id: str) -> bool:
        """Whether the replica holds devices (stopping it would free some)."""
        return replica_id in self._held

    def shortage(self, count: int) -> str:
        """Why a replica waits, e.g. "needs 1 GPU, 0 free of 4"."""
        return f"needs {count} GPU{'s' if count != 1 else ''}, {len(self.free())} free of {len(self.devices)}"


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def overcommit(deployments: Iterable[DeploymentConfig], cpus: float, memory_bytes: int) -> list[str]:
    """What the replicas this host runs would ask for beyond what it has, one line per resource.

    Counts the most replicas each deployment may run here (``max_replicas``
    when autoscaled); externally scaled deployments run elsewhere and are left out.
    """
    local = [(d, _most_replicas(d)) for d in deployments if not d.external_scaler_enabled]
    want_cpus = sum(d.resources.cpus * n for d, n in local)
    want_memory = sum(d.resources.memory_bytes * n for d, n in local)
    problems = []
    if want_cpus > cpus:
        problems.append(f"the replicas ask for {want_cpus:g} CPUs in all, and this host has {cpus:g}")
    if want_memory > memory_bytes:
        problems.append(
            f"the replicas ask for {want_memory / 2**30:.1f} GiB of memory in all, "
            f"and this host has {memory_bytes / 2**30:.1f} GiB"
        )
    return problems


def _most_replicas(cfg: DeploymentConfig) -> int:
    auto = cfg.autoscaling_config
    return auto.max_replicas if auto is not None else cfg.wanted_replicas()
