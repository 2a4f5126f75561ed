"""The pure rules of the security settings: the import allow-list, loopback, blank keys."""

from __future__ import annotations

import argparse

import pytest
from pydantic import SecretStr, ValidationError

from streamserve.control.security import ImportAllowList, check_exposure, is_loopback
from streamserve.runtime.processes import without_secret_urls
from streamserve.runtime.settings import Settings
from streamserve.scheduler.launcher import ProcessLauncher
from streamserve.transport.connections import redacted
from streamserve.wire.errors import ConfigError


def test_allow_list_takes_modules_under_its_prefixes_only() -> None:
    allow = ImportAllowList.parse(" examples , myapp.models")
    assert allow.allows("examples:Echo") and allow.allows("examples.echo:Echo")
    assert allow.allows("myapp.models.bert:Model")
    assert not allow.allows("examplesX:Echo")  # a prefix is a whole module name, not a string prefix
    assert not allow.allows("myapp.views:index")
    assert not allow.allows("os:system") and not allow.allows("builtins:eval")
    with pytest.raises(
        ConfigError, match=r"'os:system' is outside STREAMSERVE_IMPORT_ALLOW \(examples, myapp\.models\)"
    ):
        allow.check("os:system", "pwn")
    assert ImportAllowList.parse(None).allows("os:system")  # unset: any module, as before


@pytest.mark.parametrize("raw", ["examples,", "os system", "a..b", "1abc"])
def test_an_allow_list_that_is_not_module_names_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="not a module name"):
        ImportAllowList.parse(raw)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("gateway.example", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_exposure_needs_a_key_or_no_admin_off_loopback() -> None:
    with pytest.raises(ConfigError, match="STREAMSERVE_API_KEY") as refused:
        check_exposure("0.0.0.0", api_key_set=False, admin=True)
    assert "--no-admin" in str(refused.value)
    check_exposure("0.0.0.0", api_key_set=True, admin=True)
    check_exposure("0.0.0.0", api_key_set=False, admin=False)
    check_exposure("127.0.0.1", api_key_set=False, admin=True)


@pytest.mark.parametrize("key", ["", "   ", "\t"])
def test_a_blank_api_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    monkeypatch.setenv("STREAMSERVE_API_KEY", key)
    with pytest.raises(ConfigError) as refused:
        Settings.from_command_line(argparse.Namespace(redis_url=None))
    assert str(refused.value) == "STREAMSERVE_API_KEY: set but blank; set a secret, or unset it for no key"


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("secret-with-a-trailing-space ", "starts or ends with whitespace"),
        ("\tsecret", "starts or ends with whitespace"),
        ("pässwörd-secret-1234", "beyond printable ASCII"),
        ("line\nbreak", "beyond printable ASCII"),
    ],
)
def test_an_api_key_no_header_can_carry_is_a_config_error(monkeypatch: pytest.MonkeyPatch, key: str, why: str) -> None:
    """The gateway started with such a key and then refused every token (found by an outside tester)."""
    monkeypatch.setenv("STREAMSERVE_API_KEY", key)
    with pytest.raises(ConfigError, match=why):
        Settings.from_command_line(argparse.Namespace(redis_url=None))


def settings_with_url(monkeypatch: pytest.MonkeyPatch, where: str, url: str) -> Settings:
    """Settings read with ``url`` given ``where``: the --redis-url flag or the environment variable named."""
    if where.startswith("--"):
        return Settings.from_command_line(argparse.Namespace(redis_url=url))
    monkeypatch.setenv(where, url)
    return Settings.from_command_line(argparse.Namespace(redis_url=None))


