"""Entry point of the gateway process: ``python -m streamserve gateway``."""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn

from streamserve.app.gateway import create_app
from streamserve.heap import freeze_startup_objects
from streamserve.logs import start_process
from streamserve.security import check_exposure
from streamserve.settings import add_no_admin_option

# The server settings of the gateway (the benchmark's bare app uses the same).
UVICORN_OPTIONS: dict[str, Any] = {
    "loop": "uvloop",
    "http": "httptools",
    "log_level": "warning",
    "access_log": False,
}

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamserve gateway", description="Run the HTTP gateway.")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"interface to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to bind (default {DEFAULT_PORT})")
    add_no_admin_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, settings = start_process(build_parser(), argv)
    check_exposure(args.host, api_key_set=settings.api_key is not None, admin=settings.admin)
    app = create_app(settings)
    freeze_startup_objects()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        timeout_graceful_shutdown=30,
        log_config=None,  # uvicorn's own records go through streamserve's handler (and its format) too
        **UVICORN_OPTIONS,
    )
    return 0
