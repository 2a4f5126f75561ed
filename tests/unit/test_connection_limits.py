"""The gateway's connection limits as settings (app/http_protocol.py), and the open-file limit they live under;
the heartbeat settings' bounds on each other."""

from __future__ import annotations

import argparse
import logging
import resource
from collections.abc import Iterator

import pytest

from streamserve.app.http_protocol import ConnectionLimits
from streamserve.runtime import fd_limit
from streamserve.runtime.fd_limit import raise_fd_limit
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import ConfigError


@pytest.mark.parametrize(
    ("max_connections", "files", "cap"),
    [
        (None, 1_048_576, 10_000),  # the default, where files are plenty
        (None, 1024, 768),  # `ulimit -n 1024`: room kept for Redis, logs and closing connections
        (None, 64, 48),  # a quarter kept, of a tiny limit
        (500, 1024, 500),
        (50_000, 1_048_576, 50_000),
    ],
)
def test_the_cap_is_the_setting_or_the_default_within_the_open_file_limit(
    max_connections: int | None, files: int, cap: int
) -> None:
    limits = ConnectionLimits.for_process(Settings(max_connections=max_connections, header_timeout_s=2.5), files)
    assert limits == ConnectionLimits(header_timeout_s=2.5, max_connections=cap, max_head_bytes=4 * 64 * 1024)


def test_a_cap_the_open_file_limit_cannot_hold_is_lowered_saying_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        limits = ConnectionLimits.for_process(Settings(max_connections=5_000), 1024)
    assert limits.max_connections == 768
    assert "STREAMSERVE_MAX_CONNECTIONS=5000 is more than the open-file limit (1024) leaves room for" in caplog.text
    assert "ulimit -n" in caplog.text


@pytest.mark.parametrize(
    ("name", "value"),
    [("STREAMSERVE_MAX_CONNECTIONS", "0"), ("STREAMSERVE_HEADER_TIMEOUT_S", "0"), ("STREAMSERVE_KEEP_ALIVE_S", "-1")],
)
def test_bad_limits_are_refused_naming_the_setting(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        Settings.from_command_line(argparse.Namespace(redis_url=None))


@pytest.mark.parametrize(("interval", "timeout"), [("6", None), ("3", "5"), ("2.5", "4.9")])
def test_a_heartbeat_timeout_under_two_intervals_is_refused(
    interval: str, timeout: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas would be written off, killed and replaced between their heartbeats, over and over."""
    monkeypatch.setenv("STREAMSERVE_HEARTBEAT_INTERVAL_S", interval)
    if timeout is not None:
        monkeypatch.setenv("STREAMSERVE_HEARTBEAT_TIMEOUT_S", timeout)
    with pytest.raises(ConfigError, match=r"STREAMSERVE_HEARTBEAT_TIMEOUT_S: .* under twice STREAMSERVE_HEARTBEAT_INT"):
        Settings.from_command_line(argparse.Namespace(redis_url=None))
    monkeypatch.setenv("STREAMSERVE_HEARTBEAT_TIMEOUT_S", str(2 * float(interval)))
    Settings.from_command_line(argparse.Namespace(redis_url=None))


def test_the_limits_reach_the_gateway_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMSERVE_MAX_CONNECTIONS", "300")
    monkeypatch.setenv("STREAMSERVE_HEADER_TIMEOUT_S", "4")
    monkeypatch.setenv("STREAMSERVE_KEEP_ALIVE_S", "30")
    env = Settings().to_env()
    assert env["STREAMSERVE_MAX_CONNECTIONS"] == "300" and env["STREAMSERVE_HEADER_TIMEOUT_S"] == "4.0"
    assert env["STREAMSERVE_KEEP_ALIVE_S"] == "30.0"
    assert "STREAMSERVE_MAX_CONNECTIONS" not in Settings(max_connections=None).to_env()


@pytest.fixture
def low_soft_limit() -> Iterator[tuple[int, int]]:
    """This process's soft open-file limit lowered to 256 (under its hard limit) for the test; restored after."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, before[1]))
    try:
        yield 256, before[1]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_the_soft_open_file_limit_is_raised_to_the_hard_one(
    low_soft_limit: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, hard = low_soft_limit
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit to raise to")
    assert raise_fd_limit() == hard
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    assert raise_fd_limit() == hard  # nothing more to raise: silent
    assert caplog.text == ""


def test_a_limit_that_cannot_be_raised_is_kept_with_a_warning(
    low_soft_limit: tuple[int, int], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(which: int, limits: tuple[int, int]) -> None:
        raise ValueError("not allowed to raise maximum limit")

    with monkeypatch.context() as patched, caplog.at_level(logging.WARNING):
        patched.setattr(fd_limit.resource, "setrlimit", refuse)
        assert raise_fd_limit() == 256
    assert "could not raise the open-file limit from 256" in caplog.text and "not allowed" in caplog.text
