"""What the CLI prints cannot drive the terminal: every table cell, message and log line is escaped (wire.printable),
and ``logs --raw`` alone prints a line as the replica printed it."""

from __future__ import annotations

import pytest

from streamserve.cli.log_reader import LogLine
from streamserve.cli.main import COMMANDS, main
from streamserve.cli.parser import build_parser
from streamserve.cli.tables import format_endpoints, format_status
from streamserve.control.status import AutoscalingStatus, DeploymentStatus, ReplicaStatus
from streamserve.wire.config import EndpointConfig
from streamserve.wire.errors import ConfigError, RemoteError

# An OSC 52 clipboard write, a screen clear, a carriage return, a newline, C1 CSI and a bidi override.
HOSTILE = "\x1b]52;c;aGk=\x07\x1b[2J\rX\nY\x9b31m\u202e"
SHOWN = "\\x1b]52;c;aGk=\\x07\\x1b[2J\\rX\\nY\\x9b31m\\u202e"


def _shown_safely(out: str) -> None:
    assert all(line.isprintable() for line in out.split("\n")), out


def test_every_cell_and_message_of_status_is_escaped() -> None:
    replica = ReplicaStatus(f"r#{HOSTILE}", "RUNNING", HOSTILE, 7, HOSTILE, 0, 0.1, f"failed: {HOSTILE}")
    status = DeploymentStatus(
        name=f"d{HOSTILE}",
        route_prefix=f"/{HOSTILE}",
        version="v1",
        health=HOSTILE,
        message=f"import failed: {HOSTILE}",
        target=1,
        running=1,
        starting=0,
        stopping=0,
        queued=0,
        in_flight=0,
        dead_letters=0,
        replicas=[replica],
        autoscaling=AutoscalingStatus(1, 2, 1.0, f"because {HOSTILE}", 1),
    )
    out = format_status([status])
    _shown_safely(out)
    assert f"d{SHOWN}" in out and f"/{SHOWN}" in out and f"failed: {SHOWN}" in out
    assert f"d{SHOWN}: import failed: {SHOWN}" in out and f"because {SHOWN}" in out
    header, row = out.split("\n")[:2]
    assert header.index("TARGET") == row.index("1 (auto 1-2)")  # the columns are aligned on what is shown


def test_every_cell_of_the_endpoints_table_is_escaped() -> None:
    # As a Redis writer could store it: the config's validation never saw it.
    endpoint = EndpointConfig.model_construct(
        name=f"e{HOSTILE}", route_prefix=f"/{HOSTILE}", traffic={f"a{HOSTILE}": 1.0}, shadow={}
    )
    out = format_endpoints([endpoint])
    _shown_safely(out)
    assert f"e{SHOWN}" in out and f"/{SHOWN}" in out and f"a{SHOWN}=1" in out


def test_a_log_line_is_escaped_unless_raw_is_asked_for() -> None:
    line = LogLine("1-0", f"echo#1{HOSTILE}", "host", f"printed {HOSTILE}")
    assert line.format() == f"echo#1{SHOWN} | printed {SHOWN}"
    assert line.format(raw=True) == f"echo#1{HOSTILE} | printed {HOSTILE}"
    assert build_parser().parse_args(["logs", "echo", "--raw"]).raw is True
    assert build_parser().parse_args(["logs", "echo"]).raw is False


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (RemoteError("ValueError", "evil\x1b[2J\nFAKE LINE\rX"), "error: ValueError: evil\\x1b[2J\\nFAKE LINE\\rX\n"),
        (
            ConfigError("c.yaml:\ndeployment 'e': user_config: '\x1b]52;c;x\x07'"),
            "c.yaml:\ndeployment 'e': user_config",
        ),
    ],
)
def test_an_error_the_cli_prints_drives_no_terminal(
    error: Exception, shown: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A handler's exception (`call`, `deploy --wait`) reached the terminal raw: escapes cleared it and a carriage
    return hid what came before. A ConfigError keeps the lines it is made of."""

    def fails(_args: object, _settings: object) -> int:
        raise error

    monkeypatch.setitem(COMMANDS, "status", fails)
    assert main(["status", "--redis-url", "redis://127.0.0.1:1"]) in (1, 2)
    printed = capsys.readouterr().err
    assert shown in printed
    assert not any(c in printed for c in "\x1b\r\x07"), printed
