"""Which farm a command works on when the command line does not say: the one `up` runs from the data directory."""

from __future__ import annotations

import argparse

from streamserve.runtime.farm_files import default_redis_hint, running_farm
from streamserve.runtime.settings import Settings
from streamserve.wire.errors import NotFoundError


def beside_running_farm(args: argparse.Namespace, settings: Settings) -> Settings:
    """``settings``, with the Redis (and import allow-list) of the farm `up` runs from ``--data-dir`` (default
    ``.streamserve``) when neither ``--redis-url`` nor ``REDIS_URL`` names one. So ``up --redis-port 48889`` then
    ``status`` just works. NotFoundError (exit 1) for a ``--data-dir`` given that no farm runs from: the default
    Redis may be another's."""
    if settings.redis_url is not None or args.command == "up" or not hasattr(args, "data_dir"):
        return settings
    farm = running_farm(args.data_dir)
    if farm is None and args.data_dir is not None:  # named, and wrong: the default Redis may be another farm's
        raise NotFoundError(
            f"no `streamserve up` runs from {args.data_dir}/ (--data-dir); pass --redis-url or REDIS_URL for a farm "
            "of another Redis"
        )
    return settings if farm is None else farm.serving(settings)


def no_farm_hint(args: argparse.Namespace, settings: Settings) -> str:
    """What to add to a connection error of a command that fell back to the default Redis."""
    if settings.redis_url is not None or not hasattr(args, "data_dir"):
        return ""
    return default_redis_hint(
        args.data_dir, "run the command where `up` runs, or pass --data-dir, --redis-url or REDIS_URL"
    )
