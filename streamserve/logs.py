"""Log setup for streamserve processes (entry points call it once)."""

from __future__ import annotations

import argparse
import logging
import os

from streamserve.redis_checks import redis_problems, warning_text
from streamserve.settings import Settings, add_redis_url_option

logger = logging.getLogger(__name__)


def setup_logging(debug: bool = False) -> None:
    """One line per record, tagged with the process role and pid."""
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format=f"%(asctime)s %(levelname)-7s [%(name)s {os.getpid()}] %(message)s",
    )


def start_process(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    """What every role's entry point does first: parse its command line (with ``--redis-url``), build its
    settings from that and the environment, set up logging, and warn once if Redis may lose work (see
    redis_checks; the processes it starts get ``check_redis`` off, so that they do not repeat it)."""
    add_redis_url_option(parser)
    args = parser.parse_args(argv)
    settings = Settings.from_command_line(args)
    setup_logging(settings.debug)
    if settings.check_redis:
        if lines := redis_problems(settings.effective_redis_url):
            logger.warning("%s", warning_text(settings.effective_redis_url, lines))
        settings = settings.model_copy(update={"check_redis": False})
    return args, settings
