"""A replica's output (its log and whatever its code prints, tracebacks included) to a capped Redis stream.

`streamserve logs NAME` reads the stream, so it shows the replicas of a
deployment on every host. The replica's file descriptors 1 and 2 are
pipes read by threads here: each line goes on to where the output went
before (the terminal of `streamserve up`, a container's log) at once, and
to Redis a batch at a time. Redis being away never holds the replica up:
lines wait in a bounded buffer and the oldest are dropped past it.
"""

from __future__ import annotations

import codecs
import contextlib
import faulthandler
import logging
import os
import select
import socket
import sys
import threading
from collections import deque
from types import TracebackType

import redis as redis_sync
from redis.typing import EncodableT, FieldT

from streamserve.transport.connections import RETRYABLE_ERRORS, refuses_writes, sync_redis
from streamserve.transport.streams import LOG_STREAM_LINES

logger = logging.getLogger(__name__)

# Lines waiting for Redis at most; older ones are dropped (and counted) past it.
BUFFERED_LINES = 10_000
# How often lines are tried again while Redis refuses them. Otherwise a line goes as soon as it is read, unless a
# batch went less than BATCH_GAP_S ago (a handler that prints on every request costs a round trip per BATCH_GAP_S,
# not per line): a replica that dies moments after it printed (kill -9, the kernel's OOM killer) takes with it only
# what its threads had not yet read out of the pipe, or read less than BATCH_GAP_S after a batch.
RETRY_EVERY_S = 0.2
BATCH_GAP_S = 0.02
# A line longer than this (in bytes) is shipped cut, marked with its length (a handler printing a whole tensor).
MAX_LINE_BYTES = 16 * 1024
# How long a read from the pipe is at most.
READ_BYTES = 65536
# How long output without its line's end waits for it before it is passed on all the same (PassedOn).
HOLD_S = 0.1
# How long stopping waits for the readers to see the end of their pipes and for the last batch.
STOP_WAIT_S = 3.0


class OutputShipper:
    """``with OutputShipper(...)``: fds 1 and 2 of this process are teed to Redis until the block ends."""

    def __init__(self, redis_url: str, stream_key: str, replica_id: str) -> None:
        self._redis_url = redis_url
        self._key = stream_key
        self._fields: dict[FieldT, EncodableT] = {
            "replica": replica_id,
            "host": socket.gethostname(),
            "pid": str(os.getpid()),
        }
        self._lines: deque[str] = deque()
        self._lock = threading.Lock()
        self._dropped = 0
        self._redis_away = False  # the last send failed: lines dropped meanwhile are dropped for that
        self._dropped_while_away = False
        self._originals: dict[int, int] = {}
        self._readers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._waiting = threading.Event()  # lines wait (or the block ends): the sender goes
        self._sender: threading.Thread | None = None

    def __enter__(self) -> OutputShipper:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            self._originals[fd] = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            reader = threading.Thread(target=self._read, args=(read_end, self._originals[fd]), daemon=True)
            reader.start()
            self._readers.append(reader)
        # A fatal error (segfault) kills the threads that would pass its report on: it goes straight out instead.
        faulthandler.enable(file=os.fdopen(os.dup(self._originals[2]), "w"), all_threads=True)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        self._sender = threading.Thread(target=self._send_loop, daemon=True)
        self._sender.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and not isinstance(exc, KeyboardInterrupt | SystemExit):
            logger.error("the replica process failed", exc_info=exc)  # shipped: the interpreter's report would not be
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in self._originals.items():
            os.dup2(original, fd)  # closes this process's write end of the pipe: its reader sees the end
        for reader in self._readers:
            reader.join(STOP_WAIT_S)  # a child process of the handler may still hold the pipe open
        for original in self._originals.values():
            os.close(original)  # only now: the readers pass their last lines on through it
        self._stop.set()
        self._waiting.set()
        if self._sender is not None:
            self._sender.join(STOP_WAIT_S)

    # -- threads ------------------------------------------------------------------------------------

    def _read(self, read_end: int, passthrough: int) -> None:
        lines, held = LineCutter(), PassedOn(passthrough)
        with contextlib.suppress(OSError):
            while True:
                if held.waiting and not select.select([read_end], [], [], HOLD_S)[0]:
                    held.flush()  # a prompt, a progress bar: what comes without its line's end, after a pause
                    continue
                chunk = os.read(read_end, READ_BYTES)
                if not chunk:
                    break
                held.feed(chunk)
                self._keep(lines.feed(chunk))
        held.flush()
        self._keep(lines.end())
        os.close(read_end)

    def _keep(self, lines: list[str]) -> None:
        if not lines:
            return
        with self._lock:
            self._lines.extend(lines)
            while len(self._lines) > BUFFERED_LINES:
                self._lines.popleft()
                self._dropped += 1
                self._dropped_while_away |= self._redis_away
        self._waiting.set()

    def _send_loop(self) -> None:
        redis = sync_redis(self._redis_url, max_connections=1)
        try:
            while not self._stop.is_set():
                self._waiting.wait()
                self._waiting.clear()  # (before the lines are taken: one kept after this wakes the next turn)
                if not self._send(redis):
                    self._stop.wait(RETRY_EVERY_S)
                    self._waiting.set()
                else:
                    self._stop.wait(BATCH_GAP_S)
            self._send(redis)  # what the readers passed on last
        finally:
            redis.close()

    def _send(self, redis: redis_sync.Redis) -> bool:
        """Send the waiting lines; False when Redis could not take them (they wait again, in front)."""
        with self._lock:
            lines, self._lines = list(self._lines), deque()
            dropped, self._dropped = self._dropped, 0
            away, self._dropped_while_away = self._dropped_while_away, False
        if dropped:
            why = "while Redis could not be reached" if away else "(printed faster than they could be sent)"
            lines.insert(0, f"[streamserve: {dropped} line(s) of output dropped {why}]")
        if not lines:
            return True
        try:
            pipe = redis.pipeline(transaction=False)
            for line in lines:
                fields: dict[FieldT, EncodableT] = {**self._fields, "line": line}
                pipe.xadd(self._key, fields, maxlen=LOG_STREAM_LINES, approximate=True)
            pipe.execute()
        except Exception as exc:
            if not (isinstance(exc, RETRYABLE_ERRORS) or refuses_writes(exc)):  # Redis away, or full for a while
                raise
            with self._lock:  # back in front, for the next try (the bound still holds)
                self._redis_away = True
                self._lines.extendleft(reversed(lines))
                while len(self._lines) > BUFFERED_LINES:
                    self._lines.popleft()
                    self._dropped += 1
                    self._dropped_while_away = True
            return False
        self._redis_away = False
        return True


