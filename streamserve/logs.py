"""Log setup for streamserve processes (entry points call it once)."""

from __future__ import annotations

import logging
import os


def setup_logging(debug: bool = False) -> None:
    """One line per record, tagged with the process role and pid."""
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format=f"%(asctime)s %(levelname)-7s [%(name)s {os.getpid()}] %(message)s",
    )
