"""A replica's output is split into lines of at most MAX_LINE_BYTES, a longer one marked as cut with its length,
however its pipe's reads fall (workers/output_shipper.LineCutter)."""

from __future__ import annotations

import os
import select

from streamserve.workers.output_shipper import MAX_LINE_BYTES, READ_BYTES, LineCutter, PassedOn, cut_marker


def _cut(output: bytes, read: int = READ_BYTES) -> list[str]:
    lines = LineCutter()
    found = [line for i in range(0, len(output), read) for line in lines.feed(output[i : i + read])]
    return found + lines.end()


def test_lines_are_split_whatever_the_reads() -> None:
    output = b"one\r\ntwo\n\nthree\xff\nno newline at the end"
    expected = ["one", "two", "", "three\ufffd", "no newline at the end"]
    for read in (1, 2, 3, 7, READ_BYTES):
        assert _cut(output, read) == expected, read
    assert _cut(b"ends with one\n") == ["ends with one"]
    assert _cut(b"") == []


def test_a_line_up_to_the_cap_is_whole_and_a_longer_one_is_cut_and_marked() -> None:
    at_cap = b"a" * MAX_LINE_BYTES
    assert _cut(at_cap + b"\nnext\n") == [at_cap.decode(), "next"]
    size = 50 * 1024 * 1024
    lines = LineCutter()
    found: list[str] = []
    block = b"x" * READ_BYTES
    for _ in range(size // READ_BYTES):  # as a pipe delivers a 50 MB line: never more than a read at once
        found += lines.feed(block)
    found += lines.feed(b"\nthe next line\n") + lines.end()
    assert found == ["x" * MAX_LINE_BYTES + cut_marker(size), "the next line"]
    assert f"{size} bytes" in cut_marker(size)


def test_a_character_cut_in_two_by_the_cap_is_left_out() -> None:
    line = "é".encode() * MAX_LINE_BYTES  # two bytes each: the cap falls between characters
    odd = b"a" + line  # ... and here inside one
    assert _cut(line + b"\n") == ["é" * (MAX_LINE_BYTES // 2) + cut_marker(len(line))]
    assert _cut(odd + b"\n", 1000) == ["a" + "é" * ((MAX_LINE_BYTES - 1) // 2) + cut_marker(len(odd))]


def test_output_is_passed_on_a_whole_line_a_write() -> None:
    """print() unbuffered writes a line's text, then its end: passed on as they came, another process's line could
    land between them on the terminal. Each write holds whole lines; what has no end yet waits for it."""
    read_end, write_end = os.pipe()
    passed = PassedOn(write_end)
    try:
        passed.feed(b"PRINTED {'x': 1}")
        assert not _readable(read_end) and passed.waiting
        passed.feed(b"\nnext")
        assert os.read(read_end, 100) == b"PRINTED {'x': 1}\n"  # one write: text and end together
        passed.feed(b" 50%\r")  # a progress bar's line ends with \r
        assert os.read(read_end, 100) == b"next 50%\r"
        passed.feed(b"prompt: ")
        passed.flush()  # (after HOLD_S of silence, or at the end)
        assert os.read(read_end, 100) == b"prompt: " and not passed.waiting
    finally:
        os.close(read_end)
        os.close(write_end)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])
