"""Every count and size in a config has a maximum (wire/limits.py), named in the error with the setting that raises
it; a stored config is read back whatever the maxima are now (issue 27, defect 4)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bench.scale_sim import DEPLOYMENTS, SIZES
from streamserve.cli import main as cli
from streamserve.runtime.settings import Settings
from streamserve.wire.config import MAX_TIMEOUT_S, AppConfig, DeploymentConfig, load_config, parse_config
from streamserve.wire.errors import ConfigError
from streamserve.wire.limits import DEFAULT_LIMITS, SETTING, ConfigLimits
from tests.harness.paths import ROOT

D = DEFAULT_LIMITS


def dep(**fields: object) -> dict[str, object]:
    return {"name": "n", "import_path": "examples.functions:add", **fields}


def auto(**fields: object) -> dict[str, object]:
    return dep(autoscaling_config=fields)


# (the deployment's fields at the maximum, the same one past it, the limit, the field as the error names it)
CASES: list[tuple[dict[str, object], dict[str, object], str, str]] = [
    (dep(num_replicas=D.num_replicas), dep(num_replicas=D.num_replicas + 1), "num_replicas", "num_replicas"),
    (
        auto(min_replicas=D.num_replicas, max_replicas=D.num_replicas),
        auto(max_replicas=D.num_replicas + 1),
        "num_replicas",
        "autoscaling_config.max_replicas",
    ),
    (
        auto(min_replicas=D.num_replicas, max_replicas=D.num_replicas),
        auto(min_replicas=D.num_replicas + 1, max_replicas=D.num_replicas + 1),
        "num_replicas",
        "autoscaling_config.min_replicas",
    ),
    (
        auto(target_ongoing_requests=D.max_ongoing_requests),
        auto(target_ongoing_requests=D.max_ongoing_requests + 0.5),
        "max_ongoing_requests",
        "autoscaling_config.target_ongoing_requests",
    ),
    *[
        (dep(**{field: getattr(D, field)}), dep(**{field: getattr(D, field) + 1}), field, field)
        for field in (
            "max_ongoing_requests",
            "max_queued_requests",
            "max_queued_jobs",
            "max_delivery_attempts",
            "max_response_bytes",
            "max_unread_chunks",
        )
    ],
    (dep(resources={"cpus": float(D.cpus)}), dep(resources={"cpus": D.cpus + 0.5}), "cpus", "resources.cpus"),
    (dep(resources={"gpus": D.gpus}), dep(resources={"gpus": D.gpus + 1}), "gpus", "resources.gpus"),
    (dep(resources={"memory": "1024Ti"}), dep(resources={"memory": "1025Ti"}), "memory", "resources.memory"),
    (dep(resources={"memory": D.memory}), dep(resources={"memory": D.memory + 1}), "memory", "resources.memory"),
    (
        dep(user_config="x" * (D.config_bytes - 1000)),
        dep(user_config="x" * D.config_bytes),
        "config_bytes",
        "the deployment as JSON",
    ),
]


@pytest.mark.parametrize(("at_max", "past_max", "limit", "field"), CASES, ids=[c[3] + "-" + c[2] for c in CASES])
def test_a_value_past_its_maximum_is_refused_naming_field_value_maximum_and_setting(
    at_max: dict[str, object], past_max: dict[str, object], limit: str, field: str
) -> None:
    parse_config({"deployments": [at_max]})  # the maximum itself is allowed
    with pytest.raises(ConfigError) as info:
        parse_config({"deployments": [past_max]}, "request body")
    message = str(info.value)
    assert f"deployment 'n' (deployments[0]): {field}" in message
    assert f"is above the maximum, {getattr(D, limit)}" in message
    assert f"{SETTING}={limit}=N" in message


def test_the_original_reproduction_is_refused() -> None:
    """The issue's body: 2**64 - 1 replicas, which the scheduler then tried to record one by one."""
    body = {"deployments": [dep(num_replicas=18446744073709551615)]}
    with pytest.raises(ConfigError, match=r"num_replicas: 18446744073709551615 is above the maximum, 1024"):
        parse_config(body, "request body")


def test_a_config_built_in_python_is_checked_against_the_defaults() -> None:
    """What a client's user builds (``AppConfig.model_validate`` for ``client.deploy``) is bounded too."""
    with pytest.raises(ValidationError, match=r"num_replicas\n.*is above the maximum, 1024"):
        AppConfig.model_validate({"deployments": [dep(num_replicas=5000)]})


@pytest.mark.parametrize("kind", ["deployments", "endpoints"])
def test_a_config_holds_at_most_so_many_deployments_and_endpoints(kind: str) -> None:
    limits = ConfigLimits(deployments=3, endpoints=3)
    items = [{"name": f"d{i}", "import_path": "m:f"} for i in range(4)]
    if kind == "endpoints":
        items = [{"name": f"e{i}", "traffic": {"d0": 1}} for i in range(4)]
    with pytest.raises(ConfigError, match=rf"{kind}: 4 is above the maximum, 3 .*{kind}=N"):
        parse_config({kind: items}, limits=limits)


def test_an_endpoint_names_at_most_so_many_deployments() -> None:
    limits = ConfigLimits(deployments=2)
    endpoint = {"name": "e", "traffic": {"a": 1, "b": 1, "c": 1}}
    with pytest.raises(ConfigError, match=r"traffic: 3 names is above the maximum, 2"):
        parse_config({"endpoints": [endpoint]}, limits=limits)


def test_weights_that_add_up_to_infinity_are_refused() -> None:
    endpoint = {"name": "e", "traffic": {"a": 1e308, "b": 1e308}}
    with pytest.raises(ConfigError, match="add up to more than 0 \\(and less than infinity\\)"):
        parse_config({"endpoints": [endpoint]})


