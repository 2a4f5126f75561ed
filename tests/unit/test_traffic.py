"""Endpoints: the traffic policy, endpoint validation, and the checks on a whole desired state."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from streamserve.cli import main as cli
from streamserve.client.traffic import TrafficPolicy
from streamserve.wire.config import DeploymentConfig, EndpointConfig, desired_state_problems, parse_config
from streamserve.wire.errors import ConfigError


def endpoint(**fields: object) -> EndpointConfig:
    return EndpointConfig.model_validate({"name": "classify", "traffic": {"v1": 0.9, "v2": 0.1}, **fields})


def deployment(name: str, **fields: object) -> DeploymentConfig:
    return DeploymentConfig.model_validate({"name": name, "import_path": "examples.functions:noop", **fields})


def test_picks_follow_the_weights() -> None:
    policy = TrafficPolicy(endpoint(traffic={"v1": 9, "v2": 1, "off": 0}), random.Random(7))
    picks = Counter(policy.pick() for _ in range(20_000))
    assert set(picks) == {"v1", "v2"}  # weight 0: never
    assert 0.88 < picks["v1"] / 20_000 < 0.92


def test_an_idempotency_key_picks_the_same_deployment_every_time_and_keys_follow_the_weights() -> None:
    policy = TrafficPolicy(endpoint(traffic={"v1": 9, "v2": 1}), random.Random(7))
    other_process = TrafficPolicy(endpoint(traffic={"v1": 9, "v2": 1}), random.Random(8))
    for key in ("order-1", "order-2", "order-3"):
        assert len({policy.pick(key) for _ in range(50)} | {other_process.pick(key)}) == 1
    picks = Counter(policy.pick(f"key-{n}") for n in range(20_000))
    assert 0.88 < picks["v1"] / 20_000 < 0.92


def test_shadows_are_drawn_per_request_with_their_fraction() -> None:
    policy = TrafficPolicy(endpoint(shadow={"v3": 0.25, "never": 0.0, "always": 1.0}), random.Random(3))
    draws = [policy.shadows() for _ in range(10_000)]
    assert all("always" in d and "never" not in d for d in draws)
    assert 0.23 < sum("v3" in d for d in draws) / 10_000 < 0.27


def test_endpoint_route_defaults_to_its_name_and_null_means_client_only() -> None:
    assert endpoint().route_prefix == "/classify"
    assert endpoint(route_prefix=None).route_prefix is None
    assert endpoint().deployments == {"v1", "v2"}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"traffic": {}}, "needs at least one deployment"),
        ({"traffic": {"v1": 0}}, "add up to more than 0"),
        ({"traffic": {"v1": -1, "v2": 2}}, "must be finite, >= 0"),
        ({"traffic": {"v1": float("nan")}}, "traffic.v1: Input should be a finite number"),
        ({"traffic": {"Bad Name": 1}}, "'Bad Name' is not a valid name"),
        ({"shadow": {"v3": 1.5}}, "between 0 and 1"),
        ({"weights": {"v1": 1}}, "weights: unknown field"),
    ],
)
def test_bad_endpoints_name_the_field(fields: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match="endpoint 'classify' \\(endpoints\\[0\\]\\)") as info:
        parse_config({"endpoints": [{"name": "classify", "traffic": {"v1": 1}, **fields}]})
    assert expected in str(info.value)


def test_desired_state_problems() -> None:
    v1, v2 = deployment("v1"), deployment("v2", route_prefix="/classify")
    assert desired_state_problems({"v1": v1}, {"classify": endpoint(traffic={"v1": 1})}) == []
    assert desired_state_problems({"v1": v1}, {"classify": endpoint()}) == [
        "endpoint 'classify' sends to 'v2', which is not a deployment"
    ]
    assert desired_state_problems({}, {"classify": endpoint()}) == [
        "endpoint 'classify' sends to 'v1', 'v2', which are not deployments"
    ]
    assert desired_state_problems({"v1": v1, "v2": v2}, {"classify": endpoint()}) == [
        "route_prefix /classify is used by deployment 'v2' and endpoint 'classify'"
    ]
    clash = desired_state_problems({"v1": v1, "classify": deployment("classify", route_prefix=None)}, {})
    assert clash == []
    named_twice = desired_state_problems(
        {"v1": v1, "v2": deployment("v2"), "classify": deployment("classify", route_prefix=None)},
        {"classify": endpoint()},
    )
    assert named_twice == ["'classify' names both a deployment and an endpoint"]


def test_cli_traffic_arguments_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["traffic", "classify", "v1=0.9", "v2"]) == 2
    assert "'v2' is not NAME=weight" in capsys.readouterr().err
    assert cli.main(["traffic", "classify", "v1=1", "--shadow", "v3=lots"]) == 2
    assert "'v3=lots' is not NAME=shadow fraction" in capsys.readouterr().err
    assert cli.main(["traffic", "classify", "v1=1", "v1=2"]) == 2
    assert "'v1' is given twice" in capsys.readouterr().err
