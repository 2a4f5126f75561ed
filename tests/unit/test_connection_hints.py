"""What a failure to connect adds when the Redis URL itself is the likely cause (a TLS file it names is missing, a
plain URL at a TLS port); redis-py's own words name neither the file nor TLS."""

from __future__ import annotations

import ssl
from pathlib import Path

from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamserve.transport.connections import (
    PlainRedisAtTLSPort,
    RedisRefusals,
    connection_hint,
    retry_cannot_mend,
)


def test_a_tls_file_the_url_names_that_is_not_there_is_named(tmp_path: Path) -> None:
    there = tmp_path / "ca.pem"
    there.write_text("")
    url = f"rediss://:secret@127.0.0.1:6380/0?ssl_ca_certs={there}&ssl_certfile=/nope/client.pem"
    failed = RedisConnectionError("Error 2 connecting to 127.0.0.1:6380. No such file or directory.")
    assert connection_hint(url, failed) == " (no such file: ssl_certfile /nope/client.pem)"
    error = RedisRefusals(url).meaning(failed)
    assert str(error) == (
        "cannot reach Redis at rediss://***@127.0.0.1:6380/0?ssl_ca_certs=" + str(there) + "&ssl_certfile=/nope/"
        "client.pem: Error 2 connecting to 127.0.0.1:6380. No such file or directory. (no such file: ssl_certfile "
        "/nope/client.pem)"
    )


def test_a_plain_url_whose_server_resets_the_connection_may_want_tls() -> None:
    reset = RedisConnectionError("Error while reading from 127.0.0.1:6380 : (104, 'Connection reset by peer')")
    assert (
        connection_hint("redis://127.0.0.1:6380/0", reset)
        == " (if that port speaks TLS, the URL starts with rediss://)"
    )
    assert connection_hint("rediss://127.0.0.1:6380/0", reset) == ""


def test_a_tls_handshake_that_timed_out_gets_no_hint_about_the_scheme() -> None:
    """A plain Redis at a rediss:// URL's port is PlainRedisAtTLSPort, which says so; a handshake that timed out
    where no plain Redis answered either (a hung server, a firewall) says nothing about the scheme."""
    waited = RedisTimeoutError("Timeout connecting to server")
    assert connection_hint("rediss://127.0.0.1:6379/0", waited) == ""
    assert connection_hint("redis://127.0.0.1:6379/0", waited) == ""


def test_other_failures_get_no_hint() -> None:
    assert connection_hint("redis://127.0.0.1:1/0", RedisConnectionError("Connection refused")) == ""
    assert connection_hint("redis://127.0.0.1:1/0?ssl_ca_certs=/nope", ResponseError("WRONGPASS")) == ""


def test_only_what_no_retry_mends_stops_a_process_that_waits_for_redis(tmp_path: Path) -> None:
    """A refused password, a rediss:// URL at a plain Redis's port, a certificate that does not verify, a missing
    TLS file: the set-up's, for good. A Redis that refuses connections or resets one may be on its way up (or
    down)."""
    url = "rediss://127.0.0.1:6380/0"
    unverified = RedisConnectionError("Error 1 connecting to 127.0.0.1:6380. [SSL: CERTIFICATE_VERIFY_FAILED] ...")
    unverified.__cause__ = ssl.SSLCertVerificationError("certificate verify failed")
    assert retry_cannot_mend(url, unverified)
    assert retry_cannot_mend(url, AuthenticationError("invalid username-password pair or user is disabled."))
    assert retry_cannot_mend(url, PlainRedisAtTLSPort("the server at 127.0.0.1:6380 speaks plain Redis, not TLS"))
    assert retry_cannot_mend(f"{url}?ssl_ca_certs={tmp_path / 'nope.pem'}", RedisConnectionError("Error 2 connecting"))
    assert not retry_cannot_mend(
        url, RedisConnectionError("Error 111 connecting to 127.0.0.1:6380. Connection refused.")
    )
    assert not retry_cannot_mend("redis://127.0.0.1:6380/0", RedisConnectionError("(104, 'Connection reset by peer')"))
    assert not retry_cannot_mend(url, RedisTimeoutError("Timeout connecting to server"))


def test_a_url_without_a_password_at_a_redis_that_wants_one_names_where_up_keeps_it() -> None:
    refused = AuthenticationError("Authentication required.")
    assert "the data directory's redis_password" in connection_hint("redis://127.0.0.1:6379/0", refused)
    assert connection_hint("redis://:wrong@127.0.0.1:6379/0", refused) == ""
