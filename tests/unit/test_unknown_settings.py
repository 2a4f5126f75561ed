"""Which STREAMSERVE_ variables are no setting, and the setting each is nearest to."""

from __future__ import annotations

from streamserve.runtime.settings import Settings, setting_env_names, unknown_settings


def test_every_setting_and_alias_is_known() -> None:
    names = setting_env_names()
    assert {f"STREAMSERVE_{name.upper()}" for name in Settings.model_fields} - {"STREAMSERVE_REDIS_URL"} <= names
    assert {"STREAMSERVE_REDIS_URL", "REDIS_URL", "STREAMSERVE_REDIS_CLUSTER_NODES"} <= names
    assert unknown_settings({name: "x" for name in names if name.startswith("STREAMSERVE_")}) == []


def test_a_misspelt_setting_is_named_with_the_one_meant() -> None:
    environ = {"STREAMSERVE_API_KEYS": "k", "STREAMSERVE_HEARTBEAT_TIMEOUT": "3", "HOME": "/root", "REDIS_URL": "x"}
    assert unknown_settings(environ) == [
        "STREAMSERVE_API_KEYS is not a streamserve setting and is ignored (did you mean STREAMSERVE_API_KEY?)",
        "STREAMSERVE_HEARTBEAT_TIMEOUT is not a streamserve setting and is ignored"
        " (did you mean STREAMSERVE_HEARTBEAT_TIMEOUT_S?)",
    ]


def test_a_name_near_no_setting_points_to_the_list() -> None:
    assert unknown_settings({"STREAMSERVE_ZZZ": "1"}) == [
        "STREAMSERVE_ZZZ is not a streamserve setting and is ignored (docs/configuration.md lists the settings)"
    ]


def test_a_setting_in_lower_case_is_one_as_it_is_read() -> None:
    assert unknown_settings({"streamserve_api_key": "k"}) == []
