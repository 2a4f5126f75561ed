"""When a worker the scheduler does not own leaves by itself, and with what exit code.

The scheduler stops the replicas it started. A worker started by something
else (Kubernetes, systemd, a hand at a terminal) for an externally scaled
deployment, or pinned to one version (``--version``), has nobody to stop it:
it watches its deployment and leaves on its own. Exit code 1 tells whatever
runs it that something is wrong (start it again, or stop starting it); 0 that
it left as it should.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamserve.wire.config import DeploymentConfig


@dataclass(frozen=True, slots=True)
class Departure:
    """A replica's decision to stop reading, drain and exit."""

    exit_code: int
    why: str  # logged at WARNING when it leaves
    # Set when an externally started worker should run again as a new process on the deployment's new code.
    restart_reason: str = ""
    # The longest its drain may take (shortened when nobody is left to answer the requests it holds).
    drain_limit_s: float = math.inf
    # Its `streamserve up` died: its Redis most likely too, so its way out tries Redis once per step, briefly.
    farm_gone: bool = False


class DepartureRules:
    """The rules for one worker of deployment ``name``, pinned to ``pinned_version`` (None: to no version)."""

    def __init__(self, name: str, pinned_version: str | None) -> None:
        self._name = name
        self._pinned_version = pinned_version

    def refusal(self, cfg: DeploymentConfig) -> str:
        """Why a worker pinned to another version must not start on ``cfg`` ("" when it may)."""
        if self._pinned_version is None or _is_at(cfg, self._pinned_version):
            return ""
        return (
            f"deployment {self._name!r} is at version {cfg.version or cfg.code_version()}, "
            f"not {self._pinned_version} (--version); this worker will not serve it"
        )

    def when_unhealthy(self, cfg: DeploymentConfig, problem: str) -> Departure | None:
        """An externally scaled worker whose check failed has no scheduler to replace it: it exits 1, for whatever
        runs it to start it again. Any other replica stays, reports UNHEALTHY, and is replaced by its scheduler."""
        if not cfg.external_scaler_enabled:
            return None
        return Departure(1, f"unhealthy ({problem}): exiting, for its supervisor to start it again")

    def when_deleted(self, cfg: DeploymentConfig) -> Departure | None:
        """The deployment is gone: an externally scaled worker exits 1 (otherwise the scheduler stops it)."""
        if not cfg.external_scaler_enabled:
            return None
        return Departure(1, f"deployment {self._name!r} was deleted")

    def when_changed(self, old: DeploymentConfig, new: DeploymentConfig) -> Departure | None:
        """The deployment's code changed under an externally started worker (it was or is externally scaled): it
        exits 1 once past its pinned version, runs again on the new code while still externally scaled, and
        otherwise leaves to the scheduler's own replicas. None: it serves on (a live change, or none)."""
        if new.code_version() == old.code_version() or not (old.external_scaler_enabled or new.external_scaler_enabled):
            return None
        if self._pinned_version is not None and not _is_at(new, self._pinned_version):
            return Departure(1, f"deployment {self._name!r} moved on from version {self._pinned_version} (--version)")
        if new.external_scaler_enabled:
            reason = f"deployment {self._name!r} changed its code (version {new.code_version()})"
            return Departure(0, reason + ": draining, then starting again on it", restart_reason=reason)
        return Departure(0, f"deployment {self._name!r} is no longer externally scaled")


def _is_at(cfg: DeploymentConfig, version: str) -> bool:
    """Whether a deployment is at ``version``: its declared ``version`` or its code version."""
    return version in (cfg.version, cfg.code_version())