class PassedOn:
    """Output passed on to where it went before, a whole line a write: a line printed in two writes (its text, then
    its end, as print() does unbuffered: PYTHONUNBUFFERED=1) reached the terminal in two, and another process's
    line could land between them. What comes without a line's end (\\n, or \\r: a progress bar) waits for it,
    for HOLD_S of silence at most, and for READ_BYTES at most."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._held = b""

    @property
    def waiting(self) -> bool:
        return bool(self._held)

    def feed(self, chunk: bytes) -> None:
        end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1
        if end:
            self._write(self._held + chunk[:end])
            self._held = chunk[end:]
        else:
            self._held += chunk
        if len(self._held) > READ_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._held:
            self._write(self._held)
            self._held = b""

    def _write(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # (where it went is gone: a closed terminal)
            while data:
                data = data[os.write(self._fd, data) :]


class LineCutter:
    """Splits a pipe's output into lines, each at most MAX_LINE_BYTES long (then marked as cut, with its length).

    A line is kept only up to the cap while the rest of it is counted, not held: a 50 MB line costs one pass over
    its chunks and 16 KiB of memory, not a copy of everything read so far at every chunk.
    """

    def __init__(self) -> None:
        self._head = bytearray()  # the current line's first bytes, up to the cap
        self._size = 0  # the current line's length so far

    def feed(self, chunk: bytes) -> list[str]:
        """The lines that ``chunk`` ends (the rest waits for the next chunk)."""
        first, *others = chunk.split(b"\n")
        self._add(first)
        if not others:
            return []
        *whole, rest = others
        done = [self._finish(), *(_shipped(piece[:MAX_LINE_BYTES], len(piece)) for piece in whole)]
        self._add(rest)
        return done

    def end(self) -> list[str]:
        """The last line, when the output did not end with a newline."""
        return [self._finish()] if self._size else []

    def _add(self, piece: bytes) -> None:
        if (room := MAX_LINE_BYTES - len(self._head)) > 0:
            self._head += piece[:room]
        self._size += len(piece)

    def _finish(self) -> str:
        line = _shipped(bytes(self._head), self._size)
        self._head, self._size = bytearray(), 0
        return line


def _shipped(head: bytes, size: int) -> str:
    """A line as shipped, from its first MAX_LINE_BYTES bytes ``head`` and its whole length ``size``."""
    if size <= MAX_LINE_BYTES:
        return head.decode("utf-8", "replace").rstrip("\r")
    # Not final: a character that the cap cut in two is left out, not shown as a replacement character.
    return codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=False) + cut_marker(size)


def cut_marker(size: int) -> str:
    """What ends a line shipped cut: how long the whole line was (without its newline)."""
    return f"… [cut: the line had {size} bytes]"
