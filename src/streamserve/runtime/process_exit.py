"""Ending a ``streamserve`` process once its command is done, without the interpreter's teardown.

Python's exit frees every module and object one by one: for a replica or job worker, with streamserve, redis-py, RQ,
pydantic and the rest imported, that is 0.2-0.3 s of CPU on an idle host, and seconds on a loaded one, after the
process has logged its exit. Whoever waits for it (``up``, the scheduler's launcher, the job pool's drain, a script
running ``streamserve status``) waits that long for nothing, or takes it for a process that did not stop. A command or
role that returned has drained, closed its connections and logged its last line: what must still happen at exit
(atexit's handlers, such as tracing's last export, logging's flush and temporary directories' removal; the standard
streams) happens here, and the process ends at once.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def end_process(code: int) -> NoReturn:
    """Run the exit handlers (logging's flush among them), flush the standard streams, and end this process with
    ``code``."""
    try:
        atexit._run_exitfuncs()  # logging's flush is one (logging.shutdown)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    finally:
        os._exit(code)
