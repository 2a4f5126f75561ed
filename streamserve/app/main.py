"""Entry point of the gateway process: ``python -m streamserve gateway``."""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn

from streamserve.app.gateway import create_app
from streamserve.heap import freeze_startup_objects
from streamserve.logs import setup_logging
from streamserve.settings import Settings, add_redis_url_option

# The server settings of the gateway (the benchmark's bare app uses the same).
UVICORN_OPTIONS: dict[str, Any] = {
    "loop": "uvloop",
    "http": "httptools",
    "log_level": "warning",
    "access_log": False,
}

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="streamserve gateway", description="Run the HTTP gateway.")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"interface to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default {DEFAULT_PORT})")
    add_redis_url_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings.from_command_line(args)
    setup_logging(settings.debug)
    app = create_app(settings)
    freeze_startup_objects()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        timeout_graceful_shutdown=30,
        **UVICORN_OPTIONS,
    )
    return 0
