"""Log setup for streamserve processes (entry points call it once)."""

from __future__ import annotations

import argparse
import logging
import os

from pythonjsonlogger.json import JsonFormatter

from streamserve.runtime.settings import Settings, add_redis_url_option
from streamserve.transport.redis_checks import redis_problems, warning_text

logger = logging.getLogger(__name__)


class TextFormatter(logging.Formatter):
    """One line per record, tagged with the logger and pid; ``request_id=...`` at the end when the record has one
    (``extra={"request_id": ...}``), before any traceback."""

    def __init__(self) -> None:
        super().__init__(f"%(asctime)s %(levelname)-7s [%(name)s {os.getpid()}] %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} request_id={request_id}" if request_id else line


def json_formatter(role: str) -> logging.Formatter:
    """One JSON object per line (python-json-logger): time, level, logger, pid, role, message, the record's
    ``extra`` fields (request_id, deployment, replica, ...) and the traceback as ``exc_info`` text."""
    return JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        static_fields={"pid": os.getpid(), "role": role},
    )


def setup_logging(debug: bool = False, log_format: str = "text", role: str = "") -> None:
    """Log every record to stderr in ``log_format`` ("text" or "json", Settings.log_format)."""
    handler = logging.StreamHandler()
    handler.setFormatter(json_formatter(role) if log_format == "json" else TextFormatter())
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, handlers=[handler], force=True)


def start_process(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    """What every role's entry point does first: parse its command line (with ``--redis-url``), build its
    settings from that and the environment, set up logging, and warn once if Redis may lose work (see
    redis_checks; the processes it starts get ``check_redis`` off, so that they do not repeat it)."""
    add_redis_url_option(parser)
    args = parser.parse_args(argv)
    settings = Settings.from_command_line(args)
    setup_logging(settings.debug, settings.log_format, role=parser.prog.removeprefix("streamserve ").strip())
    if settings.check_redis:
        if lines := redis_problems(settings.effective_redis_url):
            logger.warning("%s", warning_text(settings.effective_redis_url, lines))
        settings = settings.model_copy(update={"check_redis": False})
    return args, settings
