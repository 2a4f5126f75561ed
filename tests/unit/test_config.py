from __future__ import annotations

from pathlib import Path

import pytest

from streamserve.cli import main as cli
from streamserve.wire.config import (
    MAX_PROBLEMS_SHOWN,
    AppConfig,
    DeploymentConfig,
    EndpointConfig,
    load_config,
    parse_config,
)
from streamserve.wire.errors import ConfigError, ProtocolError
from tests.harness.paths import ROOT


def dep(**fields: object) -> dict[str, object]:
    return {"name": "echo", "import_path": "examples.echo:Echo", **fields}


def test_example_config_loads() -> None:
    app = load_config(ROOT / "examples" / "streamserve.yaml")
    names = [d.name for d in app.deployments]
    assert "echo" in names
    echo = next(d for d in app.deployments if d.name == "echo")
    assert echo.route_prefix == "/echo"
    assert echo.wanted_replicas() == 2


def test_defaults() -> None:
    cfg = DeploymentConfig.model_validate(dep())
    assert cfg.route_prefix == "/echo"  # absent means /<name>
    assert cfg.wanted_replicas() == 1
    assert DeploymentConfig.model_validate(dep(route_prefix=None)).route_prefix is None  # explicit null: client only


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"replicas": 2}, "deployment 'echo' (deployments[0]): replicas: unknown field"),
        ({"tenant_limit": {}}, "tenant_limit: unknown field (did you mean 'tenant_limits'?)"),
        ({"tenant_limits": {"default": {"burts": 2}}}, "burts: unknown field (did you mean 'burst'?)"),
        # A field of the mapping it is in: min_replicas is autoscaling_config's, not a deployment's.
        ({"min_replica": 1}, "min_replica: unknown field (did you mean 'num_replicas'?)"),
        ({"autoscaling_config": {"min_replica": 1}}, "min_replica: unknown field (did you mean 'min_replicas'?)"),
        ({"response_cache": {"tll_s": 1}}, "response_cache.tll_s: unknown field (did you mean 'ttl_s'?)"),
        # PyYAML reads 1e3 (no dot) as text: the message says so, and how to write it.
        ({"request_timeout_s": "1e3"}, "a valid number, got the text '1e3' (YAML reads a number in e-notation"),
        ({"max_queued_requests": "1e3"}, "a valid integer, got the text '1e3' (YAML reads"),
        ({"name": "Bad Name"}, "(deployments[0]): name: 'Bad Name' is not a valid name"),
        ({"import_path": "examples.echo"}, "import_path: 'examples.echo' must look like 'package.module:attribute'"),
        ({"num_replicas": -1}, "num_replicas: Input should be greater than or equal to 0"),
        ({"max_ongoing_requests": 0}, "max_ongoing_requests: Input should be greater than or equal to 1"),
        ({"route_prefix": "echo"}, "route_prefix: 'echo' must start with '/'"),
        ({"route_prefix": "/-/admin"}, "is reserved for the gateway's own routes"),
        # Named so, its default route is reserved: the message says where the route came from.
        ({"name": "metrics"}, "'/metrics' is reserved for the gateway's own routes (a deployment's route is /<its"),
        ({"num_replicas": 1, "autoscaling_config": {"max_replicas": 2}}, "set num_replicas or autoscaling_config"),
        ({"autoscaling_config": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas (3) is above max_replicas (2)"),
        # YAML's .inf has no JSON form: accepted, it was stored as null and broke every reader of the config.
        ({"request_timeout_s": float("inf")}, "request_timeout_s: Input should be a finite number"),
        ({"request_timeout_s": 1e300}, "request_timeout_s: Input should be less than or equal to 604800"),
        ({"autoscaling_config": {"downscale_delay_s": float("inf")}}, "downscale_delay_s: Input should be a finite"),
        ({"autoscaling_config": {"target_ongoing_requests": float("nan")}}, "target_ongoing_requests: Input should"),
        # Numbers are strict: YAML's `true`, a quoted "4" or 4.0 deployed as 1, 4 and 4 replicas.
        ({"num_replicas": True}, "num_replicas: Input should be a valid integer"),
        ({"num_replicas": "4"}, "num_replicas: Input should be a valid integer"),
        ({"max_ongoing_requests": 4.0}, "max_ongoing_requests: Input should be a valid integer"),
        ({"request_timeout_s": "5"}, "request_timeout_s: Input should be a valid number"),
        ({"autoscaling_config": {"max_replicas": True}}, "max_replicas: Input should be a valid integer"),
        ({"response_cache": {"max_entries": "10"}}, "max_entries: Input should be a valid integer"),
    ],
)
def test_errors_name_the_deployment_and_field(fields: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"deployments": [dep(**fields)]}, "x.yaml")
    assert expected in str(info.value)
    assert str(info.value).startswith("x.yaml:")


