"""Entry point of the gateway process: ``python -m streamserve gateway [--workers N]``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from streamserve.app.gateway import GatewayApp, create_app
from streamserve.app.http_protocol import GatewayHttpProtocol, use_connection_limits
from streamserve.control.security import check_exposure
from streamserve.runtime import tracing
from streamserve.runtime.fd_limit import raise_fd_limit
from streamserve.runtime.gc_freeze import freeze_startup_objects
from streamserve.runtime.lifeline import FARM_GONE_SIGNAL, UP_GATEWAY_DRAIN_S, inherited, watch_from_thread
from streamserve.runtime.logging_setup import setup_logging, start_process
from streamserve.runtime.processes import end_with_spawning_process
from streamserve.runtime.settings import Settings, add_gateway_workers_option, add_no_admin_option, port_number
from streamserve.transport.connections import redacted, stop_retrying
from streamserve.wire.errors import ConfigError

logger = logging.getLogger(__name__)

# The server settings of the gateway (the benchmark's bare app uses the same); the gateway's own connections are
# uvicorn's httptools protocol with a header timeout and a connection cap (app/http_protocol.py).
UVICORN_OPTIONS: dict[str, Any] = {
    "loop": "uvloop",
    "http": "httptools",
    "log_level": "warning",
    "access_log": False,
}

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# How long a gateway answers what it holds after SIGTERM.
GRACEFUL_SHUTDOWN_S = 30
# How long one of --workers N may leave uvicorn's health check unanswered before it is killed and replaced (uvicorn's
# 5 s killed workers, and the requests they held, on a host starved of CPU for a few seconds). It also bounds how long
# a worker that dies while the supervisor awaits its answer goes unnoticed: the supervisor holds both ends of that
# pipe, so the death does not end its wait.
WORKER_HEALTHCHECK_S = 30


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamserve gateway", description="Run the HTTP gateway.")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"interface to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"port to bind (default {DEFAULT_PORT})")
    add_gateway_workers_option(parser, "--workers")
    add_no_admin_option(parser)
    return parser


def worker_app() -> GatewayApp:
    """One of ``--workers N`` gateway processes (uvicorn imports this in each): settings from the environment the
    first process wrote (Settings.to_env), its own logging, its own client and reply stream."""
    end_with_spawning_process()
    signal.signal(FARM_GONE_SIGNAL, _farm_gone_signalled)  # from the supervisor (supervise_workers)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {FARM_GONE_SIGNAL})
    settings = Settings()
    settings.give_cluster_nodes()
    setup_logging(settings.debug, settings.log_format, role="gateway")
    tracing.start("gateway")
    use_connection_limits(settings)
    try:
        app = create_app(settings)
    except ConfigError as exc:  # (the tenant keys file changed since the first process read it, say)
        logger.error("gateway: %s", exc)
        # uvicorn's supervisor ends at this exit code; at any other it starts the worker again, for ever.
        raise SystemExit(STARTUP_FAILURE) from None
    freeze_startup_objects()
    return app


def supervise_workers(config: uvicorn.Config, lifeline: int | None) -> int:
    """Run uvicorn's supervisor of ``config.workers`` gateway processes until it stops; STARTUP_FAILURE if it stopped
    because one of them failed to start (Redis unreachable, say), else 0. Once ``lifeline`` (`up`'s) is cut, each
    worker is told (FARM_GONE_SIGNAL).

    uvicorn.run returns alike either way, and a gateway that could not start then exited 0: a service manager
    restarting on failure left it down, a script took it for a clean stop.
    """
    # Its workers start with the signal blocked (as the supervisor's own mask, inherited): one sent while a worker
    # starts waits until worker_app takes it, rather than end it (the signal's default action).
    signal.pthread_sigmask(signal.SIG_BLOCK, {FARM_GONE_SIGNAL})
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])

    def tell_workers() -> None:
        for pid in [p.pid for p in supervisor.processes if p.pid is not None]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, FARM_GONE_SIGNAL)

    if lifeline is not None:
        watch_from_thread(lifeline, tell_workers)
    supervisor.run()
    return STARTUP_FAILURE if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0


def main(argv: list[str] | None = None) -> int:
    args, settings = start_process(build_parser(), argv)
    check_exposure(args.host, api_key_set=settings.api_key is not None, admin=settings.admin)
    settings = settings.model_copy(update={"bind_host": args.host})  # admin writes take it as a Host
    lifeline = inherited(settings.lifeline_fd)
    server = {
        "host": args.host,
        "port": args.port,
        # A gateway of `up` (it holds up's lifeline) gets no longer than up gives it, even when up died.
        "timeout_graceful_shutdown": UP_GATEWAY_DRAIN_S if lifeline is not None else GRACEFUL_SHUTDOWN_S,
        "log_config": None,  # uvicorn's own records go through streamserve's handler (and its format) too
        "timeout_keep_alive": settings.keep_alive_s,
        **UVICORN_OPTIONS,
        "http": GatewayHttpProtocol,
        # It serves no WebSocket: a request asking for one is an HTTP request like any other (a POST with a body and
        # `Upgrade: websocket` was handed to the WebSocket protocol, and hung there for good).
        "ws": "none",
    }
    if args.gateway_workers > 1:
        # uvicorn's supervisor holds the socket and runs (and restarts) the workers; it serves nothing itself.
        settings.tenant_key_map()  # a keys file that cannot be read stops the gateway here, as without workers
        os.environ.update(settings.to_env())
        raise_fd_limit()  # the workers inherit it (and hold their connections to the limits in worker_app)
        config = uvicorn.Config(
            f"{__name__}:worker_app",
            factory=True,
            workers=args.gateway_workers,
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
            **server,
        )
        return supervise_workers(config, lifeline)
    use_connection_limits(settings)
    if lifeline is not None:
        watch_from_thread(lifeline, farm_gone)
    app = create_app(settings)
    freeze_startup_objects()
    where = f"gateway: serving http://{args.host}:{args.port} (its Redis: {redacted(settings.effective_redis_url)})"
    gateway = _SayingWhereServer(uvicorn.Config(app, **server), where)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C, raised again once it has shut down (as uvicorn.run does)
        gateway.run()
    return 0 if gateway.started else STARTUP_FAILURE


class _SayingWhereServer(uvicorn.Server):
    """uvicorn's server, logging ``where`` once it has bound its socket (uvicorn's own "running on" line is below the
    log level the gateway gives it)."""

    def __init__(self, config: uvicorn.Config, where: str) -> None:
        super().__init__(config)
        self._where = where

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            logger.info("%s", self._where)


def _farm_gone_signalled(_signum: int, _frame: object) -> None:
    """FARM_GONE_SIGNAL's handler: farm_gone, from the event loop once it runs (a handler runs between two bytecodes
    of the main thread, which may be in the middle of writing a log line itself)."""
    stop_retrying()
    try:
        asyncio.get_running_loop().call_soon_threadsafe(farm_gone)
    except RuntimeError:  # no loop yet (the worker is starting): at once, as before
        farm_gone()


def farm_gone() -> None:
    """`up` died (killed -9): its Redis most likely with it, and nobody restarts either. Each Redis operation of the
    way out (a cancellation of a caller's who left, say) is tried once: they held the gateway 10 s."""
    stop_retrying()
    logger.warning("gateway: the `streamserve up` that started it is gone; what it still does with Redis is tried once")
