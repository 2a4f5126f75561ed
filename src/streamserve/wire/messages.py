"""The wire format: one encode/decode pair per message type.

Stream entries (requests, replies) are flat field maps with short readable
field names and a schema version ``v``; bodies are JSON bytes passed through
untouched. Records kept in hashes (replica records, heartbeats) are JSON
objects. Nothing is ever pickled: a payload in Redis is data, never code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError
from redis.typing import EncodableT, FieldT

from streamserve.wire.errors import BadRequestError, ProtocolError
from streamserve.wire.priorities import Priority, parse_priority
from streamserve.wire.states import DeploymentHealth, GoalStatus, ReplicaHealth, ReplicaState
from streamserve.wire.tenants import DEFAULT_TENANT

SCHEMA_VERSION = 1
_NORMAL = Priority.NORMAL
_V = str(SCHEMA_VERSION).encode()

# A stream entry as redis-py returns it (decode_responses=False).
Fields = dict[bytes, bytes]

# What XREAD/XREADGROUP return: per stream, its entries (id, fields).
StreamBatches = list[tuple[bytes, list[tuple[bytes, Fields]]]]

# A stream entry as handed to XADD.
WireFields = dict[FieldT, EncodableT]


def text(value: bytes | str) -> str:
    """A Redis reply as str (our clients return bytes; typing says either)."""
    return value.decode() if isinstance(value, bytes) else value


def now_ms() -> int:
    """Wall-clock epoch milliseconds: the unit of every deadline and timestamp on the wire."""
    return int(time.time() * 1000)


def _field(fields: Fields, name: bytes, kind: str) -> bytes:
    try:
        return fields[name]
    except KeyError:
        raise ProtocolError(f"{kind} message has no {name.decode()!r} field") from None


def _check_version(fields: Fields, kind: str) -> None:
    version = fields.get(b"v")
    if version != _V:
        raise ProtocolError(f"{kind} message has schema version {version!r}, expected {SCHEMA_VERSION}")


@dataclass(slots=True)
class Request:
    """One call of a deployment, as queued on its request stream."""

    request_id: str
    # The caller's reply stream, or "" for fire-and-forget.
    reply_to: str
    deadline_ms: int
    # The JSON-encoded argument of the handler.
    body: bytes
    # A method of the deployment's class to call instead of ``__call__``.
    method: str = ""
    # Deliveries that ended with the replica dying (set when the scheduler re-queues it).
    attempts: int = 0
    # The caller takes a stream of chunks (Client.stream, HTTP): a streaming handler may answer with chunks.
    # Without it, a streaming handler is not run: the caller gets BAD_REQUEST naming stream().
    stream: bool = False
    # The request id of the request whose handler sent this one through a handle (streamserve.handle), or "".
    parent: str = ""
    # The caller's own key for this call (Reply.tag): unique among the calls its client ever made, so that a reply
    # finds its call even when another call, now or earlier, has the same request id. "" from older clients.
    tag: str = ""
    # The caller's idempotency key (wire/idempotency.py), "" for none: the replica stores the reply under it.
    idem: str = ""
    # The digest of identical requests (wire/response_cache.py), "" for none: the replica keeps a good reply under it.
    cache: str = ""
    # With ``idem`` or ``cache``: the token of this run, which the run's record names (wire/shared_runs.py).
    run: str = ""
    # Its priority level, which picks its stream (Keys.requests; on the wire only when not ``normal``, so that a
    # dead letter keeps it).
    priority: Priority = Priority.NORMAL
    # Whom it is for (wire/tenants.py; on the wire only when not DEFAULT_TENANT), and, when its tenant's count of
    # held requests is bounded, its token in that count (the replica removes it when it finishes the request).
    tenant: str = DEFAULT_TENANT
    held: str = ""
    # The model it is for (wire/models.py: X-Model-Id, model_id=), "" for none.
    model: str = ""
    # Tracing (runtime/tracing.py), when the caller traces: the W3C ``traceparent`` of its enqueue span (the replica's
    # spans are its children), the ``tracestate`` that goes with it, and when it was sent (epoch ns, the start of
    # the replica's ``queue wait`` span). "", "" and 0 otherwise, and then not on the wire.
    trace: str = ""
    trace_state: str = ""
    sent_ns: int = 0

    def encode(self) -> WireFields:
        fields: WireFields = {
            "v": _V,
            "id": self.request_id,
            "reply_to": self.reply_to,
            "deadline_ms": self.deadline_ms,
            "method": self.method,
            "body": self.body,
        }
        if self.attempts:
            fields["attempts"] = self.attempts
        if self.stream:
            fields["stream"] = b"1"
        if self.parent:
            fields["parent"] = self.parent
        if self.tag:
            fields["tag"] = self.tag
        if self.run:
            if self.idem:
                fields["idem"] = self.idem
            if self.cache:
                fields["cache"] = self.cache
            fields["run"] = self.run
        if self.priority is not _NORMAL:
            fields["priority"] = self.priority.value
        if self.tenant != DEFAULT_TENANT:
            fields["tenant"] = self.tenant
        if self.held:
            fields["held"] = self.held
        if self.model:
            fields["model"] = self.model
        if self.trace:
            fields["trace"] = self.trace
            fields["sent_ns"] = self.sent_ns
            if self.trace_state:
                fields["trace_state"] = self.trace_state
        return fields

    @classmethod
    def decode(cls, fields: Fields) -> Request:
        _check_version(fields, "request")
        try:
            request = cls(
                request_id=_field(fields, b"id", "request").decode(),
                reply_to=_field(fields, b"reply_to", "request").decode(),
                deadline_ms=int(_field(fields, b"deadline_ms", "request")),
                body=_field(fields, b"body", "request"),
                method=fields.get(b"method", b"").decode(),
                attempts=int(fields.get(b"attempts", b"0")),
                stream=fields.get(b"stream") == b"1",
                parent=fields.get(b"parent", b"").decode(),
                tag=fields.get(b"tag", b"").decode(),
                idem=fields.get(b"idem", b"").decode(),
                cache=fields.get(b"cache", b"").decode(),
                run=fields.get(b"run", b"").decode(),
                priority=_NORMAL if (level := fields.get(b"priority")) is None else parse_priority(level.decode()),
                tenant=DEFAULT_TENANT if (tenant := fields.get(b"tenant")) is None else tenant.decode(),
                held=fields.get(b"held", b"").decode(),
                model="" if (model := fields.get(b"model")) is None else model.decode(),
            )
            if (trace := fields.get(b"trace")) is not None:
                request.trace = trace.decode()
                request.trace_state = fields.get(b"trace_state", b"").decode()
                request.sent_ns = int(fields.get(b"sent_ns", b"0"))
            return request
        except (UnicodeDecodeError, ValueError, BadRequestError) as exc:
            raise ProtocolError(f"malformed request message: {exc}") from exc

    def reply(self, status: ReplyStatus, replica_id: str, **more: Any) -> Reply:
        """A reply to this request (its id and tag), with ``more`` of Reply's fields."""
        return Reply(self.request_id, status, replica_id, tag=self.tag, **more)


