"""The number of files a process may hold open: raised to what the system allows, once at start.

Every connection a gateway holds is a file descriptor. Many systems start processes with a soft limit of 1024 under a
hard limit far above it; a process may raise its own soft limit up to the hard one, so that the limit it serves
under is the one an administrator chose, not a shell's default.
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger(__name__)

# Where the soft limit goes when the hard limit is "unlimited" (Linux refuses more than fs.nr_open, 1048576 by default).
UNLIMITED_TARGET = 1 << 20


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit in force afterwards.

    Silent when it works or there is nothing to raise; a warning (and the old limit kept) when the system refuses.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            logger.warning(
                "could not raise the open-file limit from %d to %d: %s (ulimit -n sets it)", soft, target, exc
            )
            return soft
        return target
    return UNLIMITED_TARGET if soft == resource.RLIM_INFINITY else soft
