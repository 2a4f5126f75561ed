"""Log setup for streamserve processes (entry points call it once)."""

from __future__ import annotations

import argparse
import logging
import os

from pythonjsonlogger.json import JsonFormatter

from streamserve.runtime import tracing
from streamserve.runtime.fd_limit import raise_fd_limit
from streamserve.runtime.redis_user import check_redis_user
from streamserve.runtime.request_scope import current_scope
from streamserve.runtime.settings import Settings, add_redis_url_option, unknown_settings
from streamserve.transport.redis_checks import redis_problems, warning_text
from streamserve.wire.printable import printable, printable_lines

logger = logging.getLogger(__name__)

# The role whose processes run handlers: replicas (`streamserve worker`).
HANDLERS_ROLE = "worker"
# A role's name in its traces (service.name streamserve-<role>) where that is not its command's.
TRACED_ROLES = {HANDLERS_ROLE: "replica"}


class TextFormatter(logging.Formatter):
    """One line per record, tagged with the logger and pid; ``request_id=...`` at the end when the record has one
    (``extra={"request_id": ...}``), and ``trace_id=...`` when tracing is on (runtime/tracing.py), before any
    traceback.

    The line is escaped (wire.printable): a value in the message cannot start a line of its own or reach the
    terminal as a control sequence. A traceback keeps its newlines (it is made of lines) but not those of an
    exception's message or notes, which a caller may have chosen; its other controls are escaped."""

    def __init__(self) -> None:
        super().__init__(f"%(asctime)s %(levelname)-7s [%(name)s {os.getpid()}] %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        if request_id := getattr(record, "request_id", None):
            line = f"{line} request_id={request_id}"
        if trace_id := getattr(record, "trace_id", None):
            line = f"{line} trace_id={trace_id}"
        return printable(line)

    def format(self, record: logging.LogRecord) -> str:
        # The message has no newline left (formatMessage), so the first one starts the traceback or stack, which
        # are escaped here whoever formatted them first (logging caches the traceback's text on the record).
        line, newline, rest = super().format(record).partition("\n")
        if not rest:
            return line
        exc = record.exc_info[1] if record.exc_info else None
        return line + newline + printable_lines(_messages_on_one_line(rest, exc))


def _messages_on_one_line(traceback: str, exc: BaseException | None) -> str:
    """``traceback`` with each message and note of the exceptions it shows escaped onto its one line: one with a
    newline (``ValueError(f"bad input {body}")``) cannot print a line that looks like a log record of its own."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        try:
            parts = [str(exc), *getattr(exc, "__notes__", ())]
        except Exception:  # a broken __str__: the traceback says so itself
            parts = []
        for part in parts:
            if isinstance(part, str) and "\n" in part:
                traceback = traceback.replace(part, printable(part))
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return traceback


def json_formatter(role: str) -> logging.Formatter:
    """One JSON object per line (python-json-logger): time, level, logger, pid, role, message, the record's
    ``extra`` fields (request_id, deployment, replica, ...) and the traceback as ``exc_info`` text."""
    return JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        static_fields={"pid": os.getpid(), "role": role},
    )


class HandlerRequestIds(logging.Filter):
    """A record logged inside a handler (by the user's own code, which names no request) gets the id of the request
    it serves, as the replica's own records about it have: ``request_id=`` in text, a field in JSON."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id") and (scope := current_scope()) is not None:
            record.request_id = scope.request_id
        return True


def setup_logging(debug: bool = False, log_format: str = "text", role: str = "") -> None:
    """Log every record to stderr in ``log_format`` ("text" or "json", Settings.log_format)."""
    handler = logging.StreamHandler()
    handler.setFormatter(json_formatter(role) if log_format == "json" else TextFormatter())
    if role == HANDLERS_ROLE:  # (no other process runs handlers: a gateway's every access line would look)
        handler.addFilter(HandlerRequestIds())
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, handlers=[handler], force=True)


def start_process(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    """What every role's entry point does first: parse its command line (with ``--redis-url``), build its
    settings from that and the environment, set up logging (and tracing, if the environment asks: runtime/tracing.py),
    and warn once of STREAMSERVE_ variables that are no setting and if Redis may lose work (see redis_checks; the
    processes it starts get ``check_redis`` off, so that they do not repeat either)."""
    add_redis_url_option(parser, role=True)
    args = parser.parse_args(argv)
    settings = Settings.from_command_line(args)
    settings.give_cluster_nodes()
    role = parser.prog.removeprefix("streamserve ").strip()
    setup_logging(settings.debug, settings.log_format, role=role)
    tracing.start(TRACED_ROLES.get(role, role))
    raise_fd_limit()  # every role holds connections (Redis, clients, replicas' pipes): as many as the system allows
    if settings.check_redis:
        for line in unknown_settings(os.environ):
            logger.warning("%s", line)
        check_redis_user(settings)
        if lines := redis_problems(settings.effective_redis_url):
            for line in warning_text(settings.effective_redis_url, lines).splitlines():  # (a record is one line)
                logger.warning("%s", line)
        settings = settings.model_copy(update={"check_redis": False})
    return args, settings