def reply_address(fields: Fields) -> tuple[str, str, str] | None:
    """Whom to answer for a request entry that cannot be decoded (Request.decode): its request id, reply stream and
    tag, when those can be read; None when they cannot."""
    try:
        request_id, reply_to = fields[b"id"].decode(), fields[b"reply_to"].decode()
        tag = fields.get(b"tag", b"").decode()
    except (KeyError, UnicodeDecodeError, AttributeError):
        return None
    return (request_id, reply_to, tag) if request_id and reply_to else None


# Reply.shared's values.
SHARED_STORED = "stored"
SHARED_JOINED = "joined"


def method_of(method: str | None) -> str:
    """A caller's ``method=``: None (or "") is the handler itself; else the name of the class's method to run."""
    if method is None:
        return ""
    if not isinstance(method, str):
        raise BadRequestError(f"method must be a method's name (a string), got {method!r}")
    if method and not method.isidentifier():  # (a lone surrogate, say, which could not even be sent)
        raise BadRequestError(f"method {method!r} is not a method's name")
    return method


class ReplyStatus(str, Enum):
    """How a request ended, as its reply says."""

    # The handler returned; ``body`` is its JSON result.
    OK = "ok"
    # The handler raised; ``error_type``/``error_message`` say what.
    USER_ERROR = "user_error"
    # The deadline passed before a replica ran it; user code did not run.
    DEADLINE_EXCEEDED = "deadline_exceeded"
    # The replica could not run it as sent (body not JSON, no such method).
    BAD_REQUEST = "bad_request"
    # Delivered too many times; moved to the dead-letter stream.
    DEAD_LETTER = "dead_letter"
    # Chunks of a streaming handler's output: ``body`` holds ``count`` chunks, each one compact JSON value, joined
    # by b"\n" (compact JSON never holds a raw newline), the first of them chunk number ``seq`` (from 0). On the
    # wire chunks travel in ChunkBatch entries; a caller's client hands a stream's first ones over as this reply.
    CHUNK = "chunk"
    # A stream ended well after ``seq`` chunks. A stream that fails ends with USER_ERROR, DEADLINE_EXCEEDED (or
    # BAD_REQUEST) instead, its ``seq`` the number of chunks sent before it.
    END = "end"
    # The request was cancelled while its handler ran (its caller stopped waiting, its job was cancelled): the handler
    # was stopped or told to stop (streamserve.cancelled()), or never started. Nobody waits for it: it is counted (its
    # ``error_message`` is the stage, "queued" or "running"), never sent.
    CANCELLED = "cancelled"
    # To a call that waited for another's run of its idempotency key: that run ended without its handler running to
    # its end (it was cancelled, its deadline passed first, it was dead-lettered), so the key is free again and the
    # caller sends its call anew. Never seen by users.
    RETRY = "retry"
    # The request's deployment was deleted before a replica ran it to its end, and no replica ever will: sent by the
    # scheduler to the callers of what its request streams still held (NotFoundError).
    GONE = "gone"


