"""``manifests``: the Kubernetes YAML of a whole farm, from a config file."""

from __future__ import annotations

import argparse
import sys

from streamserve.runtime.settings import Settings


def cmd_manifests(args: argparse.Namespace, settings: Settings) -> int:
    """Only --redis-url names the farm's Redis: $REDIS_URL is this machine's, not the cluster's."""
    from streamserve.manifests import FarmSpec, notes, render

    spec = FarmSpec.from_file(
        args.config,
        image=args.image,
        namespace=args.namespace,
        redis_url=args.redis_url,
        keys=settings.keys,
        import_allow=settings.import_allow,
        redis_memory=args.redis_memory,
        config_limits=settings.config_limits,
    )
    for note in notes(spec):
        print(f"note: {note}", file=sys.stderr)
    sys.stdout.write(render(spec))
    return 0
