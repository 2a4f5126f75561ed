"""Goals from Python: deploy, scale and delete return ids that wait_for_goal blocks on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamserve import Client, GoalFailedError
from streamserve.wire.config import parse_config
from tests.harness.farm import Farm
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.e2e


def config(name: str, import_path: str, replicas: int = 1) -> object:
    return parse_config({"deployments": [{"name": name, "import_path": import_path, "num_replicas": replicas}]})


def test_deploy_scale_delete_are_goals(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        goals = client.deploy(config("goaly", "examples.functions:noop"))  # type: ignore[arg-type]
        done = client.wait_for_goal(goals["goaly"], timeout=60)
        assert done.status.value == "DONE"
        assert client.call("goaly", [1]) == [1]
        assert client.deploy(config("goaly", "examples.functions:noop")) == {}  # type: ignore[arg-type]

        scale_goal = client.scale("goaly", 2)
        assert scale_goal is not None
        client.wait_for_goal(scale_goal, timeout=60)
        assert next(s for s in client.status() if s.name == "goaly").running == 2

        client.wait_for_goal(client.delete("goaly"), timeout=60)
        assert all(s.name != "goaly" for s in client.status())


def test_failed_goal_says_why(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        goals = client.deploy(config("nomodule", "no_such_module:thing"))  # type: ignore[arg-type]
        with pytest.raises(GoalFailedError, match="cannot import module 'no_such_module'"):
            client.wait_for_goal(goals["nomodule"], timeout=60)
        client.wait_for_goal(client.delete("nomodule"), timeout=60)


def test_a_goal_written_while_its_deployment_is_unhealthy_is_judged_by_its_own_starts(
    farm: Farm, tmp_path: Path
) -> None:
    """The failures that made a deployment UNHEALTHY before a goal was written do not fail it: mended meanwhile,
    a scale's goal is DONE once its replicas run (it was FAILED at once, with the old reason)."""
    flag = tmp_path / "flag"
    cfg = {"name": "mended", "import_path": "tests.deployments:NeedsFile", "init_kwargs": {"path": str(flag)}}
    with Client(farm.effective_redis_url) as client:
        goals = client.deploy(parse_config({"deployments": [cfg]}))
        with pytest.raises(GoalFailedError, match="is missing"):
            client.wait_for_goal(goals["mended"], timeout=60)
        flag.touch()
        scale_goal = client.scale("mended", 2)
        assert scale_goal is not None
        assert client.wait_for_goal(scale_goal, timeout=90).status.value == "DONE"
        assert next(s for s in client.status() if s.name == "mended").running == 2
        client.wait_for_goal(client.delete("mended"), timeout=60)


def test_a_user_config_that_reconfigure_refuses_fails_its_goal_and_the_old_one_keeps_serving(farm: Farm) -> None:
    """A live user_config change is DONE once every replica runs it; one that its reconfigure() refuses fails the
    goal (deploy --wait exits 1) and makes the deployment UNHEALTHY, saying why, while the replicas serve with the
    one before. It was reported DONE, and status said HEALTHY."""

    def picky(tag: str) -> Any:
        cfg = {
            "name": "picky",
            "import_path": "tests.deployments:Picky",
            "num_replicas": 2,
            "user_config": {"tag": tag},
        }
        return parse_config({"deployments": [cfg]})

    def health() -> tuple[str, str]:
        status = next(s for s in client.status() if s.name == "picky")
        return str(status.health), status.message

    with Client(farm.effective_redis_url) as client:
        client.wait_for_goal(client.deploy(picky("good"))["picky"], timeout=60)
        with pytest.raises(GoalFailedError, match=r"refused the new user_config \(ValueError: the tag 'bad' is not"):
            client.wait_for_goal(client.deploy(picky("bad"))["picky"], timeout=60)
        assert health()[0] == "UNHEALTHY" and "it runs with the one before" in health()[1], health()
        assert {client.call("picky", n)["tag"] for n in range(8)} == {"good"}
        # Mended: DONE once both replicas run it, and not before.
        assert client.wait_for_goal(client.deploy(picky("slowly"))["picky"], timeout=60).status.value == "DONE"
        assert {client.call("picky", n)["tag"] for n in range(8)} == {"slowly"}
        wait_for(lambda: health() == ("HEALTHY", ""), 30, lambda: str(health()))
        client.wait_for_goal(client.delete("picky"), timeout=60)


def test_superseded_goal_is_cancelled(farm: Farm) -> None:
    with Client(farm.effective_redis_url) as client:
        first = client.deploy(config("twice", "examples.functions:noop", replicas=1))["twice"]  # type: ignore[arg-type]
        second = client.scale("twice", 2)
        assert second is not None
        with pytest.raises(GoalFailedError, match="cancelled: superseded by a later change"):
            client.wait_for_goal(first, timeout=60)
        client.wait_for_goal(second, timeout=60)
        client.wait_for_goal(client.delete("twice"), timeout=60)


def test_admin_http_deploy_and_wait_for_the_goal(farm: Farm) -> None:
    import httpx

    cfg = {"deployments": [{"name": "viahttp", "import_path": "examples.functions:noop", "route_prefix": "/viahttp"}]}
    refused = httpx.post(f"{farm.base_url}/-/deploy", json=cfg, timeout=10)
    assert refused.status_code == 401 and ".streamserve/api_key" in refused.json()["message"]
    admin = farm.admin_headers()  # the token `up` made, in its data directory
    goal_id = httpx.post(f"{farm.base_url}/-/deploy", json=cfg, headers=admin, timeout=10).json()["goals"]["viahttp"]
    goal = httpx.get(f"{farm.base_url}/-/goals/{goal_id}", params={"wait": 30}, timeout=40).json()
    assert goal["status"] == "DONE"
    assert farm.post("/viahttp", {"a": 1}).json() == {"a": 1}
    gone = httpx.delete(f"{farm.base_url}/-/deployments/viahttp", headers=admin, timeout=10).json()["goal_id"]
    assert httpx.get(f"{farm.base_url}/-/goals/{gone}", params={"wait": 30}, timeout=40).json()["status"] == "DONE"


def test_requests_a_rollout_kills_at_the_drain_deadline_run_again_uncharged(farm: Farm) -> None:
    """Replicas of the old version still running a request at graceful_shutdown_timeout_s are killed: what they ran
    is queued again as it was, not charged as a dead replica's (with max_delivery_attempts 1 each was a
    DeadLetterError, with more it was run alone, one at a time)."""

    def sleepy(version: str) -> Any:
        cfg = {
            "name": "drained",
            "import_path": "examples.sleepy:Sleepy",
            "num_replicas": 1,
            "max_ongoing_requests": 4,
            "graceful_shutdown_timeout_s": 1,
            "max_delivery_attempts": 1,
            "request_timeout_s": 60,
            "version": version,
        }
        return parse_config({"deployments": [cfg]})

    with Client(farm.effective_redis_url) as client:
        client.wait_for_goal(client.deploy(sleepy("1"))["drained"], timeout=60)
        calls = [client.submit("drained", {"seconds": 4}) for _ in range(3)]
        wait_for(lambda: next(s for s in client.status() if s.name == "drained").in_flight == 3, 30, "not running")
        client.wait_for_goal(client.deploy(sleepy("2"))["drained"], timeout=60)
        assert [call.result(timeout=60) for call in calls] == [{"slept": 4}] * 3
        assert next(s for s in client.status() if s.name == "drained").dead_letters == 0
        client.wait_for_goal(client.delete("drained"), timeout=60)