# The statuses that end a request's replies (every one but CHUNK).
FINAL_STATUSES = frozenset(status for status in ReplyStatus if status is not ReplyStatus.CHUNK)


_STATUS_BY_BYTES = {status.value.encode(): status for status in ReplyStatus}


@dataclass(slots=True)
class Reply:
    """The answer to one Request, added to the caller's reply stream."""

    request_id: str
    status: ReplyStatus
    replica_id: str
    body: bytes = b""
    error_type: str = ""
    error_message: str = ""
    # Streams only (CHUNK, END, and an error that ends a stream): see ReplyStatus.
    seq: int = 0
    count: int = 0
    # Streams only, on CHUNK: the replica's max_unread_chunks, so that the caller knows how often to say how far it
    # has read (control messages on the replica's control stream, Keys.replica_control).
    window: int = 0
    # The request's tag (Request.tag), "" when it had none.
    tag: str = ""
    # Not on the wire: how a caller got this reply from a shared run (wire/shared_runs.py): SHARED_STORED, the
    # reply kept for an earlier request; SHARED_JOINED, a copy of the reply to a request it waited for; "" its own.
    shared: str = ""

    def encode(self) -> WireFields:
        fields: WireFields = {
            "v": _V,
            "id": self.request_id,
            "status": self.status.value,
            "replica": self.replica_id,
            "body": self.body,
        }
        if self.error_type or self.error_message:  # an answer that went well carries no empty error fields
            fields["error_type"] = self.error_type
            fields["error_message"] = self.error_message
        if self.seq or self.count or self.window:  # nor does a unary one any stream fields
            fields["seq"] = self.seq
            fields["count"] = self.count
            fields["window"] = self.window
        if self.tag:
            fields["tag"] = self.tag
        return fields

    @classmethod
    def decode(cls, fields: Fields) -> Reply:
        _check_version(fields, "reply")
        status_raw = _field(fields, b"status", "reply")
        status = _STATUS_BY_BYTES.get(status_raw)
        if status is None:
            raise ProtocolError(f"reply has unknown status {status_raw!r}")
        try:
            return cls(
                request_id=_field(fields, b"id", "reply").decode(),
                status=status,
                replica_id=fields.get(b"replica", b"").decode(),
                body=fields.get(b"body", b""),
                error_type=fields.get(b"error_type", b"").decode(),
                error_message=fields.get(b"error_message", b"").decode(errors="replace"),
                **(_stream_fields(fields) if b"seq" in fields else {}),  # a unary reply has none: nothing to parse
                tag=fields.get(b"tag", b"").decode(),
            )
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(f"malformed reply message: {exc}") from exc


