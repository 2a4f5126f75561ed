"""A client given something that is not a Redis URL says so when it is made, as a StreamServeError naming the
schemes it takes; a server that answers, but not as Redis does, is RedisUnavailableError (docs/api.md: errors are
StreamServeErrors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.connection import FALSE_STRINGS
from redis.exceptions import ConnectionError, InvalidResponse

from streamserve.client import AsyncClient, Client
from streamserve.client.core import DEFAULT_REDIS_HINT
from streamserve.errors import ConfigError, RedisUnavailableError
from streamserve.runtime.settings import Settings
from streamserve.transport.connections import RedisRefusals

SCHEMES = "it starts with redis://, rediss:// or unix://"
NOT_REDIS_URLS = ["http://127.0.0.1:8000", "127.0.0.1:6379", "localhost"]


@pytest.mark.parametrize("url", NOT_REDIS_URLS)
@pytest.mark.parametrize("client_class", [Client, AsyncClient])
def test_a_url_that_is_not_redis_s_is_refused_when_the_client_is_made(
    url: str, client_class: type[Client | AsyncClient]
) -> None:
    with pytest.raises(ConfigError, match=f"redis_url: '{url}' is not a Redis URL: {SCHEMES}"):
        client_class(url)


def test_a_url_with_a_password_is_named_without_it() -> None:
    with pytest.raises(ConfigError) as raised:
        Client("http://user:secret@cache.example:6379/0")
    assert "secret" not in str(raised.value)


def test_a_redis_url_from_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "http://127.0.0.1:8000")
    with pytest.raises(ConfigError, match=f"REDIS_URL: 'http://127.0.0.1:8000' is not a Redis URL: {SCHEMES}"):
        Client()


def test_a_blank_streamserve_redis_url_leaves_redis_url_to_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/api.md: "STREAMSERVE_REDIS_URL, else REDIS_URL; set but empty counts as unset" (pydantic took the empty
    one, the first set, and REDIS_URL was never read)."""
    monkeypatch.setenv("STREAMSERVE_REDIS_URL", "")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:29999/0")
    assert Settings().redis_url == "redis://127.0.0.1:29999/0"
    monkeypatch.setenv("REDIS_URL", " ")
    assert Settings().redis_url is None
    monkeypatch.setenv("STREAMSERVE_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:29999/0")
    assert Settings().redis_url == "redis://127.0.0.1:1/0"


def test_a_server_that_does_not_answer_as_redis_is_redis_unavailable() -> None:
    error = RedisRefusals("redis://:pw@127.0.0.1:8000/0").meaning(InvalidResponse('Protocol error, got "H" as reply'))
    assert isinstance(error, RedisUnavailableError)
    assert str(error) == (
        'the server at redis://***@127.0.0.1:8000/0 does not answer as Redis: Protocol error, got "H" as reply'
        " (an HTTP server answered there, a gateway's port perhaps: the farm's Redis has a port of its own, on the"
        " `redis` line `streamserve up` prints)"
    )


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("foo=bar", "its query names foo, which redis-py does not take"),
        ("socket_timeout=abc", "its query: Invalid value for 'socket_timeout' in connection URL."),
        ("ssl_ca_certs=/etc/ca.pem", "its query names ssl_ca_certs, which only a rediss:// (TLS) URL takes"),
    ],
)
def test_an_option_redis_py_would_not_take_is_refused_when_the_client_is_made(query: str, said: str) -> None:
    """(redis-py refuses it only once a first command connects, in a TypeError's traceback.)"""
    with pytest.raises(ConfigError) as raised:
        Client(f"redis://:secret@127.0.0.1:6379/0?{query}")
    assert said in str(raised.value) and "secret" not in str(raised.value)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("ssl_cert_reqs=bogus", "its query: Invalid SSL Certificate Requirements Flag: bogus"),
        ("ssl_check_hostname=maybe", "ssl_check_hostname='maybe' is neither yes nor no"),
        ("ssl_ca_certs=/a.pem&ssl_ca_certs=/b.pem", "its query names ssl_ca_certs more than once"),
    ],
)
def test_a_value_redis_py_would_refuse_or_misread_is_refused_when_the_client_is_made(query: str, said: str) -> None:
    """ssl_cert_reqs=bogus was a traceback at the first connect, maybe was read as yes, and of two values of one name
    the first was taken without a word."""
    with pytest.raises(ConfigError) as raised:
        Client(f"rediss://:secret@127.0.0.1:6380/0?{query}")
    assert said in str(raised.value) and "secret" not in str(raised.value)


@pytest.mark.parametrize("value", [*FALSE_STRINGS, *(no.lower() for no in FALSE_STRINGS), "1", "true", "Yes", "y"])
def test_every_spelling_of_no_redis_py_reads_and_its_counterparts_are_taken(value: str) -> None:
    Client(f"rediss://127.0.0.1:6380/0?ssl_check_hostname={value}").close()


@pytest.mark.parametrize(
    "url",
    [
        "rediss://:pw@127.0.0.1:6380/0?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required",
        "rediss://127.0.0.1:6380/0?ssl_cert_reqs=none&ssl_check_hostname=false",
        "unix:///run/redis.sock?password=pw&db=1",
        "redis://127.0.0.1:6379/0?socket_keepalive=true&health_check_interval=5&protocol=3",
        "redis://127.0.0.1:6379/0?max_connections=50&timeout=5",
    ],
)
def test_the_options_redis_py_takes_are_taken(url: str) -> None:
    Client(url).close()


def test_a_client_given_no_redis_and_no_farm_says_so_when_the_default_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As the CLI does: the Python client's message named only 127.0.0.1:6379, not why it was tried."""
    monkeypatch.chdir(tmp_path)  # no .streamserve/ farm here
    for name in ("REDIS_URL", "STREAMSERVE_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    refused = ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    fell_back = AsyncClient()._refusals.meaning(refused)
    assert str(fell_back).endswith(DEFAULT_REDIS_HINT) and 'Client("redis://HOST:PORT")' in str(fell_back)
    given = AsyncClient("redis://127.0.0.1:6379/0")._refusals.meaning(refused)
    assert str(given) == (
        "cannot reach Redis at redis://127.0.0.1:6379/0: Error 111 connecting to 127.0.0.1:6379. Connection refused."
    )
