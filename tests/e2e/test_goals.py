"""Goals from Python: deploy, scale and delete return ids that wait_for_goal blocks on."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamserve import Client, GoalFailedError
from streamserve.wire.config import parse_config
from tests.harness.farm import Farm

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