@dataclass(slots=True)
class ChunkPart:
    """One stream's chunks in a ChunkBatch: ``body``, ``seq`` and ``count`` as in a CHUNK reply (ReplyStatus)."""

    request_id: str
    tag: str
    seq: int
    count: int
    # The replica's max_unread_chunks for this stream (Reply.window).
    window: int
    body: bytes

    def reply(self, replica_id: str) -> Reply:
        """These chunks as the CHUNK reply a caller is handed when they are its stream's first."""
        return Reply(
            self.request_id,
            ReplyStatus.CHUNK,
            replica_id,
            body=self.body,
            seq=self.seq,
            count=self.count,
            window=self.window,
            tag=self.tag,
        )


@dataclass(slots=True)
class ChunkBatch:
    """The chunks of one or more streams that one replica serves for one caller, as one entry of that caller's
    reply stream: one XADD, and one entry for the caller to read, for every chunk that was ready together, however
    many streams they belong to.

    Fields: ``v``; ``replica``; ``parts``, a JSON list of ``[request id, tag, seq, count, window, length]``, one per
    part, in order; ``body``, the parts' bodies one after another, ``length`` bytes each.
    """

    replica_id: str
    parts: list[ChunkPart]

    def encode(self) -> WireFields:
        header = [[p.request_id, p.tag, p.seq, p.count, p.window, len(p.body)] for p in self.parts]
        return {
            "v": _V,
            "replica": self.replica_id,
            "parts": orjson.dumps(header),
            "body": b"".join(p.body for p in self.parts),
        }

    @classmethod
    def decode(cls, fields: Fields) -> ChunkBatch:
        _check_version(fields, "chunk batch")
        body = _field(fields, b"body", "chunk batch")
        parts: list[ChunkPart] = []
        start = 0
        try:
            replica_id = fields.get(b"replica", b"").decode()
            for request_id, tag, seq, count, window, length in orjson.loads(_field(fields, b"parts", "chunk batch")):
                end = start + length
                # (cheap checks: this runs for every part of every entry; a float length fails at the slice)
                if not (
                    type(request_id) is type(tag) is str
                    and seq >= 0
                    and count >= 0
                    and window >= 0
                    and start <= end <= len(body)
                    and type(seq) is type(count) is type(window) is int
                ):
                    raise ValueError(f"bad part {[request_id, tag, seq, count, window, length]!r}")
                parts.append(ChunkPart(request_id, tag, seq, count, window, body[start:end]))
                start = end
        except (UnicodeDecodeError, ValueError, TypeError) as exc:  # (orjson's JSONDecodeError is a ValueError)
            raise ProtocolError(f"malformed chunk batch: {exc}") from exc
        if start != len(body):
            raise ProtocolError(f"malformed chunk batch: its parts hold {start} bytes of its body's {len(body)}")
        return cls(replica_id, parts)


# A count of chunks read that no stream reaches: told to a replica (ReadProgress), or taken as a stream's window,
# flow control holds nothing back (a stream whose caller left, or that nobody reads).
READ_ALL = 2**62


