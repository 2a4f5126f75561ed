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
import logging
import os
import sys
import threading
from typing import NoReturn

# The longest the exit handlers may take. Some wait on what may never end: multiprocessing's joins the non-daemon
# children a handler started, concurrent.futures' the threads of its pools (a handler stuck in one). The process ends
# all the same; what it leaves in its process group is its supervisor's to end (the scheduler's group sweep).
EXIT_HANDLERS_S = 3.0


def end_process(code: int) -> NoReturn:
    """Run the exit handlers (logging's flush among them) for EXIT_HANDLERS_S at most, flush the standard streams,
    and end this process with ``code``."""
    try:
        handlers = threading.Thread(target=atexit._run_exitfuncs, name="exit handlers", daemon=True)
        handlers.start()  # logging's flush is one (logging.shutdown)
        handlers.join(EXIT_HANDLERS_S)
        if handlers.is_alive():  # (the stuck one may hold a stream's lock: said by os.write, and no flush waited on)
            os.write(2, f"streamserve: exit handlers still running after {EXIT_HANDLERS_S:g}s; exiting\n".encode())
            logging.shutdown()  # the log's last lines: its handler, registered first, runs last, after the stuck one
        else:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
    finally:
        os._exit(code)
