"""`streamserve up`'s addresses: a port is 1-65535 (a usage error otherwise, not a traceback or a banner naming port
0), and a --host the gateway cannot listen on is said to be that, not "in use"."""

from __future__ import annotations

import socket

import pytest

from streamserve.cli.parser import build_parser
from streamserve.runtime.processes import bind_problem


@pytest.mark.parametrize(
    ("flag", "value", "error"),
    [
        ("--port", "70000", "argument --port: a port is 1-65535, got 70000"),
        ("--port", "0", "argument --port: a port is 1-65535, got 0"),
        ("--redis-port", "-1", "argument --redis-port: a port is 1-65535, got -1"),
        ("--port", "http", "argument --port: 'http' is not a port number"),
    ],
)
def test_a_port_out_of_range_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, error: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["up", "farm.yaml", flag, value])
    assert exited.value.code == 2
    assert error in capsys.readouterr().err
    assert build_parser().parse_args(["up", "farm.yaml", flag, "65535"]).__dict__[flag[2:].replace("-", "_")] == 65535


def test_what_keeps_the_gateway_from_listening_is_said() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert bind_problem("127.0.0.1", taken.getsockname()[1]) == "in use"
    assert bind_problem("999.1.1.1", 8000).startswith("'999.1.1.1' is no address of this machine")
    assert bind_problem("192.0.2.1", 8000) == "Cannot assign requested address"  # TEST-NET-1: no interface has it
    assert bind_problem("127.0.0.1", 0) == ""
    if socket.has_ipv6:
        assert bind_problem("::1", 0) in ("", "Cannot assign requested address")  # (a host without IPv6 loopback)