@dataclass(slots=True)
class ReadProgress:
    """A stream's caller has taken ``read`` chunks of request ``request_id``: on the serving replica's control stream.

    The replica keeps a streaming handler at most ``max_unread_chunks`` ahead of this (flow control)."""

    request_id: str
    read: int
    # The request's tag (Request.tag): with the request id, it names the stream even among streams that share an id.
    tag: str = ""

    def encode(self) -> WireFields:
        fields: WireFields = {"v": _V, "kind": "read", "id": self.request_id, "read": self.read}
        if self.tag:
            fields["tag"] = self.tag
        return fields

    @classmethod
    def decode(cls, fields: Fields) -> ReadProgress:
        _check_version(fields, "control")
        try:
            return cls(
                request_id=_field(fields, b"id", "control").decode(),
                read=int(_field(fields, b"read", "control")),
                tag=fields.get(b"tag", b"").decode(),
            )
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(f"malformed control message: {exc}") from exc


@dataclass(slots=True)
class CancelRequest:
    """Stop serving the request of entry ``entry_id`` (request ``request_id``): on the serving replica's control
    stream, sent by whoever cancelled it (client/cancels.py) once the CANCEL script found the replica holding it."""

    entry_id: str
    request_id: str

    def encode(self) -> WireFields:
        return {"v": _V, "kind": "cancel", "entry": self.entry_id, "id": self.request_id}

    @classmethod
    def decode(cls, fields: Fields) -> CancelRequest:
        _check_version(fields, "control")
        try:
            return cls(
                entry_id=_field(fields, b"entry", "control").decode(),
                request_id=_field(fields, b"id", "control").decode(),
            )
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"malformed control message: {exc}") from exc


def _stream_fields(fields: Fields) -> dict[str, Any]:
    return {
        "seq": int(fields[b"seq"]),
        "count": int(fields.get(b"count", b"0")),
        "window": int(fields.get(b"window", b"0")),
    }


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: int = SCHEMA_VERSION

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def decode(cls, raw: bytes | str) -> Any:
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise ProtocolError(f"malformed {cls.__name__}: {exc.errors()[0]['msg']}") from exc


class Heartbeat(_Record):
    """What a replica says about itself, refreshed every heartbeat interval."""

    ts_ms: int
    health: ReplicaHealth
    pid: int
    host: str
    ongoing: int = 0
    message: str = ""
    # The code version it loaded (DeploymentConfig.code_version); "" until it has read its config.
    version: str = ""
    # The models it holds loaded, for a deployment that multiplexes them (wire/models.py).
    models: list[str] = []
    # The user_config its state reflects (DeploymentConfig.user_config_digest; "" until loaded), and the last one its
    # reconfigure() refused while it kept that one ("" when none: ``message`` says why it refused).
    user_config: str = ""
    refused_user_config: str = ""


class ReplicaRecord(_Record):
    """The scheduler's record of one replica; only ``scheduler`` writes it."""

    replica_id: str
    state: ReplicaState
    version: str
    host: str = ""
    pid: int = 0
    created_ms: int
    updated_ms: int
    stop_deadline_ms: int = 0
    message: str = ""
    # Started by someone else (an externally scaled deployment's worker): the scheduler never signals it.
    external: bool = False
    # The GPU devices it was given (its CUDA_VISIBLE_DEVICES), held until it is removed.
    gpus: list[str] = []


class DeploymentHealthRecord(_Record):
    """The scheduler's verdict on one deployment."""

    health: DeploymentHealth
    message: str = ""
    consecutive_failures: int = 0
    # RUNNING replicas of any version: callers refuse at once when this is 0 and health is UNHEALTHY.
    running: int = 0
    updated_ms: int


class AutoscaleRecord(_Record):
    """The scheduler's latest replica count for an autoscaled deployment, kept so a new scheduler resumes from it."""

    # The count the scheduler keeps until its next decision (the TARGET that ``status`` shows).
    replicas: int
    # Why, as logged: e.g. "ongoing 6.0 on 1 replica(s), target 2 each, for 1.0s".
    reason: str = ""
    updated_ms: int


class GoalRecord(_Record):
    """One desired-state write and whether the running system has reached it."""

    goal_id: str
    deployment: str
    # "apply", "scale" or "delete".
    kind: str
    version: str = ""
    # The count asked for (num_replicas; min_replicas when autoscaled); once DONE, the count it was reached at.
    replicas: int = 0
    status: GoalStatus = GoalStatus.PENDING
    message: str = ""
    created_ms: int
    updated_ms: int