@pytest.mark.parametrize("where", ["REDIS_URL", "STREAMSERVE_REDIS_URL", "--redis-url"])
def test_a_url_that_is_no_redis_url_is_a_config_error_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    url = "http://user:secret@cache.example:6379/0"
    with pytest.raises(ConfigError) as refused:
        settings_with_url(monkeypatch, where, url)
    assert str(refused.value) == (
        "--redis-url / REDIS_URL: 'http://***@cache.example:6379/0' is not a Redis URL: it starts with redis://, "
        "rediss:// or unix://"
    )
    for fine in ("redis://127.0.0.1:6379/0", "rediss://h:6380/0", "unix:///tmp/redis.sock", "REDIS://h/0"):
        assert Settings.from_command_line(argparse.Namespace(redis_url=fine)).redis_url == fine


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:Wr?ong@127.0.0.1:6399/0", "its port is not a number from 0 to 65535"),
        ("redis://:Wr#ong@127.0.0.1:6399/0", "its port is not a number from 0 to 65535"),
        ("rediss://u:Wr/ong@h:6380/0", "its port is not a number from 0 to 65535"),
        ("redis://:12?ong@127.0.0.1:6399/0", "it holds an '@' after its host"),  # read as 127.0.0.1 port 12
        ("redis://:12#ong@127.0.0.1:6399/0", "it holds a '#', which ends a URL"),
        ("unix:///run/redis.sock?password=Wr#ong", "it holds a '#', which ends a URL"),
        ("redis://[::1:6379/0", "its host in [ ] is not an IPv6 address"),
    ],
)
@pytest.mark.parametrize("where", ["REDIS_URL", "--redis-url", "STREAMSERVE_JOBS_REDIS_URL"])
def test_a_url_redis_py_cannot_take_apart_is_a_config_error_without_its_password(
    monkeypatch: pytest.MonkeyPatch, url: str, problem: str, where: str
) -> None:
    """A password's unencoded ? # / made redis-py read part of it as the port: a traceback at the first command."""
    with pytest.raises(ConfigError) as refused:
        settings_with_url(monkeypatch, where, url)
    message = str(refused.value)
    setting = "STREAMSERVE_JOBS_REDIS_URL" if where.endswith("JOBS_REDIS_URL") else "--redis-url / REDIS_URL"
    assert message.startswith(f"{setting}: cannot be parsed: {problem}; a password with ?, #, / or @ in it must be ")
    assert "? as %3F" in message and "\n" not in message
    assert "Wr" not in message and "ong" not in message and "12" not in message


def test_a_percent_encoded_password_or_one_with_an_at_sign_is_taken() -> None:
    """redis-py takes the last '@' as the end of the password, and decodes %3F and the like; an '@' in a query's
    value (a path) is no password cut short."""
    for fine in (
        "redis://:Wr%3Fo%23n%2Fg%40@127.0.0.1:6399/0",
        "redis://u:W@r@h:6379/0?socket_timeout=5",
        "rediss://h:6380/0?ssl_ca_certs=/home/me@corp/ca.pem&ssl_certfile=/srv/a@b/c.pem",
    ):
        assert Settings.from_command_line(argparse.Namespace(redis_url=fine)).redis_url == fine


def test_a_settings_error_quotes_no_url() -> None:
    """Settings() built by a library user raises pydantic's own error: it names the setting, not the value."""
    with pytest.raises(ValidationError) as refused:
        Settings(redis_url="redis://:Wr?ong@127.0.0.1:6399/0")
    assert "Wr" not in str(refused.value) and "cannot be parsed" in str(refused.value)


def test_admin_off_and_allow_list_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMSERVE_ADMIN", "off")
    monkeypatch.setenv("STREAMSERVE_IMPORT_ALLOW", "examples")
    settings = Settings.from_command_line(argparse.Namespace(redis_url=None))
    assert settings.admin is False
    assert settings.import_allow_list == ImportAllowList(("examples",))
    assert settings.to_env()["STREAMSERVE_ADMIN"] == "off"  # child processes get the same
    assert settings.to_env()["STREAMSERVE_IMPORT_ALLOW"] == "examples"
    monkeypatch.setenv("STREAMSERVE_IMPORT_ALLOW", "os system")
    with pytest.raises(ConfigError, match="STREAMSERVE_IMPORT_ALLOW"):
        Settings.from_command_line(argparse.Namespace(redis_url=None))


