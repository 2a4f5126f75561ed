"""A client given something that is not a Redis URL says so when it is made, as a StreamServeError naming the
schemes it takes; a server that answers, but not as Redis does, is RedisUnavailableError (docs/api.md: errors are
StreamServeErrors)."""

from __future__ import annotations

import pytest
from redis.exceptions import InvalidResponse

from streamserve.client import AsyncClient, Client
from streamserve.errors import ConfigError, RedisUnavailableError
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


def test_a_server_that_does_not_answer_as_redis_is_redis_unavailable() -> None:
    error = RedisRefusals("redis://:pw@127.0.0.1:8000/0").meaning(InvalidResponse('Protocol error, got "H" as reply'))
    assert isinstance(error, RedisUnavailableError)
    assert str(error) == (
        'the server at redis://***@127.0.0.1:8000/0 does not answer as Redis: Protocol error, got "H" as reply'
    )