@pytest.mark.parametrize(
    "fields",
    [
        {"graceful_shutdown_timeout_s": MAX_TIMEOUT_S + 1},
        {"health_check_period_s": MAX_TIMEOUT_S + 1},
        {"health_check_timeout_s": MAX_TIMEOUT_S + 1},
        {"autoscaling_config": {"upscale_delay_s": MAX_TIMEOUT_S + 1}},
        {"autoscaling_config": {"downscale_delay_s": MAX_TIMEOUT_S + 1}},
    ],
)
def test_every_duration_is_at_most_a_week(fields: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="is more than a week"):
        parse_config({"deployments": [dep(**fields)]})
    at_max = {k: ({kk: MAX_TIMEOUT_S for kk in v} if isinstance(v, dict) else MAX_TIMEOUT_S) for k, v in fields.items()}
    parse_config({"deployments": [dep(**at_max)]})


def test_what_json_cannot_store_is_a_config_error_not_a_crash() -> None:
    with pytest.raises(ConfigError, match="user_config cannot be stored as JSON: Integer exceeds 64-bit range"):
        parse_config({"deployments": [dep(user_config=[2**70])]})
    # A memory size of many digits went through a float: infinity, and int() of it raised OverflowError.
    with pytest.raises(ConfigError, match=r"resources.memory: '9{400}Ti' .* is above the maximum"):
        parse_config({"deployments": [dep(resources={"memory": "9" * 400 + "Ti"})]})


def test_a_raised_maximum_allows_more_and_a_lowered_one_less() -> None:
    big = {"deployments": [dep(num_replicas=4096)]}
    with pytest.raises(ConfigError):
        parse_config(big)
    assert parse_config(big, limits=ConfigLimits.parse("num_replicas=4096")).deployments[0].num_replicas == 4096
    with pytest.raises(ConfigError, match="max_ongoing_requests: 8 is above the maximum, 4"):
        parse_config({"deployments": [dep()]}, limits=ConfigLimits.parse("max_ongoing_requests=4"))


def test_a_stored_config_reads_back_whatever_the_maxima_are_now() -> None:
    """Raised on the machine that wrote it, or lowered since: the farm's readers must still read it."""
    written = parse_config({"deployments": [dep(num_replicas=4096)]}, limits=ConfigLimits(num_replicas=4096))
    assert DeploymentConfig.from_json(written.deployments[0].to_json()).num_replicas == 4096


def test_the_setting_is_read_from_the_environment_and_handed_to_children(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SETTING, "num_replicas=4096, max_queued_requests=2_000_000")
    settings = Settings()
    assert settings.config_limit_values == dataclasses.replace(D, num_replicas=4096, max_queued_requests=2_000_000)
    assert settings.to_env()[SETTING] == "num_replicas=4096, max_queued_requests=2_000_000"
    assert "STREAMSERVE_" + "config_limits".upper() == SETTING  # the one name, as Settings derives it


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("replicas=5", "'replicas=5' is not NAME=N with NAME one of the limits: cache_entries, config_bytes"),
        ("num_replicas=lots", "num_replicas='lots': the limit must be a whole number"),
        ("num_replicas=0", "num_replicas=0: the limit must be at least 1"),
        ("gpus=1,gpus=2", "gpus is given twice"),
    ],
)
def test_a_bad_setting_exits_2_saying_why(
    value: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, value)
    assert cli.main(["deploy", str(ROOT / "examples" / "streamserve.yaml")]) == 2
    assert f"error: {SETTING}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["deploy", "up"])
def test_the_cli_exits_2_naming_the_field_before_it_connects_or_starts_anything(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(tests/unit's conftest fails a test that opens a socket or starts a process.)"""
    config = tmp_path / "farm.yaml"
    config.write_text("deployments:\n  - name: n\n    import_path: examples.functions:add\n    num_replicas: 5000\n")
    assert cli.main([command, str(config)]) == 2
    err = capsys.readouterr().err
    assert "deployment 'n' (deployments[0]): num_replicas: 5000 is above the maximum, 1024" in err
    assert f"{SETTING}=num_replicas=N" in err


def test_cli_deploy_takes_the_raised_maximum(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "farm.yaml"
    config.write_text("deployments:\n  - name: n\n    import_path: examples.functions:add\n    num_replicas: 5000\n")
    with pytest.raises(ConfigError):
        load_config(config)
    monkeypatch.setenv(SETTING, "num_replicas=5000")
    checked: list[Any] = []
    monkeypatch.setattr(
        "streamserve.cli.writes.with_stores", lambda settings, fn: checked.append(settings.config_limit_values) or 0
    )
    assert cli.main(["deploy", str(config)]) == 0  # the file passed, and the write was handed on
    assert checked == [ConfigLimits(num_replicas=5000)]


def test_the_examples_and_the_benches_fit_the_defaults() -> None:
    """The defaults are generous: every shipped config loads, and so do the scheduler bench's sizes."""
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        if "deployments:" in path.read_text():
            load_config(path)
    assert max(SIZES) <= D.num_replicas and D.deployments >= DEPLOYMENTS


def test_every_limit_is_documented_with_its_default() -> None:
    """docs/configuration.md lists each maximum under its name with its default, as ConfigLimits defines it."""
    docs = (ROOT / "docs" / "configuration.md").read_text()
    for field in dataclasses.fields(ConfigLimits):
        row = re.search(rf"^\| `{field.name}` \| ([^|]+) \|", docs, re.MULTILINE)
        assert row is not None, f"docs/configuration.md has no row for the limit {field.name}"
        shown = row.group(1).replace(",", "")
        assert str(field.default) in shown, f"{field.name}: the docs say {row.group(1)}, not {field.default}"