def test_an_error_lists_the_first_problems_and_counts_the_rest() -> None:
    """A body of 200,000 unknown fields (an admin write) held the gateway's loop 25 s, each one described."""
    with pytest.raises(ConfigError) as info:
        parse_config({"deployments": [dep(**{f"k{i}": 1 for i in range(5000)})]}, "x.yaml")
    lines = str(info.value).splitlines()
    assert lines[-1] == f"... and {5000 - MAX_PROBLEMS_SHOWN} more problems"
    assert len([line for line in lines if "unknown field" in line]) == MAX_PROBLEMS_SHOWN


def test_a_traffic_weight_is_a_number() -> None:
    endpoint = {"name": "split", "traffic": {"echo": True}}
    with pytest.raises(ConfigError, match=r"traffic.echo: Input should be a valid number"):
        parse_config({"deployments": [dep()], "endpoints": [endpoint]}, "x.yaml")
    assert parse_config({"deployments": [dep()], "endpoints": [{"name": "split", "traffic": {"echo": 1}}]})


def test_duplicate_names_and_routes() -> None:
    with pytest.raises(ConfigError, match="names used more than once: echo"):
        parse_config({"deployments": [dep(), dep(route_prefix="/other")]})
    with pytest.raises(ConfigError, match="route_prefix used more than once: /x"):
        parse_config({"deployments": [dep(route_prefix="/x"), dep(name="b", route_prefix="/x")]})


def test_not_a_mapping_and_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_config(["a"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"deployments: []\n\xff\xfe")
    with pytest.raises(ConfigError, match=r"binary\.yaml is not UTF-8 text \(YAML is\): byte 0xff at offset 16"):
        load_config(binary)  # (a UnicodeDecodeError's traceback, exit 1, from deploy, up and manifests)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "deployments:\n  - {name: a, import_path: 'm:f'}\ndeployments:\n  - {name: b, import_path: 'm:f'}\n",
            "line 3, column 1: not valid YAML: 'deployments' is given twice (first on line 1)",
        ),
        (
            "deployments:\n  - name: a\n    import_path: m:f\n    num_replicas: 1\n    num_replicas: 3\n",
            "line 5, column 5: not valid YAML: 'num_replicas' is given twice (first on line 4)",
        ),
        ("deployments: [\n", "line 2, column 1: not valid YAML: while parsing a flow node expected the node content"),
    ],
)
def test_a_key_given_twice_is_an_error_naming_the_file_and_line(tmp_path: Path, text: str, error: str) -> None:
    """PyYAML keeps the last of two equal keys: a second 'deployments:' dropped the first one's deployments."""
    config = tmp_path / "twice.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_config(config)
    assert str(raised.value).startswith(f"{config}, {error}"), raised.value


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    config = tmp_path / "merge.yaml"
    config.write_text("deployments:\n  - &a {name: a, import_path: 'm:f'}\n  - <<: *a\n    name: b\n")
    assert [(d.name, d.import_path) for d in load_config(config).deployments] == [("a", "m:f"), ("b", "m:f")]


def test_code_version_ignores_live_fields() -> None:
    base = DeploymentConfig.model_validate(dep())
    configured = DeploymentConfig.model_validate(dep(user_config={"a": 1}))
    assert configured.code_version() == DeploymentConfig.model_validate(dep(user_config={"a": 2})).code_version()
    # Adding or removing one restarts: a replica never calls reconfigure() without one, nor can undo one.
    assert base.code_version() != configured.code_version()
    assert base.code_version() == DeploymentConfig.model_validate(dep(max_ongoing_requests=3)).code_version()
    assert base.code_version() != DeploymentConfig.model_validate(dep(version="2")).code_version()
    assert base.code_version() != DeploymentConfig.model_validate(dep(init_kwargs={"greeting": "x"})).code_version()


def test_an_unreadable_stored_config_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="stored deployment config is unreadable"):
        DeploymentConfig.from_json(b'{"name": "echo", "import_path": "examples.echo:Echo", "request_timeout_s": null}')
    with pytest.raises(ProtocolError, match="stored endpoint config is unreadable"):
        EndpointConfig.from_json(b"not json")


def test_json_round_trip() -> None:
    cfg = DeploymentConfig.model_validate(dep(user_config={"k": [1, 2]}, autoscaling_config={"max_replicas": 3}))
    assert DeploymentConfig.from_json(cfg.to_json()) == cfg
    assert AppConfig.model_validate({"deployments": [cfg.model_dump()]}).deployments[0] == cfg


def test_cli_deploy_with_bad_config_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments:\n  - name: echo\n    import_path: examples.echo:Echo\n    num_replicas: -2\n")
    assert cli.main(["deploy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "deployment 'echo' (deployments[0]): num_replicas" in err


@pytest.mark.parametrize("scaling", [{"num_replicas": 2}, {"autoscaling_config": {"max_replicas": 3}}])
def test_an_externally_scaled_deployment_takes_no_replica_count(scaling: dict[str, object]) -> None:
    data = {"deployments": [{"name": "ext", "import_path": "m:f", "external_scaler_enabled": True, **scaling}]}
    with pytest.raises(ConfigError, match="external_scaler_enabled: its replicas are started outside streamserve"):
        parse_config(data)
