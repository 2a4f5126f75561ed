"""When a worker the scheduler does not own leaves by itself, and with what exit code (workers/departure.py)."""

from __future__ import annotations

from streamserve.wire.config import DeploymentConfig
from streamserve.workers.departure import Departure, DepartureRules


def config(external: bool = False, version: str | None = None, **extra: object) -> DeploymentConfig:
    fields = {"name": "echo", "import_path": "examples.echo:Echo", "external_scaler_enabled": external}
    return DeploymentConfig.model_validate({**fields, "version": version, **extra})


def test_a_pinned_worker_refuses_another_version_and_takes_its_own() -> None:
    assert DepartureRules("echo", None).refusal(config(version="v1")) == ""
    assert DepartureRules("echo", "v1").refusal(config(version="v1")) == ""
    at_code = config()
    assert DepartureRules("echo", at_code.code_version()).refusal(at_code) == ""
    assert "not v1 (--version)" in DepartureRules("echo", "v1").refusal(config(version="v2"))


def test_an_unhealthy_or_deleted_external_worker_exits_1_and_a_scheduled_replica_stays() -> None:
    rules = DepartureRules("echo", None)
    assert rules.when_unhealthy(config(), "slow") is None
    assert rules.when_deleted(config()) is None
    unhealthy = rules.when_unhealthy(config(external=True), "slow")
    assert unhealthy is not None and unhealthy.exit_code == 1 and "unhealthy (slow)" in unhealthy.why
    assert rules.when_deleted(config(external=True)) == Departure(1, "deployment 'echo' was deleted")


def test_a_live_change_or_a_scheduled_replica_serves_on() -> None:
    rules = DepartureRules("echo", None)
    assert rules.when_changed(config(True, user_config={"a": 1}), config(True, user_config={"a": 2})) is None
    assert rules.when_changed(config(version="v1"), config(version="v2")) is None  # the scheduler replaces it


def test_new_code_restarts_an_external_worker_on_it() -> None:
    new = config(True, version="v2")
    departure = DepartureRules("echo", None).when_changed(config(True, version="v1"), new)
    assert departure is not None and departure.exit_code == 0
    assert departure.restart_reason == f"deployment 'echo' changed its code (version {new.code_version()})"
    assert departure.why == departure.restart_reason + ": draining, then starting again on it"


def test_a_pinned_worker_exits_1_once_its_version_is_gone() -> None:
    departure = DepartureRules("echo", "v1").when_changed(config(True, version="v1"), config(True, version="v2"))
    assert departure == Departure(1, "deployment 'echo' moved on from version v1 (--version)")


def test_a_worker_no_longer_externally_scaled_leaves_to_the_scheduler() -> None:
    departure = DepartureRules("echo", None).when_changed(config(True, version="v1"), config(version="v2"))
    assert departure == Departure(0, "deployment 'echo' is no longer externally scaled")
