"""The gateway's HTTP connections: uvicorn's httptools protocol with a deadline on request headers and a cap on
open connections, so that clients that never finish their headers (slowloris) cannot hold all of its sockets.

uvicorn has neither: a new connection may stay silent, or trickle its headers, for ever (its keep-alive timeout
starts only after a response), and its ``limit_concurrency`` answers 503 only once headers are complete, which such
a connection never reaches. Here:

- A connection's request headers must all be in within ``header_timeout_s`` of its opening (a later request on a
  kept-alive connection: of that request's first byte). Past it the connection is closed, with a 408 when part of a
  request came. At most one timer per connection at a time (armed when it opens, and by a request that begins after
  the last one fired; a timer that fires early is moved to the deadline): no work per byte, a few attribute and dict
  operations per request.
- At ``max_connections`` open connections, a new one closes the connection that has waited longest without a
  request in progress (idle between requests, or still sending its headers), oldest first; when every connection has
  a request in progress, the new one gets 503 (``OverloadedError``) instead. A slowloris thus takes the place of other
  slow connections, never of requests being served.
- A request head (request line and headers as sent) longer than ``max_head_bytes`` is answered 431 as soon as that
  many bytes of it are in, not once it ends: httptools and uvicorn join a long header value or URL piece by piece,
  in time that grows with the square of its length (50 MB held the gateway 8 s). One counter add per read.
- An answer given while part of its request's body is still unread (a 404, a 413 by Content-Length, a refused admin
  write) is the connection's last (``end_if_body_unread``): uvicorn would read the rest and throw it away, as long as
  the client kept sending, a byte a minute or gigabytes, past every timeout. Work on those answers only.
- Bytes that are no request (400, 414, 431) behind pipelined requests in progress are answered after those
  requests, then the connection ends; uvicorn answered them at once and closed, and the earlier answers were lost.
  A flag check per read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from asyncio import TimerHandle
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from streamserve.app.errors import error_response
from streamserve.runtime.fd_limit import raise_fd_limit
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import (
    BadRequestError,
    HeadersTooLargeError,
    HeaderTimeoutError,
    OverloadedError,
    StreamServeError,
    URITooLongError,
)
from streamserve.wire.printable import printable

logger = logging.getLogger(__name__)

# Connections a gateway process holds unless STREAMSERVE_MAX_CONNECTIONS says otherwise.
# SO_LINGER on, for 0 s: closing the socket resets the connection at once.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)
DEFAULT_MAX_CONNECTIONS = 10_000
# Open files a gateway needs besides its clients' connections (the listening socket, its Redis pool of 64, logs,
# connections in their last second, CLOSING_MAX) at most; at most a quarter of a small limit.
FD_HEADROOM = 256
# A connection given a last answer (408, 503) is closed when the client closes its side, or this long after.
CLOSING_GRACE_S = 1.0
# At most this many connections wait out CLOSING_GRACE_S at once; beyond, they are closed at once.
CLOSING_MAX = 64
# A request head may take this many times max_header_bytes as sent: that limit counts header names and values, and
# each header adds ": " and CRLF (a head of many short headers is up to three times its count), beside the request
# line.
HEAD_BYTES_PER_HEADER_BYTE = 4
# The longest URL httptools parses (its offsets are 16-bit): a longer one fails the request as malformed HTTP.
MAX_URL_BYTES = 65_535
# The parser's reasons that malformed_answer says better: a method HTTP does not have, and uvicorn's own words.
_SAID_BY_MALFORMED_ANSWER = frozenset({"Invalid method encountered", "Invalid HTTP request received."})


# The ASGI scope key of what to call when the connection is lost before the response is complete. uvicorn tells an
# app only when it next awaits ``receive()``; one that waits for something else meanwhile (the gateway, for a reply
# from Redis) sets this, so that the caller's leaving cancels its request at once, with no task of its own.
ON_DISCONNECT = "streamserve.on_disconnect"
# The ASGI scope key of the request's uvicorn cycle, for ``write_chunk``.
CYCLE = "streamserve.cycle"
# The ASGI scope key of the host (and port) an absolute-form request target names (``POST http://host/path``), as a
# Host header would carry it: RFC 9112, 3.2.2 says the server goes by it, not by the Host header. uvicorn keeps only
# the target's path.
TARGET_HOST = "streamserve.target_host"


def when_gone(scope: MutableMapping[str, object], callback: Callable[[], None]) -> bool:
    """Call ``callback`` once the request's client disconnects before its response is complete: at once if it has
    already (GatewayHttpProtocol.connection_lost calls it later); it replaces an earlier one. False where the
    request's connection is not one of GatewayHttpProtocol's (an ASGI server of another make): nothing will call it
    (the app's ``receive`` says ``http.disconnect`` instead)."""
    scope[ON_DISCONNECT] = callback
    cycle = scope.get(CYCLE)
    if not isinstance(cycle, RequestResponseCycle):
        return False
    if getattr(cycle, "disconnected", False):
        callback()
    return True


def write_chunk(scope: Mapping[str, object], body: bytes) -> bool:
    """Write ``body`` as one chunk of the chunked response in progress, on the socket at once, as ASGI's ``send``
    would but without its message and await; False, writing nothing, where ``send`` must do it instead: the response
    is not a chunked one under way, its client is gone, or writing is paused (the client reads slowly: ``send`` waits
    for room). For the gateway's streams, whose chunks come from the reply reader with nobody awaiting anything."""
    cycle = scope.get(CYCLE)
    if not isinstance(cycle, RequestResponseCycle) or not body:
        return False
    try:
        if (
            cycle.flow.write_paused
            or cycle.disconnected
            or not cycle.response_started
            or cycle.response_complete
            or not cycle.chunked_encoding
        ):
            return False
        transport = cycle.transport
    except AttributeError:  # a uvicorn whose cycle is not the one this knows: its ASGI send does the writing
        return False
    transport.write(b"%x\r\n%b\r\n" % (len(body), body))
    return True


def start_chunked(scope: Mapping[str, object], headers: list[tuple[bytes, bytes]], first: bytes) -> bool:
    """Begin a 200 chunked response with ``first`` as its first chunk, status line, headers and chunk in one write,
    as ASGI's two ``send`` calls would write them in two (a stream's first chunk is what its caller waits for); False,
    writing nothing, where ``send`` must do it instead (as for ``write_response``). ``headers``: as there."""
    cycle = scope.get(CYCLE)
    if not isinstance(cycle, RequestResponseCycle) or not first:
        return False
    try:
        if cycle.flow.write_paused or cycle.disconnected or cycle.response_started:
            return False
        transport = cycle.transport
        head = _head(cycle, 200, headers)
        head += (b"transfer-encoding: chunked\r\n\r\n%x\r\n" % len(first), first, b"\r\n")
        cycle.response_started = True
        cycle.chunked_encoding = True
        cycle.expected_content_length = 0
        cycle.waiting_for_100_continue = False
    except AttributeError:  # a uvicorn whose cycle is not the one this knows: its ASGI send does the writing
        return False
    transport.write(b"".join(head))
    return True


def end_stuck_stream(scope: Mapping[str, object], last: bytes, complete: bool, linger_s: float) -> bool:
    """End a chunked response whose client stopped reading (``send`` would wait for room for ever): ``last`` as its
    last chunk, and when ``complete`` the body's end, go into the connection's buffer behind what it holds, without
    waiting; the connection closes once its client has read them all, and is cut ``linger_s`` from now if it has
    not. False, writing nothing, where the caller must cut the connection instead: the response is not a chunked one
    under way, its client is gone, or the cycle is not one this knows."""
    cycle = scope.get(CYCLE)
    if not isinstance(cycle, RequestResponseCycle):
        return False
    try:
        if cycle.disconnected or not cycle.response_started or cycle.response_complete or not cycle.chunked_encoding:
            return False
        transport = cycle.transport
        data = b"%x\r\n%b\r\n" % (len(last), last)
        if complete:
            data += b"0\r\n\r\n"
            cycle.keep_alive = False
            cycle.response_complete = True
            cycle.message_event.set()
    except AttributeError:  # a uvicorn whose cycle is not the one this knows
        return False
    transport.write(data)
    transport.close()  # asyncio writes out the buffer first
    asyncio.get_running_loop().call_later(linger_s, reset, transport)
    if complete:
        cycle.on_response()
    return True


def reset(transport: asyncio.Transport) -> None:
    """Cut the connection now, with a TCP reset: what the kernel still holds to send is dropped, not sent on to a
    client that reads too slowly to take it (a plain close would leave the kernel sending, for minutes)."""
    sock = transport.get_extra_info("socket")  # (once closed, one whose fd is -1: setsockopt raises)
    if sock is not None and sock.fileno() >= 0:
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
    transport.abort()


def write_response(scope: Mapping[str, object], status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """Write a whole response of ``body`` (with a content-length) on the socket in one write and complete the
    request, as ASGI's two ``send`` calls would but without their messages, awaits and per-header checks (a fifth of
    the gateway's CPU per request went to uvicorn's ``send``, bench/RESULTS.md); False, writing nothing, where
    ``send`` must do it instead: the response has begun, its client is gone, writing is paused, or the cycle is not
    one this knows. ``headers``: lower-case names, values the gateway made or checked (no CR or LF)."""
    cycle = scope.get(CYCLE)
    if not isinstance(cycle, RequestResponseCycle):
        return False
    try:
        if cycle.flow.write_paused or cycle.disconnected or cycle.response_started:
            return False
        transport, keep_alive = cycle.transport, cycle.keep_alive
        head = _head(cycle, status, [*headers, (b"content-length", b"%d" % len(body))])
        head += (b"\r\n", body)
        cycle.response_started = cycle.response_complete = True
        cycle.waiting_for_100_continue = False
    except AttributeError:  # a uvicorn whose cycle is not the one this knows: its ASGI send does the writing
        return False
    transport.write(b"".join(head))
    cycle.message_event.set()  # (a receive() waiting is told the response is complete, as send does)
    if not keep_alive:
        transport.close()
    cycle.on_response()
    return True


def _head(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """A response's status line and header lines as uvicorn writes them (its default headers first; ``connection:
    close`` when the connection ends after it), without the blank line that ends them."""
    head = [STATUS_LINE[status]]
    for name, value in (*cycle.default_headers, *headers):
        head += (name, b": ", value, b"\r\n")
    if not cycle.keep_alive:
        head.append(b"connection: close\r\n")
    return head


def end_if_body_unread(scope: Mapping[str, object]) -> None:
    """Make the request's answer the connection's last if part of its body is still unread: the answer says
    ``connection: close``, and then the connection ends, by LastAnswer (RFC 9112, 9.6: a staged close), so the rest
    of the body is never read. Call it before the answer starts; the error paths do (the 200 path has read the body)."""
    cycle = scope.get(CYCLE)
    if not isinstance(cycle, RequestResponseCycle):
        return
    protocol = getattr(cycle.on_response, "__self__", None)  # (its bound on_response_complete, while it runs)
    try:
        if not isinstance(protocol, GatewayHttpProtocol) or not cycle.more_body or cycle.response_started:
            return
        cycle.keep_alive = False
        cycle.transport = _EndsAfterAnswer(protocol)  # type: ignore[assignment]
    except AttributeError:  # a uvicorn whose cycle is not the one this knows: it reads the body on
        return


class _EndsAfterAnswer:
    """The transport a cycle answers on when the answer ends the connection: writes go to the connection's own, and
    the close that follows the answer (uvicorn's ``send``) hands the connection to LastAnswer, which drops what the
    client still sends until it closes, or for CLOSING_GRACE_S. Closing at once, with the body still coming, would
    reset the connection, and the client's system could throw the answer away before the client read it."""

    def __init__(self, protocol: GatewayHttpProtocol) -> None:
        self.protocol = protocol

    def write(self, data: bytes) -> None:
        self.protocol.transport.write(data)

    def is_closing(self) -> bool:
        return self.protocol.transport.is_closing()

    def close(self) -> None:
        if not self.protocol.transport.is_closing():
            self.protocol.leave_uvicorn()
            LastAnswer.take_over(self.protocol.transport, b"")


def body_arrived(scope: Mapping[str, object]) -> bool:
    """Whether the request's whole body is in already, so that ``receive()`` hands it over without waiting (uvicorn's
    cycle says so once it has parsed the end of the message); False where that cannot be known."""
    cycle = scope.get(CYCLE)
    if not isinstance(cycle, RequestResponseCycle):
        return False
    try:
        return not cycle.more_body and cycle.message_event.is_set()
    except AttributeError:  # a uvicorn whose cycle is not the one this knows
        return False


@dataclass(frozen=True)
class ConnectionLimits:
    """What a gateway process allows each connection: ``header_timeout_s``, and ``max_connections`` at once."""

    header_timeout_s: float
    max_connections: int
    max_head_bytes: int

    @classmethod
    def for_process(cls, settings: Settings, fd_limit: int) -> ConnectionLimits:
        """The settings' limits under an open-file limit of ``fd_limit``; a cap above what it leaves room for is
        lowered to that room, with a warning (accepting more would fail with "Too many open files")."""
        room = max(1, fd_limit - min(FD_HEADROOM, fd_limit // 4))
        cap = settings.max_connections
        if cap is None:
            cap = min(DEFAULT_MAX_CONNECTIONS, room)
        elif cap > room:
            logger.warning(
                "STREAMSERVE_MAX_CONNECTIONS=%d is more than the open-file limit (%d) leaves room for; holding at most"
                " %d connections (raise the limit with ulimit -n, or LimitNOFILE= in a systemd unit)",
                cap,
                fd_limit,
                room,
            )
            cap = room
        head = HEAD_BYTES_PER_HEADER_BYTE * settings.max_header_bytes
        return cls(header_timeout_s=settings.header_timeout_s, max_connections=cap, max_head_bytes=head)


def raw_response(exc: StreamServeError) -> bytes:
    """The whole HTTP/1.1 response for ``exc`` (app/errors.py's status, headers and body), closing the connection."""
    response = error_response(exc, {"Connection": "close"})
    head = [STATUS_LINE[response.status_code]]
    head += [name + b": " + value + b"\r\n" for name, value in response.raw_headers]
    return b"".join([*head, b"\r\n", response.body])


class LastAnswer(asyncio.Protocol):
    """A connection's last moments: write one answer, shut our side, drop whatever the client still sends, and close
    when it closes its side or after CLOSING_GRACE_S. Closing at once, with request bytes unread, would reset the
    connection, and the client's system could throw the answer away before the client read it."""

    lingering: ClassVar[int] = 0  # how many connections are in their last moments

    def __init__(self) -> None:
        self.timer: TimerHandle | None = None

    @classmethod
    def take_over(cls, transport: asyncio.Transport, answer: bytes) -> None:
        if cls.lingering >= CLOSING_MAX:
            transport.write(answer)
            transport.close()
            return
        protocol = cls()
        transport.set_protocol(protocol)
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        if not transport.is_reading():
            transport.resume_reading()
        cls.lingering += 1
        protocol.timer = asyncio.get_running_loop().call_later(CLOSING_GRACE_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            LastAnswer.lingering -= 1


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ConnectionLimits (see the module's docstring); call ``configure`` first."""

    # Set by configure(), before the first connection.
    limits: ClassVar[ConnectionLimits]
    timeout_answer: ClassVar[bytes]
    full_answer: ClassVar[bytes]
    head_answer: ClassVar[bytes]
    url_answer: ClassVar[bytes]
    malformed_answer: ClassVar[bytes]
    # Connections without a request in progress (idle, or sending headers), longest waiting first: who makes room.
    waiting: ClassVar[dict[GatewayHttpProtocol, None]] = {}

    header_timer: TimerHandle | None = None
    header_deadline: float = 0.0
    # Whether another protocol (LastAnswer) has the connection now: uvicorn's callbacks that still come do nothing.
    left: bool = False
    # The answer to bytes that are no request (400, 414, 431) that came behind requests still in progress: written
    # once they are answered, in the order the requests came (RFC 9112, 9.3.2); nothing after those bytes is read.
    last_answer: bytes | None = None
    # Whether the parser is inside a request's head, and how many bytes it was fed since (reads that began in it).
    in_head: bool = True
    head_bytes: int = 0

    @classmethod
    def configure(cls, limits: ConnectionLimits) -> None:
        """Use ``limits`` for every connection this process accepts from now on."""
        cls.limits = limits
        late = f"the request's headers did not arrive within {limits.header_timeout_s:g}s (header_timeout_s)"
        cls.timeout_answer = raw_response(HeaderTimeoutError(late))
        full = f"the gateway holds max_connections ({limits.max_connections}), each with a request in progress; retry"
        cls.full_answer = raw_response(OverloadedError(full, retry_after_s=1.0))
        long_head = (
            f"the request's line and headers passed {limits.max_head_bytes} bytes"
            f" ({HEAD_BYTES_PER_HEADER_BYTE} x max_header_bytes)"
        )
        cls.head_answer = raw_response(HeadersTooLargeError(long_head))
        cls.url_answer = raw_response(URITooLongError(f"the request's URL passed {MAX_URL_BYTES} bytes"))
        cls.malformed_answer = raw_response(
            BadRequestError(
                "the request is not valid HTTP/1.1: its method is none of HTTP's own (GET, POST, ...; a deployment "
                "takes POST), or its line or a header holds a character HTTP does not allow"
            )
        )

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are no HTTP request (a control character in a header, say): a JSON error
        body, as every other error the gateway gives (uvicorn's is plain text), and the connection closed. A URL
        httptools cannot take (longer than MAX_URL_BYTES) is no malformed request: 414, saying so. Behind requests in
        progress, once they are answered."""
        if len(self.url) > MAX_URL_BYTES:
            answer = self.url_answer
        elif msg and msg not in _SAID_BY_MALFORMED_ANSWER:  # what is wrong, in llhttp's words (its reasons are fixed)
            answer = raw_response(BadRequestError(f"the request is not valid HTTP/1.1: {printable(msg[:200])}"))
        else:
            answer = self.malformed_answer
        if not self.answer_later(answer):
            self.transport.write(answer)
            self.transport.close()

    def _unsupported_upgrade_warning(self) -> None:
        """(uvicorn's: a request asked to switch protocols, which the gateway never does; it is answered as HTTP/1.1.)
        Not logged: uvicorn's two warnings a line each, for any caller to repeat at will."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections and not self.make_room():
            self.transport = transport  # never one of uvicorn's connections; connection_lost needs only this
            LastAnswer.take_over(transport, self.full_answer)
            return
        super().connection_made(transport)
        self.waiting[self] = None
        self.header_deadline = self.loop.time() + self.limits.header_timeout_s
        self.header_timer = self.loop.call_later(self.limits.header_timeout_s, self.check_headers)

    def connection_lost(self, exc: Exception | None) -> None:
        self.waiting.pop(self, None)
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        super().connection_lost(exc)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            on_disconnect: Callable[[], None] | None = cycle.scope.get(ON_DISCONNECT)  # type: ignore[assignment]
            if on_disconnect is not None:
                on_disconnect()  # the app waits for something other than the body (a reply): it is told now

    def data_received(self, data: bytes) -> None:
        if self.last_answer is not None:
            return  # behind bytes that are no request: nothing more is parsed
        self.feed(data)
        if not self.in_head:
            return
        # Counted after parsing: a read that began a request (on_message_begin set the count to 0) counts whole.
        self.head_bytes += len(data)
        over = self.head_bytes > self.limits.max_head_bytes and not self.transport.is_closing()
        if over and not self.answer_later(self.head_answer):
            self.leave_uvicorn()
            LastAnswer.take_over(self.transport, self.head_answer)

    def feed(self, data: bytes) -> None:
        """uvicorn's ``data_received``, but for what follows a request that asked to Upgrade (which the gateway never
        does: it goes on speaking HTTP/1.1, RFC 9110, 7.8): httptools stops at that request's end, and uvicorn
        dropped the rest of the read, so that a request pipelined behind it was never answered."""
        self._unset_keepalive_if_required()
        while True:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as exc:
                self.logger.warning("Invalid HTTP request received.")
                # (a callback's failure, uvicorn's URL parsing say, has no reason of llhttp's worth telling)
                callback = isinstance(exc, httptools.HttpParserCallbackError)
                self.send_400_response("" if callback else str(exc))
            except httptools.HttpParserUpgrade as upgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                    return
                offset = upgrade.args[0] if upgrade.args and isinstance(upgrade.args[0], int) else len(data)
                data = data[offset:]
                if data and self.bodiless_upgrade() and not self.transport.is_closing():
                    continue
            return

    def bodiless_upgrade(self) -> bool:
        """Whether the request that asked to Upgrade declared no body: what follows it is the next request. (One with
        a body, whose bytes come next, is answered 400 for the body it loses: app/bodies.py; the rest is dropped.)"""
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"0", b"")):
                return False
        return True

    def on_message_begin(self) -> None:
        self.in_head, self.head_bytes = True, 0
        super().on_message_begin()
        if self.cycle is not None:  # a later request on this connection: its headers have their own time
            self.header_deadline = self.loop.time() + self.limits.header_timeout_s
            if self.header_timer is None:
                self.header_timer = self.loop.call_later(self.limits.header_timeout_s, self.check_headers)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.waiting.pop(self, None)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # (not for an upgrade)
            self.scope[CYCLE] = cycle  # type: ignore[literal-required]  # (write_chunk)
            if self.url[:1] != b"/":  # absolute-form (or OPTIONS's "*")
                self.note_target_host()

    def note_target_host(self) -> None:
        """Put the host an absolute-form target names in the scope (TARGET_HOST), for the admin guard to judge."""
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            return
        if url.host:
            host = url.host.decode("latin-1")
            host = f"[{host}]" if ":" in host else host
            self.scope[TARGET_HOST] = host if url.port is None else f"{host}:{url.port}"  # type: ignore[literal-required]

    def on_response_complete(self) -> None:
        if self.left:
            return
        idle = not self.pipeline  # else the next request, already read, starts now
        super().on_response_complete()
        if not idle or self.transport.is_closing():
            return
        if self.last_answer is not None:  # every request before the bytes that are none is answered
            self.leave_uvicorn()
            LastAnswer.take_over(self.transport, self.last_answer)
            return
        self.waiting[self] = None

    def answer_later(self, answer: bytes) -> bool:
        """Hold ``answer``, to bytes that are no request, as ``last_answer`` while requests read before them are in
        progress (uvicorn wrote it at once and closed: their answers were lost); False when none is, to answer now.
        A parse error inside the body of the request in progress is that request's own: answered now too."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.more_body:
            return False
        if self.last_answer is None:
            self.last_answer = answer
        return True

    def reading_headers(self) -> bool:
        """Whether the connection waits for the rest of a request's headers, with no request in progress."""
        in_headers = self.scope is None or "method" not in self.scope  # uvicorn sets it once headers are complete
        return in_headers and (self.cycle is None or self.cycle.response_complete)

    def check_headers(self) -> None:
        self.header_timer = None
        if self.transport.is_closing() or not self.reading_headers():
            return  # a later request arms the timer again
        left = self.header_deadline - self.loop.time()
        if left > 0:
            self.header_timer = self.loop.call_later(left, self.check_headers)
        elif self.scope is None:
            self.transport.close()  # not a byte of a request: nothing to answer
        else:
            self.leave_uvicorn()
            LastAnswer.take_over(self.transport, self.timeout_answer)

    def make_room(self) -> bool:
        """Close the connection that has waited longest without a request in progress; False if there is none."""
        if not self.waiting:
            return False
        oldest = next(iter(self.waiting))
        del self.waiting[oldest]
        oldest.transport.close()
        return True

    def leave_uvicorn(self) -> None:
        """Forget this connection before another protocol takes its transport over (uvicorn no longer sees it)."""
        self.left = True
        self.connections.discard(self)
        self.waiting.pop(self, None)
        self._unset_keepalive_if_required()


def use_connection_limits(settings: Settings) -> None:
    """Raise this process's open-file limit as far as allowed, and hold its connections to the settings' limits."""
    GatewayHttpProtocol.configure(ConnectionLimits.for_process(settings, raise_fd_limit()))
