"""Tenants as data: names, the API keys file, the limits in a deployment's config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamserve.runtime.settings import Settings
from streamserve.wire.config import DeploymentConfig, TenantLimitConfig, parse_config
from streamserve.wire.errors import BadRequestError, ConfigError
from streamserve.wire.tenants import DEFAULT_TENANT, TenantKeys, check_tenant, tenant_of

KEY_A = "a" * 32
KEY_B = "b-" + "x" * 30


@pytest.mark.parametrize("name", ["acme", "A1", "team.one", "x_y-z", "t" * 64])
def test_a_tenant_is_a_short_identifier(name: str) -> None:
    assert check_tenant(name) == name


@pytest.mark.parametrize("name", ["", "-a", "a b", "a|b", "t" * 65, "caf\u00e9", "a\nb"])
def test_anything_else_is_a_bad_request(name: str) -> None:
    with pytest.raises(BadRequestError, match="is not a tenant name: 1-64 of A-Z a-z 0-9"):
        check_tenant(name)


@pytest.mark.parametrize("name", [5, b"acme", ["acme"]])
def test_a_tenant_of_another_type_is_a_bad_request_too(name: object) -> None:
    with pytest.raises(BadRequestError, match="is not a tenant name: 1-64 of A-Z a-z 0-9"):
        tenant_of(name)  # type: ignore[arg-type]


def test_no_tenant_is_the_default_one() -> None:
    assert tenant_of(None) == DEFAULT_TENANT == "default"


def test_the_keys_file_maps_keys_to_tenants_and_keeps_only_digests() -> None:
    keys = TenantKeys.parse(f"# who may call\n{KEY_A} acme\n\n  {KEY_B}   globex  # since May\n", "keys.txt")
    assert keys.tenant_of(KEY_A) == "acme"
    assert keys.tenant_of(KEY_B) == "globex"
    assert keys.tenant_of("a" * 31) is None
    assert KEY_A not in repr(vars(keys))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (f"{KEY_A}\n", "keys.txt, line 1: expected 'KEY TENANT', got 1 field"),
        (f"{KEY_A} acme extra\n", "line 1: expected 'KEY TENANT', got 3 field"),
        (f"{KEY_A} 'acme'\n", "line 1: \"'acme'\" is not a tenant name"),
        ("short acme\n", "line 1: a key must be at least 16 characters"),
        (f"{KEY_A} acme\n{KEY_A} other\n", "line 2: this key is given twice"),
        ("# nothing\n\n", "no 'KEY TENANT' line: every traffic request would be refused"),
        ("3f9c2a7d5e8b41c6a0d2f7e9b3c5é1d8 acme\n", "line 1: a key is ASCII letters, digits and"),
        ("3f9c2a7d5e8b41c6\x00a0d2f7e9b3c5a1d8 acme\n", "line 1: a key is ASCII letters"),
    ],
)
def test_a_keys_file_that_is_not_right_is_a_config_error_naming_the_line(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        TenantKeys.parse(text, "keys.txt")


def test_a_keys_file_saved_with_a_bom_and_crlf_lines_reads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_bytes(f"\ufeff{KEY_A} acme\r\n{KEY_B}\tglobex\r\n".encode())
    keys = Settings(tenant_keys=str(path)).tenant_key_map()
    assert keys is not None and keys.tenant_of(KEY_A) == "acme" and keys.tenant_of(KEY_B) == "globex"


def test_a_tenant_keys_variable_set_empty_is_an_error_not_no_keys() -> None:
    with pytest.raises(ConfigError, match="STREAMSERVE_TENANT_KEYS is set but empty"):
        Settings(tenant_keys=" ").tenant_key_map()


def test_limits_fall_back_to_default_and_the_bucket_to_the_rate() -> None:
    cfg = DeploymentConfig(
        name="d",
        import_path="m:f",
        tenant_limits={"default": {"requests_per_s": 2.5, "max_queued": 10}, "gold": {"requests_per_s": 200}},
    )
    assert cfg.tenant_limit("gold") == TenantLimitConfig(requests_per_s=200)
    assert cfg.tenant_limit("anyone") == cfg.tenant_limit("default")
    spec = cfg.tenant_limits["default"].spec(123)
    assert (spec.rate, spec.burst, spec.max_held, spec.deadline_ms) == (2.5, 3, 10, 123)
    assert spec.token and cfg.tenant_limits["gold"].spec(1).token == ""  # a token only when held requests count
    assert DeploymentConfig(name="d", import_path="m:f").tenant_limit("x") is None
    only_gold = DeploymentConfig(name="d", import_path="m:f", tenant_limits={"gold": {"max_queued": 1}})
    assert only_gold.tenant_limit("other") is None


def test_limits_are_not_code_a_change_restarts_nothing() -> None:
    plain = DeploymentConfig(name="d", import_path="m:f")
    limited = plain.model_copy(update={"tenant_limits": {"default": TenantLimitConfig(requests_per_s=1)}})
    assert plain.code_version() == limited.code_version()


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ("{default: {requests_per_s: -1}}", "tenant_limits.default.requests_per_s"),
        ("{default: {requests_per_s: fast}}", "tenant_limits.default.requests_per_s"),
        ("{gold: {burst: 0, requests_per_s: 1}}", "tenant_limits.gold.burst"),
        ("{gold: {max_queued: -5}}", "tenant_limits.gold.max_queued"),
        ("{gold: {burst: 5}}", "burst is the size of a rate limit's bucket: set requests_per_s too"),
        ("{'no spaces': {max_queued: 1}}", "is not a tenant name"),
        ("{gold: {requests_per_second: 1}}", "tenant_limits.gold.requests_per_second"),
    ],
)
def test_bad_limits_are_config_errors_naming_the_field(limits: str, field: str) -> None:
    text = f"deployments:\n  - name: d\n    import_path: m:f\n    tenant_limits: {limits}\n"
    with pytest.raises(ConfigError, match=field):
        parse_config(yaml.safe_load(text))
