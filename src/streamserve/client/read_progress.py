"""Flow control from the caller's side: tell the replica serving a stream how many of its chunks have been taken.

Each message is one XADD to the replica's control stream, sent in the client's pipelined round trip of that loop
turn and never waited for: a message that fails is logged, and the consumer never sees the failure (the replica
then pauses at its window until a later message, or the deadline, comes).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from streamserve.client.chunk_feed import Report
from streamserve.transport.pipelining import Pipeliner, failure_of
from streamserve.transport.streams import control_command
from streamserve.wire.keys import Keys
from streamserve.wire.messages import ReadProgress

logger = logging.getLogger(__name__)


def progress_reporter(pipeliner: Pipeliner, keys: Keys, deployment: str, request_id: str, tag: str) -> Report:
    """What a stream's feed calls to say how far its consumer has read: fire and forget, on ``pipeliner``."""

    def report(replica_id: str, read: int) -> None:
        progress = ReadProgress(request_id, read, tag)
        command = control_command(keys.replica_control(deployment, replica_id), progress)
        pipeliner.execute(command).add_done_callback(_note_failure)

    return report


def _note_failure(sent: asyncio.Future[list[Any]]) -> None:
    """Log a progress message that did not get through (the round trip failed, or Redis refused the XADD)."""
    if (error := failure_of(sent)) is not None:
        logger.warning("could not tell a replica how far a stream was read: %s", error)
