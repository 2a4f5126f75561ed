"""The CLI's arguments, checked as it parses them: a bad one is a usage error (exit 2), never a traceback.

`up`'s ports are 1-65535 (0 waited 32 s and printed port 0 in the banner), a --host the gateway cannot listen on is
said to be that (not "in use"); `call`'s timeout, tenant and model id are checked as the client checks them.
"""

from __future__ import annotations

import argparse
import socket

import pytest

from streamserve.app.main import build_parser as gateway_parser
from streamserve.cli.parser import build_parser, parse_command_line
from streamserve.runtime.processes import bind_problem
from streamserve.runtime.settings import add_redis_url_option
from streamserve.workers.main import build_parser as worker_parser


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


@pytest.mark.parametrize("value", ["99999", "0", "-5"])
def test_the_gateway_s_port_is_checked_too(capsys: pytest.CaptureFixture[str], value: str) -> None:
    """`streamserve gateway --port 99999` listened on 34463 (99999 mod 65536)."""
    with pytest.raises(SystemExit) as exited:
        gateway_parser().parse_args(["--port", value])
    assert exited.value.code == 2
    assert f"argument --port: a port is 1-65535, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["scale", "echo", "1"], ["deploy", "farm.yaml"], ["delete", "echo"]])
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_a_wait_timeout_that_could_never_be_met_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], command: list[str], value: str
) -> None:
    """Else the change was made, and the wait failed at once (exit 1)."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, "--wait", "--timeout", value])
    assert exited.value.code == 2
    assert f"argument --timeout: a timeout is a number of seconds above 0, got {value}" in capsys.readouterr().err


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


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--timeout", "-1"], "argument --timeout: a timeout is above 0 and at most 604800 seconds, got -1"),
        (["--timeout", "nan"], "argument --timeout: a timeout is above 0 and at most 604800 seconds, got nan"),
        (["--tenant", "a b"], "argument --tenant: tenant 'a b' is not a tenant name"),
        (["--model-id", "../x"], "argument --model-id: model id '../x' is not a model id"),
    ],
)
def test_a_call_argument_the_client_would_refuse_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    """Exit 2 before anything is sent, as for any other bad argument (it was 1, the client's BadRequestError)."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["call", "echo", "{}", *args])
    assert exited.value.code == 2
    assert error in capsys.readouterr().err
    fine = build_parser().parse_args(
        ["call", "echo", "{}", "--timeout", "2.5", "--tenant", "acme", "--model-id", "m-1"]
    )
    assert (fine.timeout, fine.tenant, fine.model_id) == (2.5, "acme", "m-1")


@pytest.mark.parametrize(
    "args",
    [
        ["call", "ec\udcffho"],
        ["logs", "Echo"],
        ["scale", "ec\udcffho", "2"],
        ["delete", "a b"],
        ["traffic", "a.b", "e=1"],
    ],
)
def test_a_name_no_deployment_could_have_is_a_usage_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    """Bytes the shell passed that are not UTF-8 were a traceback from redis-py's encoding of the name."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(args)
    assert exited.value.code == 2
    assert "is not a valid name: use 1-63 of a-z 0-9 _ - starting with a letter or digit" in capsys.readouterr().err


def test_a_workers_deployment_name_is_checked_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        worker_parser().parse_args(["ec\udcffho"])
    assert exited.value.code == 2
    assert "argument deployment: 'ec\\udcffho' is not a valid name" in capsys.readouterr().err


def test_an_argument_no_command_takes_is_that_commands_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_command_line(["status", "--bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("usage: streamserve status ")
        and "streamserve status: error: unrecognized arguments: --bogus" in err
    )


def test_a_roles_redis_url_help_names_its_own_default() -> None:
    """gateway, scheduler, worker and job-worker have no --data-dir: their help says where they look instead."""
    role = argparse.ArgumentParser()
    add_redis_url_option(role, role=True)
    said = " ".join(role.format_help().split())
    assert "else $REDIS_URL, else redis://127.0.0.1:6379/0)" in said and "--data-dir" not in said
    command = argparse.ArgumentParser()
    add_redis_url_option(command)
    assert "the `up` that runs from --data-dir" in " ".join(command.format_help().split())
