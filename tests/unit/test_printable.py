"""Control characters from outside are written as visible escapes (wire.printable), in both log formats' lines."""

from __future__ import annotations

import json
import logging
import sys

from streamserve.runtime.logging_setup import TextFormatter, json_formatter
from streamserve.wire.printable import ESCAPED_CODES, printable, printable_lines

# A screen clear, an OSC 52 clipboard write, a carriage return, a forged line, C1 CSI, DEL, a bidi override.
HOSTILE = "a\x1b[2J\x1b]52;c;aGk=\x07\rb\nFORGED POST /-/deploy 200\x9b31m\x7f\u202eevil\u2066"


def test_every_control_character_becomes_a_visible_escape() -> None:
    assert printable(HOSTILE) == (
        "a\\x1b[2J\\x1b]52;c;aGk=\\x07\\rb\\nFORGED POST /-/deploy 200\\x9b31m\\x7f\\u202eevil\\u2066"
    )
    for code in ESCAPED_CODES:
        shown = printable(f"<{chr(code)}>")
        assert shown.isprintable() and shown.startswith("<\\") and shown.endswith(">"), (hex(code), shown)
        assert not chr(code).isprintable(), hex(code)  # what lets printable skip text that has none
    assert printable("\t") == "\\t"


def test_text_without_control_characters_is_left_as_it_is() -> None:
    text = "GET /-/status 200 0.41ms déploiement=écho replica=écho#1 \\n 中文 request_id=a.b:c-d_e"
    assert printable(text) is text  # not even copied


def test_printable_lines_keeps_newlines_and_tabs_only() -> None:
    assert printable_lines("Traceback\n\tline\r\x1b[2J") == "Traceback\n\tline\\r\\x1b[2J"


def _record(message: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError(HOSTILE)
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.LogRecord("streamserve.test", logging.ERROR, __file__, 1, message, args, exc_info)
    record.__dict__.update(extra)
    return record


def test_a_text_log_line_cannot_be_forged_or_reach_the_terminal() -> None:
    line = TextFormatter().format(_record("handler %s failed", HOSTILE, request_id="id\x1b[2J\nFORGED"))
    assert "\n" not in line and line.isprintable(), line
    assert "handler a\\x1b[2J\\x1b]52;c;aGk=\\x07\\rb\\nFORGED POST" in line
    assert line.endswith(" request_id=id\\x1b[2J\\nFORGED")


def test_a_traceback_keeps_its_lines_and_loses_its_controls() -> None:
    record = _record("the handler failed", exc=True)
    logging.Formatter().format(record)  # another handler formats it first: logging caches the traceback's text
    assert "\x1b" in (record.exc_text or "")
    text = TextFormatter().format(record)
    first, *traceback = text.split("\n")
    assert first.endswith("the handler failed") and traceback[0] == "Traceback (most recent call last):"
    assert all(line.isprintable() for line in traceback), traceback
    # The message, which a caller may have chosen, on its one line: its newline cannot start a forged one.
    assert f"ValueError: {printable(HOSTILE)}" in traceback
    assert not any(line.startswith("FORGED") for line in traceback)


def test_every_message_and_note_of_a_chained_traceback_stays_on_its_line() -> None:
    try:
        try:
            raise OSError("context\nFORGED context")
        except OSError:
            cause = RuntimeError("cause\nFORGED cause")
            cause.add_note("note\nFORGED note")
            cause.add_note("a note without a newline \x1b]52;c;aGk=\x07")
            cause.__context__ = sys.exc_info()[1]  # as if raised here: the traceback shows both
            raise ValueError("last\nFORGED last") from cause
    except ValueError:
        record = logging.LogRecord("streamserve.test", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = TextFormatter().format(record)
    lines = text.split("\n")
    assert "RuntimeError: cause\\nFORGED cause" in lines and "note\\nFORGED note" in lines
    assert "ValueError: last\\nFORGED last" in lines and "The above exception was the direct cause" in text
    assert "OSError: context\\nFORGED context" in lines and "a note without a newline \\x1b]52;c;aGk=\\x07" in lines
    assert all(line.isprintable() for line in lines), text
    assert not any(line.startswith("FORGED") for line in lines), text


def test_the_json_log_format_escapes_every_control_character_itself() -> None:
    record = _record("%s", HOSTILE, exc=True, request_id=HOSTILE, path=HOSTILE)
    line = json_formatter("gateway").format(record)
    assert line.isascii() and line.isprintable(), line  # one line, nothing a terminal acts on
    parsed = json.loads(line)
    assert parsed["message"] == parsed["request_id"] == parsed["path"] == HOSTILE  # and nothing lost
