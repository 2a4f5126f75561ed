"""Text from outside, made safe to write into a line of a log or a cell of a table shown on a terminal.

A value that a caller, a handler or a Redis writer chose can hold characters that are not text: a newline that
starts a forged log line, ESC or C1 sequences that clear the screen or set the clipboard (OSC 52), a carriage
return that hides what came before it, bidi overrides that show text in another order than it is read.
``printable`` writes each of them as a visible escape, as Python's repr does (``\\n``, ``\\x1b``, ``\\u202e``), and
leaves everything else as it is. A backslash is not escaped: ``\\n`` typed by someone stays on its one line.
"""

from __future__ import annotations

_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}

# C0 controls, DEL, C1 controls, the line and paragraph separators, the bidi embeddings, overrides and isolates.
ESCAPED_CODES = (
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
)


def _escape(code: int) -> str:
    return _NAMED.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


_ONE_LINE = str.maketrans({code: _escape(code) for code in ESCAPED_CODES})
_LINES = str.maketrans({code: _escape(code) for code in ESCAPED_CODES if code not in (0x09, 0x0A)})


def printable(text: str) -> str:
    """``text`` on one line with every control character escaped; ``text`` itself when it has none.

    Cheap on the hot path: ``str.isprintable`` (false for every escaped character) scans the text in C, and only
    text that fails it is translated."""
    return text if text.isprintable() else text.translate(_ONE_LINE)


def printable_lines(text: str) -> str:
    """``text`` with its newlines and tabs kept and every other control character escaped: for text made of lines
    on purpose, such as a traceback."""
    return text.translate(_LINES)