def test_replicas_are_started_without_the_api_key() -> None:
    """User code runs in replicas: it gets the farm's settings, never the gateway's token."""
    settings = Settings(redis_url="redis://127.0.0.1:6379/0", api_key=SecretStr("gateway-only"))
    inherited = {"PATH": "/usr/bin", "STREAMSERVE_API_KEY": "from-the-shell"}
    env = ProcessLauncher(settings)._env
    assert "STREAMSERVE_API_KEY" not in env and env["REDIS_URL"] == "redis://127.0.0.1:6379/0"
    assert "STREAMSERVE_API_KEY" not in settings.user_code_env(inherited)
    assert settings.to_env()["STREAMSERVE_API_KEY"] == "gateway-only"  # the gateway's children get it


def test_replicas_are_started_without_the_tenant_keys_file() -> None:
    """User code must not learn where the API keys of the tenants are; the gateways started by `up` do."""
    settings = Settings(redis_url="redis://127.0.0.1:6379/0", tenant_keys="/etc/streamserve/tenant-keys")
    assert settings.to_env()["STREAMSERVE_TENANT_KEYS"] == "/etc/streamserve/tenant-keys"
    assert "STREAMSERVE_TENANT_KEYS" not in ProcessLauncher(settings)._env
    assert "STREAMSERVE_TENANT_KEYS" not in settings.user_code_env({"STREAMSERVE_TENANT_KEYS": "/from/the/shell"})


@pytest.mark.parametrize(
    ("argv", "kept", "moved"),
    [
        (["up", "c.yaml", "--redis-url", "redis://:pw@h:1/0", "--port", "8"], ["up", "c.yaml", "--port", "8"], True),
        (["status", "--redis-url=rediss://user:pw@h:1/0"], ["status"], True),
        (["status", "--redis-url", "unix:///run/redis.sock?password=pw"], ["status"], True),
        (["status", "--redis-url", "redis://h:1/0"], None, False),  # no password: nothing to hide
        (["status"], None, False),
        # Refused at once (the password belongs in the Secret): moved, it was lost, and manifests for a new Redis made.
        (["manifests", "c.yaml", "--image", "i", "--redis-url", "redis://:pw@h:1/0"], None, False),
    ],
)
def test_a_password_on_the_command_line_moves_to_the_environment(
    argv: list[str], kept: list[str] | None, moved: bool
) -> None:
    """What `ps` shows every user: the command line. A URL with a password goes to the environment instead."""
    result = without_secret_urls(argv)
    if not moved:
        assert result is None
        return
    assert result is not None and result[0] == kept
    assert "pw" in result[1]["STREAMSERVE_REDIS_URL"] and not any("pw" in arg for arg in result[0])


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@127.0.0.1:6379/0", "redis://***@127.0.0.1:6379/0"),
        ("redis://user:pw@h:6379/0", "redis://***@h:6379/0"),
        (
            "redis://:first-half@second-half@h:6379/0",
            "redis://***@h:6379/0",
        ),  # redis-py takes the whole as the password
        ("unix:///run/r.sock?db=2&password=s3cr3t", "unix:///run/r.sock?db=2&password=***"),
        ("redis://h:6379/9?password=s3cr3t&db=1", "redis://h:6379/9?password=***&db=1"),
        ("rediss://:pw@h:6380/0?ssl_ca_certs=/etc/a@b/ca.crt", "rediss://***@h:6380/0?ssl_ca_certs=/etc/a@b/ca.crt"),
        ("redis://h:6379/0?nopassword=1", "redis://h:6379/0?nopassword=1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_messages_show_redis_urls_without_their_passwords(url: str, shown: str) -> None:
    """What error bodies (``/-/healthz`` among them), the banner and the logs say of a Redis URL."""
    assert redacted(url) == shown
